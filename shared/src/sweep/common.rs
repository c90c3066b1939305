//! The keys the native and W&B forms share: `name`, `description`, `resources`, `metric`,
//! `priority`, `priority_class`, `preemptible`, `retries`, `timeout`, `max_initial_failures`, `max_consecutive_failures`, and
//! where and how jobs run (`code`, `workdir`, `env`, `setup`, `capture`, `metrics_regex`, read
//! by [`super::environment`]).

use serde_norway::{Mapping, Value};

use super::environment::{parse_environment, Environment};
use super::error::{invalid, SweepError};
use super::read::{self, describe, get};
use super::{Goal, Metric, Resources};

/// The keys every form with sweep keys accepts.
pub(crate) const SHARED_KEYS: [&str; 17] = [
    "name",
    "description",
    "resources",
    "metric",
    "priority",
    "priority_class",
    "preemptible",
    "retries",
    "timeout",
    "max_initial_failures",
    "max_consecutive_failures",
    "code",
    "workdir",
    "env",
    "setup",
    "capture",
    "metrics_regex",
];

/// The sweep-wide settings that do not change from job to job.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Settings {
    pub name: Option<String>,
    pub metric: Option<Metric>,
    /// W&B `metric.target`: the sweep is done once a run reaches it.
    pub metric_target: Option<f64>,
    pub resources: Resources,
    pub priority: i64,
    /// The server's priority class its jobs are in (`[server.priority_classes]`), if it names one.
    pub priority_class: Option<String>,
    /// Whether the scheduler may stop its jobs for another user's (`None`: the server's default).
    pub preemptible: Option<bool>,
    pub retries: u32,
    pub timeout_secs: Option<u64>,
    pub fail_fast: super::FailFast,
    pub environment: Environment,
}

/// Reads the shared keys; the caller has already refused unknown ones.
pub(crate) fn parse_settings(root: &Mapping) -> Result<Settings, SweepError> {
    let mut settings = Settings { environment: parse_environment(root)?, ..Settings::default() };
    if let Some(value) = get(root, "name") {
        settings.name = Some(read::string(value, "name")?);
    }
    if let Some(value) = get(root, "description") {
        // Only checked: it is for people reading the file.
        read::string(value, "description")?;
    }
    if let Some(value) = get(root, "resources") {
        settings.resources = parse_resources(value)?;
    }
    if let Some(value) = get(root, "metric") {
        let (metric, target) = parse_metric(value)?;
        settings.metric = Some(metric);
        settings.metric_target = target;
    }
    if let Some(value) = get(root, "priority") {
        settings.priority = read::integer_in(value, "priority", i64::MIN.into(), i64::MAX.into(), "an integer")?;
    }
    if let Some(value) = get(root, "priority_class") {
        let class = read::string(value, "priority_class")?;
        crate::names::check_user_name(&class).map_err(|_| {
            invalid("priority_class", format!("`{class}` is not a class name: 1 to 32 of a-z, 0-9, `_`, `.` and `-`"))
        })?;
        settings.priority_class = Some(class);
    }
    if let Some(value) = get(root, "preemptible") {
        settings.preemptible = Some(read::boolean(value, "preemptible")?);
    }
    if let Some(value) = get(root, "retries") {
        settings.retries = read::integer_in(value, "retries", 0, u32::MAX.into(), "a non-negative integer")?;
    }
    if let Some(value) = get(root, "timeout") {
        settings.timeout_secs = Some(parse_timeout(value)?);
    }
    for (key, limit) in [
        ("max_initial_failures", &mut settings.fail_fast.initial),
        ("max_consecutive_failures", &mut settings.fail_fast.consecutive),
    ] {
        if let Some(value) = get(root, key) {
            *limit = read::integer_in(value, key, 0, u32::MAX.into(), "a non-negative integer (0: never pause)")?;
        }
    }
    Ok(settings)
}

fn parse_resources(value: &Value) -> Result<Resources, SweepError> {
    let map = read::mapping(value, "resources")?;
    read::check_keys(map, "resources", &["gpus", "gpu_memory", "exclusive"], &[], "`resources`")?;
    let mut resources = Resources::default();
    if let Some(gpus) = get(map, "gpus") {
        let expected = "a number of GPUs (0 or more)";
        resources.gpus = Some(read::integer_in(gpus, "resources.gpus", 0, u32::MAX.into(), expected)?);
    }
    if let Some(memory) = get(map, "gpu_memory") {
        resources.gpu_memory = Some(parse_memory(memory)?);
    }
    if let Some(exclusive) = get(map, "exclusive") {
        resources.exclusive = Some(read::boolean(exclusive, "resources.exclusive")?);
    }
    Ok(resources)
}

