//! Reading a Prometheus exposition in tests: series by name and labels, the metric names a
//! scrape declares, and the metric names a PromQL expression uses.

use std::collections::{BTreeMap, BTreeSet};

/// One sample line: name, labels, value.
#[derive(Debug, Clone)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Every sample of a text exposition (classic or OpenMetrics); comments skipped.
pub fn samples(text: &str) -> Vec<Sample> {
    text.lines().filter(|line| !line.starts_with('#') && !line.trim().is_empty()).map(parse_line).collect()
}

fn parse_line(line: &str) -> Sample {
    let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("no value in `{line}`"));
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        other => other.parse().unwrap_or_else(|_| panic!("bad value in `{line}`")),
    };
    let Some((name, rest)) = series.split_once('{') else {
        return Sample { name: series.to_string(), labels: BTreeMap::new(), value };
    };
    let body = rest.strip_suffix('}').unwrap_or_else(|| panic!("unclosed labels in `{line}`"));
    let mut labels = BTreeMap::new();
    let mut chars = body.chars().peekable();
    loop {
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if key.is_empty() {
            break;
        }
        assert_eq!(chars.next(), Some('"'), "label {key} of `{line}` is not quoted");
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some('n') => value.push('\n'),
                    Some(escaped) => value.push(escaped),
                    None => panic!("dangling escape in `{line}`"),
                },
                '"' => break,
                c => value.push(c),
            }
        }
        labels.insert(key.trim_start_matches(',').to_string(), value);
        if chars.peek() == Some(&',') {
            chars.next();
        }
    }
    Sample { name: name.to_string(), labels, value }
}

/// The value of the one series named `name` whose labels include `labels`.
pub fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let matching: Vec<Sample> = samples(text)
        .into_iter()
        .filter(|sample| sample.name == name)
        .filter(|sample| labels.iter().all(|(key, value)| sample.labels.get(*key).map(String::as_str) == Some(*value)))
        .collect();
    assert!(matching.len() <= 1, "{name} {labels:?} matches {} series: {matching:?}", matching.len());
    matching.first().map(|sample| sample.value)
}

/// Every metric name a scrape declares (`# TYPE`) or has samples of.
pub fn names(text: &str) -> BTreeSet<String> {
    let declared = text.lines().filter_map(|line| line.strip_prefix("# TYPE ")?.split(' ').next()).map(str::to_string);
    declared.chain(samples(text).into_iter().map(|sample| sample.name)).collect()
}

/// The metric names an expression uses: its identifiers of this server's `app_` namespace,
/// outside string literals (label values).
pub fn metrics_in(expression: &str) -> BTreeSet<String> {
    let mut code = String::with_capacity(expression.len());
    let (mut quoted, mut escaped) = (false, false);
    for c in expression.chars() {
        match (quoted, escaped, c) {
            (true, false, '\\') => escaped = true,
            (true, true, _) => escaped = false,
            (_, false, '"') => quoted = !quoted,
            _ => {}
        }
        code.push(if quoted { ' ' } else { c });
    }
    let mut found = BTreeSet::new();
    let mut rest = code.as_str();
    while let Some(start) = rest.find("app_") {
        let preceded = rest[..start].chars().last().is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        let tail = &rest[start..];
        let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        if !preceded {
            found.insert(tail[..end].to_string());
        }
        rest = &tail[end..];
    }
    found
}

#[test]
fn labels_with_escapes_and_names_in_expressions_are_read() {
    let text = "# TYPE x counter\nx_total{a=\"1\",b=\"q\\\"z\"} 2\ny 3\n";
    assert_eq!(value(text, "x_total", &[("b", "q\"z")]), Some(2.0));
    assert_eq!(value(text, "y", &[]), Some(3.0));
    assert!(names(text).contains("x") && names(text).contains("x_total"));
    let used = metrics_in("sum(rate(app_a_total[5m])) / my_app_b + app_c{x=\"app_d\"}");
    assert_eq!(used.into_iter().collect::<Vec<_>>(), ["app_a_total", "app_c"]);
}
