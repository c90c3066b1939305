//! How values read in a terminal: sizes in binary units, durations and ages in the largest
//! units that matter, metric values to six significant digits, parameters as `key=value`.
//! Pure functions; `--json` output keeps the exact values instead.

use serde_json::Value;

/// `512 B`, `1.5 KiB`, `24.0 GiB`: powers of 1024, as `du -h` and `ls -lh` count.
pub fn bytes(count: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if count < 1024 {
        return format!("{count} B");
    }
    let mut value = count as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if value < 10.0 {
        format!("{value:.1} {}", UNITS[unit])
    } else {
        format!("{value:.0} {}", UNITS[unit])
    }
}

/// `0.4s`, `35s`, `12m05s`, `3h02m`, `2d04h`: the two largest units that matter.
pub fn duration_ms(milliseconds: i64) -> String {
    let milliseconds = milliseconds.max(0);
    if milliseconds < 10_000 {
        return format!("{:.1}s", milliseconds as f64 / 1000.0);
    }
    let seconds = milliseconds / 1000;
    match seconds {
        0..60 => format!("{seconds}s"),
        60..3600 => format!("{}m{:02}s", seconds / 60, seconds % 60),
        3600..86_400 => format!("{}h{:02}m", seconds / 3600, seconds % 3600 / 60),
        _ => format!("{}d{:02}h", seconds / 86_400, seconds % 86_400 / 3600),
    }
}

/// How long ago `at` was, from `now` (both Unix milliseconds): `12s ago`, `5m ago`, `3h ago`.
pub fn age(at: i64, now: i64) -> String {
    let seconds = (now - at).max(0) / 1000;
    match seconds {
        0..60 => format!("{seconds}s ago"),
        60..3600 => format!("{}m ago", seconds / 60),
        3600..86_400 => format!("{}h ago", seconds / 3600),
        _ => format!("{}d ago", seconds / 86_400),
    }
}

/// A metric value to six significant digits, without trailing zeros; scientific notation for
/// the very large and the very small.
pub fn metric(value: f64) -> String {
    if !value.is_finite() {
        return value.to_string();
    }
    let magnitude = value.abs();
    if magnitude != 0.0 && !(1e-4..1e6).contains(&magnitude) {
        return format!("{value:.4e}");
    }
    let decimals = if magnitude == 0.0 { 0 } else { (5 - magnitude.log10().floor() as i32).max(0) as usize };
    let text = format!("{value:.decimals$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    }
}

/// A parameter value: strings bare, everything else as compact JSON (numbers in the shortest
/// form that reads back to the same value).
pub fn param_value(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// `lr=0.001 batch_size=2048 hidden=[128,64]`: one space between pairs, so a table cell folds
/// between parameters rather than inside one.
pub fn params(params: &Value) -> String {
    match params {
        Value::Object(map) => {
            map.iter().map(|(key, value)| format!("{key}={}", param_value(value))).collect::<Vec<_>>().join(" ")
        }
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// `lr=0.001` over `batch_size=2048`: one parameter per line, for a narrow column.
pub fn params_lines(params: &Value) -> String {
    match params {
        Value::Object(map) => {
            map.iter().map(|(key, value)| format!("{key}={}", param_value(value))).collect::<Vec<_>>().join("\n")
        }
        other => self::params(other),
    }
}

/// The parameter names of a set of runs, in the order they first appear.
pub fn param_names<'a>(params: impl IntoIterator<Item = &'a Value>) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for value in params {
        if let Value::Object(map) = value {
            for key in map.keys() {
                if !names.contains(key) {
                    names.push(key.clone());
                }
            }
        }
    }
    names
}

/// Wall-clock now in Unix milliseconds, the unit of every time the server sends.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sizes_read_in_binary_units() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(24 << 30), "24 GiB");
        assert_eq!(bytes((3 << 20) + (1 << 19)), "3.5 MiB");
        assert_eq!(bytes(u64::MAX), "16 EiB");
    }

    #[test]
    fn durations_keep_the_two_largest_units() {
        assert_eq!(duration_ms(420), "0.4s");
        assert_eq!(duration_ms(35_900), "35s");
        assert_eq!(duration_ms(725_000), "12m05s");
        assert_eq!(duration_ms(3 * 3_600_000 + 2 * 60_000 + 59_000), "3h02m");
        assert_eq!(duration_ms(52 * 3_600_000), "2d04h");
        assert_eq!(duration_ms(-5), "0.0s", "clock skew between machines shows as zero");
    }

    #[test]
    fn ages_count_back_from_now() {
        assert_eq!(age(1_000, 13_000), "12s ago");
        assert_eq!(age(0, 5 * 60_000 + 59_000), "5m ago");
        assert_eq!(age(0, 3 * 3_600_000), "3h ago");
        assert_eq!(age(10_000, 0), "0s ago");
    }

    #[test]
    fn metrics_show_six_significant_digits() {
        assert_eq!(metric(0.123456789), "0.123457");
        assert_eq!(metric(12.5), "12.5");
        assert_eq!(metric(1234.56789), "1234.57");
        assert_eq!(metric(0.0), "0");
        assert_eq!(metric(-0.5), "-0.5");
        assert_eq!(metric(0.00001234), "1.2340e-5");
        assert_eq!(metric(12_345_678.0), "1.2346e7");
        assert_eq!(metric(f64::NAN), "NaN");
    }

    #[test]
    fn parameters_read_as_key_value_pairs() {
        let value = json!({"lr": 0.001, "model": "mlp", "hidden": [128, 64], "amp": null});
        assert_eq!(params(&value), "lr=0.001 model=mlp hidden=[128,64] amp=null");
        assert_eq!(params_lines(&value), "lr=0.001\nmodel=mlp\nhidden=[128,64]\namp=null");
        let names = param_names([&json!({"a": 1, "b": 2}), &json!({"c": 3, "a": 4})]);
        assert_eq!(names, ["a", "b", "c"]);
    }
}