/// 4 EiB: no GPU comes near, and sums of a few such values still fit in an `i64`.
const MAX_GPU_MEMORY: u64 = 1 << 62;

fn parse_memory(value: &Value) -> Result<u64, SweepError> {
    const PATH: &str = "resources.gpu_memory";
    let bytes = match value {
        Value::String(text) => crate::size::parse_bytes(text).map_err(|message| invalid(PATH, message))?,
        Value::Number(number) if number.as_u64().is_some() => number.as_u64().unwrap_or_default(),
        other => {
            let found = describe(other);
            return Err(invalid(PATH, format!("expected a size like 8GiB or a number of bytes, found {found}")));
        }
    };
    if bytes == 0 {
        return Err(invalid(PATH, "expected a positive size, found 0"));
    }
    if bytes > MAX_GPU_MEMORY {
        let message = format!("gpu_memory is larger than any GPU ({bytes} bytes; at most 2^62 = 4 EiB)");
        return Err(invalid(PATH, message));
    }
    Ok(bytes)
}

fn parse_metric(value: &Value) -> Result<(Metric, Option<f64>), SweepError> {
    let map = read::mapping(value, "metric")?;
    read::check_keys(map, "metric", &["name", "goal", "target"], &["impute", "imputewhilerunning"], "`metric`")?;
    let target = get(map, "target").map(|target| read::number(target, "metric.target")).transpose()?;
    let name = match get(map, "name") {
        Some(name) => read::string(name, "metric.name")?,
        None => return Err(invalid("metric.name", "a metric needs a `name`")),
    };
    let goal = match get(map, "goal") {
        None => Goal::Minimize,
        Some(goal) => match goal.as_str() {
            Some("minimize") => Goal::Minimize,
            Some("maximize") => Goal::Maximize,
            _ => {
                let found = read::key_text(goal);
                return Err(invalid("metric.goal", format!("expected minimize or maximize, found `{found}`")));
            }
        },
    };
    Ok((Metric { name, goal }, target))
}

/// Seconds as a number, or a duration string: `90s`, `30m`, `2h`, `1h30m`, `1d`.
fn parse_timeout(value: &Value) -> Result<u64, SweepError> {
    const EXPECTED: &str = "expected a positive number of seconds or a duration like 90s, 30m, 2h, 1h30m";
    let seconds = match value {
        Value::Number(number) => match number.as_u64() {
            Some(whole) => Some(whole),
            // Fractions round up so a limit is never shorter than written.
            None => number
                .as_f64()
                .filter(|secs| secs.is_finite() && *secs > 0.0 && *secs < 1e18)
                .map(|secs| secs.ceil() as u64),
        },
        Value::String(text) => parse_duration(text),
        _ => None,
    };
    match seconds {
        Some(seconds) if seconds > 0 => Ok(seconds),
        _ => Err(invalid("timeout", format!("{EXPECTED}, found `{}`", read::key_text(value)))),
    }
}

