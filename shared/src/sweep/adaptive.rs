//! The keys that make a sweep adaptive: W&B `method` and `early_terminate`, native `search`
//! and `early_stop`, read into [`Search`] and [`EarlyStop`].

use serde_norway::{Mapping, Value};

use super::error::{invalid, SweepError};
use super::read::{self, get, join, key_text};
use super::Metric;
use crate::search::early_stop::hyperband_rungs;
use crate::search::{EarlyStop, RungKind, Sampler, Search};

/// W&B `method` with `run_cap`: `random` without a cap runs until stopped, as in W&B.
pub(crate) fn parse_method(
    root: &Mapping,
    seed: u64,
    run_cap: Option<u64>,
    metric: Option<&Metric>,
) -> Result<Search, SweepError> {
    match get(root, "method").map(|method| (method.as_str(), method)) {
        Some((Some("grid"), _)) => Ok(Search::Grid),
        Some((Some("random"), _)) if run_cap.is_some() => Ok(Search::Random { seed }),
        Some((Some("random"), _)) => Ok(Search::AdaptiveRandom { seed }),
        Some((Some("bayes"), _)) => bayes(seed, run_cap, metric, Sampler::Auto),
        Some((_, other)) => {
            Err(invalid("method", format!("expected grid, random or bayes, found `{}`", key_text(other))))
        }
        None => Err(invalid("method", "a W&B sweep needs `method: grid`, `random` or `bayes`")),
    }
}

/// Native `search: grid | random | bayes | tpe | gp` (grid by default); `max_runs` caps it.
pub(crate) fn parse_native_search(
    root: &Mapping,
    seed: u64,
    cap: Option<u64>,
    metric: Option<&Metric>,
) -> Result<Search, SweepError> {
    match get(root, "search").map(|search| (search.as_str(), search)) {
        None | Some((Some("grid"), _)) => Ok(Search::Grid),
        Some((Some("random"), _)) if cap.is_some() => Ok(Search::Random { seed }),
        Some((Some("random"), _)) => Ok(Search::AdaptiveRandom { seed }),
        Some((Some("bayes"), _)) => bayes(seed, cap, metric, Sampler::Auto),
        Some((Some("tpe"), _)) => bayes(seed, cap, metric, Sampler::Tpe),
        Some((Some("gp"), _)) => bayes(seed, cap, metric, Sampler::Gp),
        Some((_, other)) => {
            Err(invalid("search", format!("expected grid, random, bayes, tpe or gp, found `{}`", key_text(other))))
        }
    }
}

fn bayes(seed: u64, run_cap: Option<u64>, metric: Option<&Metric>, sampler: Sampler) -> Result<Search, SweepError> {
    if metric.is_none() {
        return Err(invalid("metric.name", "bayes needs metric.name: the metric its model learns from"));
    }
    Ok(Search::Bayes { seed, run_cap, sampler })
}

/// W&B `early_terminate: {type: hyperband, min_iter | max_iter (+ s), eta, strict}`.
pub(crate) fn parse_early_terminate(root: &Mapping, metric: Option<&Metric>) -> Result<Option<EarlyStop>, SweepError> {
    let Some(value) = get(root, "early_terminate") else { return Ok(None) };
    const PATH: &str = "early_terminate";
    let map = read::mapping(value, PATH)?;
    read::check_keys(map, PATH, &["type", "min_iter", "max_iter", "s", "eta", "strict"], &[], "`early_terminate`")?;
    match get(map, "type").map(|kind| (kind.as_str(), kind)) {
        Some((Some("hyperband"), _)) => {}
        Some((_, other)) => {
            return Err(invalid(join(PATH, "type"), format!("expected hyperband, found `{}`", key_text(other))))
        }
        None => return Err(invalid(join(PATH, "type"), "early_terminate needs `type: hyperband`")),
    }
    needs_metric(metric, PATH)?;
    let eta = eta(map, PATH)?;
    let min_iter = positive(map, PATH, "min_iter")?;
    let max_iter = positive(map, PATH, "max_iter")?;
    let s = positive(map, PATH, "s")?;
    if let Some(strict) = get(map, "strict") {
        read::boolean(strict, &join(PATH, "strict"))?;
    }
    match (min_iter, max_iter, s) {
        (None, None, _) => return Err(invalid(PATH, "hyperband needs `min_iter`, or `max_iter` with `s`")),
        (None, Some(_), None) => {
            return Err(invalid(join(PATH, "s"), "hyperband with `max_iter` needs `s`, the number of brackets"))
        }
        (Some(min), Some(max), _) if min > max => {
            return Err(invalid(
                join(PATH, "min_iter"),
                format!("`min_iter` ({min}) is larger than `max_iter` ({max})"),
            ))
        }
        _ => {}
    }
    let rungs = hyperband_rungs(min_iter, max_iter, s, eta);
    if rungs.is_empty() {
        return Err(invalid(PATH, "these settings give no bracket at step 1 or later"));
    }
    Ok(Some(EarlyStop::Rungs { kind: RungKind::Hyperband, rungs, eta }))
}

