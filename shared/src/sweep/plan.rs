//! How a parsed sweep turns an index into a job: counting with the cap and the limit, and
//! mixed-radix decoding of the index over the axes (first axis slowest).

use super::error::SweepError;
use super::random::Sampler;
use super::render::Rendered;
use super::template::Template;
use super::JobSpec;

/// The job count after the cap, or [`SweepError::TooManyJobs`]. `lengths` are the axis
/// lengths; their product saturates instead of overflowing, so a 10^30-job grid is refused
/// here, before anything is built.
pub(crate) fn count_jobs(
    lengths: impl IntoIterator<Item = usize>,
    cap: Option<u64>,
    max_jobs: u64,
) -> Result<u64, SweepError> {
    let product = lengths.into_iter().fold(1u128, |product, length| product.saturating_mul(length as u128));
    check_count(product, cap, max_jobs)
}

/// Applies the cap to a job count and refuses it past `max_jobs`.
pub(crate) fn check_count(count: u128, cap: Option<u64>, max_jobs: u64) -> Result<u64, SweepError> {
    let count = cap.map_or(count, |cap| count.min(u128::from(cap)));
    if count > u128::from(max_jobs) {
        return Err(SweepError::TooManyJobs { count, limit: max_jobs });
    }
    // Not above max_jobs, so it fits.
    Ok(count as u64)
}

/// The three texts of every job, with slots for the job's values.
#[derive(Debug, Clone)]
pub(crate) struct Templates {
    pub params: Template,
    pub command: Template,
    pub config: Option<Template>,
}

impl Templates {
    fn build(&self, index: u64, values: &[&Rendered]) -> JobSpec {
        let mut params = String::with_capacity(128);
        self.params.render(values, index, &mut params);
        let mut command = String::with_capacity(128);
        self.command.render(values, index, &mut command);
        let config = self.config.as_ref().map(|template| {
            let mut config = String::with_capacity(512);
            template.render(values, index, &mut config);
            config
        });
        JobSpec { index, params, command, config }
    }
}

/// Where each job's values come from.
#[derive(Debug, Clone)]
pub(crate) enum Source {
    /// The cartesian product of the axes: slot `k` takes a value of `axes[k]`.
    Grid(Vec<Vec<Rendered>>),
    /// Seeded random draws, one per slot.
    Random(Sampler),
}

/// Everything needed to build any job of a sweep on its own.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub count: u64,
    pub source: Source,
    pub templates: Templates,
}

impl Plan {
    pub(crate) fn job(&self, index: u64) -> Option<JobSpec> {
        if index >= self.count {
            return None;
        }
        match &self.source {
            Source::Grid(axes) => Some(self.templates.build(index, &choose(axes, index))),
            Source::Random(sampler) => {
                let values = sampler.sample(index);
                let refs: Vec<&Rendered> = values.iter().map(|value| value.as_ref()).collect();
                Some(self.templates.build(index, &refs))
            }
        }
    }
}

/// Decodes `index` in mixed radix, the last axis varying fastest.
fn choose(axes: &[Vec<Rendered>], index: u64) -> Vec<&Rendered> {
    let mut rest = index;
    let mut chosen = Vec::with_capacity(axes.len());
    // Filled back to front, then reversed, to avoid a placeholder value per slot.
    for axis in axes.iter().rev() {
        let length = axis.len() as u64;
        chosen.push(&axis[(rest % length) as usize]);
        rest /= length;
    }
    chosen.reverse();
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::yaml::Loader;

    #[test]
    fn counts_saturate_and_respect_cap_and_limit() {
        assert_eq!(count_jobs([3, 3, 4, 3], None, 1000), Ok(108));
        assert_eq!(count_jobs([3, 3, 4, 3], Some(20), 1000), Ok(20));
        assert_eq!(count_jobs([], None, 1000), Ok(1));
        let huge = count_jobs([10; 30], None, 100_000);
        assert_eq!(huge, Err(SweepError::TooManyJobs { count: 10u128.pow(30), limit: 100_000 }));
        assert_eq!(count_jobs([10; 30], Some(20), 100_000), Ok(20));
        let saturated = count_jobs([usize::MAX; 8], None, 5);
        assert_eq!(saturated, Err(SweepError::TooManyJobs { count: u128::MAX, limit: 5 }));
    }

    #[test]
    fn last_axis_varies_fastest() {
        let loader = Loader::for_text("");
        let axis = |texts: &[&str]| -> Vec<Rendered> {
            texts.iter().map(|text| Rendered::new(&loader.load(text).unwrap(), &loader).unwrap()).collect()
        };
        let axes = vec![axis(&["a", "b"]), axis(&["1", "2", "3"])];
        let pick = |index| choose(&axes, index).iter().map(|value| value.raw.clone()).collect::<Vec<_>>().join(" ");
        let all: Vec<String> = (0..6).map(pick).collect();
        assert_eq!(all, ["a 1", "a 2", "a 3", "b 1", "b 2", "b 3"]);
    }
}