fn parse_duration(text: &str) -> Option<u64> {
    let text = text.trim();
    if !text.is_empty() && text.bytes().all(|byte| byte.is_ascii_digit()) {
        return text.parse().ok();
    }
    let mut total: u64 = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let amount: u64 = rest[..digits].parse().ok()?;
        let unit = rest[digits..].chars().next()?;
        let scale = match unit {
            'd' => 86_400,
            'h' => 3_600,
            'm' => 60,
            's' => 1,
            _ => return None,
        };
        total = total.checked_add(amount.checked_mul(scale)?)?;
        rest = rest[digits + 1..].trim_start();
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(text: &str) -> Result<Settings, SweepError> {
        parse_settings(serde_norway::from_str::<Value>(text).unwrap().as_mapping().unwrap())
    }

    #[test]
    fn reads_every_shared_key() {
        let parsed = settings(
            "name: n\nresources: {gpus: 2, gpu_memory: 8GiB, exclusive: false}\n\
             metric: {name: acc, goal: maximize}\npriority: -3\nretries: 2\ntimeout: 1h30m",
        )
        .unwrap();
        assert_eq!(parsed.name.as_deref(), Some("n"));
        assert_eq!(
            parsed.resources,
            Resources { gpus: Some(2), gpu_memory: Some(8 << 30), exclusive: Some(false), trainer: false }
        );
        assert_eq!(parsed.metric, Some(Metric { name: "acc".into(), goal: Goal::Maximize }));
        assert_eq!(settings("metric: {name: acc, target: 0.99}").unwrap().metric_target, Some(0.99));
        assert_eq!((parsed.priority, parsed.retries, parsed.timeout_secs), (-3, 2, Some(5400)));
    }

    #[test]
    fn a_priority_class_is_a_name_the_server_resolves() {
        assert_eq!(settings("name: n").unwrap().priority_class, None);
        assert_eq!(settings("priority_class: urgent").unwrap().priority_class.as_deref(), Some("urgent"));
        for bad in ["priority_class: Urgent", "priority_class: 3", "priority_class: ''", "priority_class: [a]"] {
            let error = settings(bad).unwrap_err();
            assert!(matches!(&error, SweepError::Invalid { path, .. } if path == "priority_class"), "{bad}: {error}");
        }
    }

    #[test]
    fn preemptible_is_a_boolean_left_to_the_server_when_absent() {
        assert_eq!(settings("name: n").unwrap().preemptible, None);
        assert_eq!(settings("preemptible: true").unwrap().preemptible, Some(true));
        assert_eq!(settings("preemptible: false").unwrap().preemptible, Some(false));
        for bad in ["preemptible: yes please", "preemptible: 1", "preemptible: [true]"] {
            let error = settings(bad).unwrap_err();
            assert!(matches!(&error, SweepError::Invalid { path, .. } if path == "preemptible"), "{bad}: {error}");
            assert!(error.to_string().contains("expected true or false"), "{error}");
        }
    }

    #[test]
    fn failing_runs_pause_after_three_at_first_and_ten_in_a_row_later() {
        let fail_fast = settings("name: n").unwrap().fail_fast;
        assert_eq!(fail_fast, super::super::FailFast { initial: 3, consecutive: 10 });
        assert!(!fail_fast.pauses(2, false) && fail_fast.pauses(3, false));
        assert!(!fail_fast.pauses(9, true) && fail_fast.pauses(10, true));
        let set = settings("max_initial_failures: 1\nmax_consecutive_failures: 0").unwrap().fail_fast;
        assert!(set.pauses(1, false) && !set.pauses(1_000, true), "0 turns the limit off");
        for bad in ["max_initial_failures: -1", "max_consecutive_failures: many", "max_initial_failures: 1.5"] {
            let key = bad.split(':').next().unwrap();
            assert!(matches!(settings(bad), Err(SweepError::Invalid { path, .. }) if path == key), "{bad}");
        }
    }

    #[test]
    fn timeouts_accept_numbers_and_durations() {
        assert_eq!(settings("timeout: 90").unwrap().timeout_secs, Some(90));
        assert_eq!(settings("timeout: 1.5").unwrap().timeout_secs, Some(2));
        assert_eq!(settings("timeout: 30m").unwrap().timeout_secs, Some(1800));
        assert_eq!(settings("timeout: 1d 2h").unwrap().timeout_secs, Some(93_600));
        for bad in ["timeout: 0", "timeout: -5", "timeout: 10x", "timeout: h", "timeout: [1]"] {
            assert!(matches!(settings(bad), Err(SweepError::Invalid { path, .. }) if path == "timeout"), "{bad}");
        }
    }

    #[test]
    fn errors_name_the_nested_key() {
        let path_of = |text: &str| match settings(text) {
            Err(SweepError::Invalid { path, .. }) => path,
            other => panic!("{other:?}"),
        };
        assert_eq!(path_of("resources: {gpu: 1}"), "resources.gpu");
        assert_eq!(path_of("resources: {gpu_memory: lots}"), "resources.gpu_memory");
        assert_eq!(path_of("resources: {gpus: -1}"), "resources.gpus");
        assert_eq!(path_of("metric: {name: x, goal: up}"), "metric.goal");
        assert_eq!(path_of("metric: {goal: minimize}"), "metric.name");
        assert_eq!(path_of("retries: -1"), "retries");
        assert_eq!(path_of("resources: {gpu_memory: 4611686018427387905}"), "resources.gpu_memory");
        assert_eq!(path_of("resources: {gpu_memory: 5000000TiB}"), "resources.gpu_memory");
        assert_eq!(
            settings("resources: {gpu_memory: 4611686018427387904}").unwrap().resources.gpu_memory,
            Some(1 << 62)
        );
    }
}