/// Native `early_stop: {type: asha, min_steps, max_steps, eta}` or
/// `{type: median, warmup_steps, min_runs}`.
pub(crate) fn parse_native_early_stop(
    root: &Mapping,
    metric: Option<&Metric>,
) -> Result<Option<EarlyStop>, SweepError> {
    let Some(value) = get(root, "early_stop") else { return Ok(None) };
    const PATH: &str = "early_stop";
    let map = read::mapping(value, PATH)?;
    let kind = get(map, "type").and_then(Value::as_str);
    needs_metric(metric, PATH)?;
    match kind {
        Some("asha") => {
            read::check_keys(map, PATH, &["type", "min_steps", "max_steps", "eta"], &[], "`early_stop` (asha)")?;
            let eta = eta(map, PATH)?;
            let min = positive(map, PATH, "min_steps")?.unwrap_or(1);
            let max = positive(map, PATH, "max_steps")?;
            if let Some(max) = max.filter(|max| *max < min) {
                return Err(invalid(
                    join(PATH, "min_steps"),
                    format!("`min_steps` ({min}) is larger than `max_steps` ({max})"),
                ));
            }
            let rungs = hyperband_rungs(Some(min), max, None, eta);
            Ok(Some(EarlyStop::Rungs { kind: RungKind::Asha, rungs, eta }))
        }
        Some("median") => {
            read::check_keys(map, PATH, &["type", "warmup_steps", "min_runs"], &[], "`early_stop` (median)")?;
            let warmup_steps = match get(map, "warmup_steps") {
                Some(value) => {
                    read::integer_in(value, &join(PATH, "warmup_steps"), 0, u64::MAX.into(), "0 or more steps")?
                }
                None => 0,
            };
            let min_runs = positive(map, PATH, "min_runs")?.unwrap_or(5) as usize;
            Ok(Some(EarlyStop::Median { warmup_steps, min_runs }))
        }
        _ => {
            let found = get(map, "type").map(key_text).unwrap_or_else(|| "nothing".to_owned());
            Err(invalid(join(PATH, "type"), format!("expected asha or median, found `{found}`")))
        }
    }
}

fn needs_metric(metric: Option<&Metric>, path: &str) -> Result<(), SweepError> {
    match metric {
        Some(_) => Ok(()),
        None => Err(invalid(path, format!("{path} needs metric.name: runs are compared on that metric"))),
    }
}

/// `eta`, default 3, must be greater than 1.
fn eta(map: &Mapping, parent: &str) -> Result<f64, SweepError> {
    let Some(value) = get(map, "eta") else { return Ok(3.0) };
    let path = join(parent, "eta");
    let eta = read::number(value, &path)?;
    if eta <= 1.0 {
        return Err(invalid(path, format!("`eta` must be greater than 1, found {eta}")));
    }
    Ok(eta)
}

fn positive(map: &Mapping, parent: &str, key: &str) -> Result<Option<u64>, SweepError> {
    get(map, key).map(|value| read::positive(value, &join(parent, key))).transpose()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::Goal;

    fn root(text: &str) -> Mapping {
        serde_norway::from_str(text).unwrap()
    }

    fn metric() -> Metric {
        Metric { name: "loss".into(), goal: Goal::Minimize }
    }

    fn terminate_error(text: &str) -> String {
        match parse_early_terminate(&root(text), Some(&metric())) {
            Err(SweepError::Invalid { path, .. }) => path,
            other => panic!("{text}: {other:?}"),
        }
    }

    #[test]
    fn methods_map_to_searches() {
        let search = |text: &str, cap| parse_method(&root(text), 5, cap, Some(&metric())).unwrap();
        assert_eq!(search("method: grid", None), Search::Grid);
        assert_eq!(search("method: random", Some(3)), Search::Random { seed: 5 });
        assert_eq!(search("method: random", None), Search::AdaptiveRandom { seed: 5 });
        assert_eq!(search("method: bayes", None), Search::Bayes { seed: 5, run_cap: None, sampler: Sampler::Auto });
        let error = parse_method(&root("method: bayes"), 0, None, None).unwrap_err();
        assert_eq!(error.to_string(), "at `metric.name`: bayes needs metric.name: the metric its model learns from");
    }

    #[test]
    fn hyperband_reads_w_and_b_keys() {
        let rule = parse_early_terminate(&root("early_terminate: {type: hyperband, min_iter: 3}"), Some(&metric()));
        let Ok(Some(EarlyStop::Rungs { rungs, eta, .. })) = rule else { panic!("{rule:?}") };
        assert_eq!((&rungs[..3], eta), (&[3, 9, 27][..], 3.0));
        let rule = parse_early_terminate(
            &root("early_terminate: {type: hyperband, max_iter: 27, s: 2, eta: 3}"),
            Some(&metric()),
        );
        assert!(matches!(rule, Ok(Some(EarlyStop::Rungs { ref rungs, .. })) if rungs == &[3, 9]));
    }

    #[test]
    fn bad_settings_are_refused_with_the_key_path() {
        assert_eq!(terminate_error("early_terminate: {type: hyperband, min_iter: 3, eta: 1}"), "early_terminate.eta");
        assert_eq!(
            terminate_error("early_terminate: {type: hyperband, min_iter: 30, max_iter: 3}"),
            "early_terminate.min_iter"
        );
        assert_eq!(terminate_error("early_terminate: {type: hyperband, max_iter: 27}"), "early_terminate.s");
        assert_eq!(terminate_error("early_terminate: {type: asha}"), "early_terminate.type");
        assert_eq!(terminate_error("early_terminate: {type: hyperband, min_iter: 0}"), "early_terminate.min_iter");
        assert_eq!(terminate_error("early_terminate: {type: hyperband}"), "early_terminate");
        let no_metric = parse_early_terminate(&root("early_terminate: {type: hyperband, min_iter: 3}"), None);
        assert!(matches!(no_metric, Err(SweepError::Invalid { ref path, .. }) if path == "early_terminate"));
        let native = parse_native_early_stop(&root("early_stop: {type: asha, eta: 0.5}"), Some(&metric()));
        assert!(matches!(native, Err(SweepError::Invalid { ref path, .. }) if path == "early_stop.eta"));
    }
}
