//! W&B parameter specs (`{values: [..]}`, `{value: x}`, `{distribution: .., min, max}`,
//! nested `{parameters: {..}}`), validated into [`Distribution`]s.

use serde_norway::{Mapping, Value};

use super::error::{invalid, SweepError};
use super::random::{Distribution, Step, MAX_STANDARD_NORMAL};
use super::read::{self, describe, get, join};
use super::render::Rendered;

const SPEC_KEYS: [&str; 12] =
    ["values", "value", "distribution", "min", "max", "q", "mu", "sigma", "a", "b", "probabilities", "parameters"];

const DISTRIBUTIONS: [&str; 17] = [
    "constant",
    "categorical",
    "uniform",
    "int_uniform",
    "q_uniform",
    "log_uniform",
    "q_log_uniform",
    "log_uniform_values",
    "q_log_uniform_values",
    "normal",
    "q_normal",
    "log_normal",
    "q_log_normal",
    "inv_log_uniform",
    "inv_log_uniform_values",
    "beta",
    "q_beta",
];

/// A parameter: one distribution, or an object of nested parameters.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ParamSpec {
    Leaf(Distribution),
    Nested(Vec<(String, ParamSpec)>),
}

/// Reads a `parameters` mapping at `path`, in document order.
pub(crate) fn parse_parameters(value: &Value, path: &str) -> Result<Vec<(String, ParamSpec)>, SweepError> {
    let map = read::mapping(value, path)?;
    let mut specs = Vec::with_capacity(map.len());
    for (key, spec) in map {
        let name = match key.as_str() {
            Some(name) if !name.is_empty() => name.to_owned(),
            _ => {
                return Err(invalid(
                    path,
                    format!("parameter names must be non-empty strings, found {}", describe(key)),
                ))
            }
        };
        let spec_path = join(path, &name);
        specs.push((name, parse_spec(spec, &spec_path)?));
    }
    Ok(specs)
}

fn parse_spec(value: &Value, path: &str) -> Result<ParamSpec, SweepError> {
    let Some(map) = value.as_mapping() else {
        let found = describe(value);
        let expected =
            "expected a parameter spec such as {values: [...]}, {value: x} or {distribution: uniform, min: 0, max: 1}";
        return Err(invalid(path, format!("{expected}, found {found}")));
    };
    read::check_keys(map, path, &SPEC_KEYS, &[], "a parameter spec")?;
    if let Some(nested) = map.get("parameters") {
        if let Some(other) = map.keys().filter_map(Value::as_str).find(|key| *key != "parameters") {
            return Err(invalid(join(path, other), format!("`{other}` cannot be combined with nested `parameters`")));
        }
        return Ok(ParamSpec::Nested(parse_parameters(nested, &join(path, "parameters"))?));
    }
    let name = distribution_name(map, path)?;
    check_applicable(map, path, name)?;
    let field = Fields { map, path };
    let distribution = match name {
        "constant" => Distribution::Constant(render(field.required("value", name)?, &join(path, "value"))?),
        "categorical" => categorical(&field)?,
        "int_uniform" => {
            let (min, max) = (field.required("min", name)?, field.required("max", name)?);
            let bound = |value, key: &str| {
                read::integer_in::<i64>(value, &join(path, key), i64::MIN.into(), i64::MAX.into(), "a 64-bit integer")
            };
            let (min, max) = (bound(min, "min")?, bound(max, "max")?);
            field.ordered(min as f64, max as f64)?;
            Distribution::IntUniform { min, max }
        }
        "beta" | "q_beta" => {
            let (a, b) = (field.positive_or_one("a")?, field.positive_or_one("b")?);
            let q = field.step()?;
            match name {
                "beta" => Distribution::Beta { a, b },
                _ => Distribution::QBeta { a, b, q },
            }
        }
        "uniform"
        | "q_uniform"
        | "log_uniform"
        | "q_log_uniform"
        | "log_uniform_values"
        | "q_log_uniform_values"
        | "inv_log_uniform"
        | "inv_log_uniform_values" => {
            let (min, max) = (field.number("min", name)?, field.number("max", name)?);
            field.ordered(min, max)?;
            let q = field.step()?;
            if name.ends_with("log_uniform_values") && min <= 0.0 {
                return Err(invalid(join(path, "min"), format!("{name} needs `min` > 0, found {min}")));
            }
            if name == "inv_log_uniform" && -min > 709.0 {
                let message = format!("{name} draws e^-x for x from `min`, and e^{} overflows", -min);
                return Err(invalid(join(path, "min"), message));
            }
            if name.ends_with("log_uniform") && name != "inv_log_uniform" && max > 709.0 {
                let message = format!(
                    "{name} takes exponents and e^{max} overflows; for bounds as values use log_uniform_values"
                );
                return Err(invalid(join(path, "max"), message));
            }
            if !(max - min).is_finite() {
                let message = format!("the range from `min` ({min}) to `max` ({max}) is too wide: max - min overflows");
                return Err(invalid(join(path, "max"), message));
            }
            if name.starts_with("q_") {
                // The largest draw in magnitude, which is divided by q to quantize it.
                let largest = match name {
                    "q_log_uniform" => max.exp(),
                    _ => min.abs().max(max.abs()),
                };
                field.quantizable(largest, q.q)?;
            }
            match name {
                "inv_log_uniform" => Distribution::InvLogUniform { min, max },
                "inv_log_uniform_values" => Distribution::InvLogUniformValues { min, max },
                "uniform" => Distribution::Uniform { min, max },
                "q_uniform" => Distribution::QUniform { min, max, q },
                "log_uniform" => Distribution::LogUniform { min, max },
                "q_log_uniform" => Distribution::QLogUniform { min, max, q },
                "log_uniform_values" => Distribution::LogUniformValues { min, max },
                _ => Distribution::QLogUniformValues { min, max, q },
            }
        }
        _ => {
            let mu = get(map, "mu").map(|mu| read::number(mu, &join(path, "mu"))).transpose()?.unwrap_or(0.0);
            let sigma = field.positive_or_one("sigma")?;
            let q = field.step()?;
            // Draws are mu + sigma * z with |z| < MAX_STANDARD_NORMAL; 40 sigma is room to spare.
            let reach = mu.abs() + 40.0 * sigma;
            if !reach.is_finite() {
                let message =
                    format!("mu ± 40·sigma must be a finite float; with mu = {mu} and sigma = {sigma} it is not");
                return Err(invalid(join(path, "sigma"), message));
            }
            let largest = if name.contains("log_normal") {
                let exponent = mu + MAX_STANDARD_NORMAL * sigma;
                if exponent > f64::MAX.ln() {
                    let message = format!(
                        "{name} draws e^(mu + sigma·z), which overflows for mu = {mu} and sigma = {sigma}; \
                         keep mu + {MAX_STANDARD_NORMAL}·sigma below 709"
                    );
                    return Err(invalid(join(path, "sigma"), message));
                }
                exponent.exp()
            } else {
                reach
            };
            if name.starts_with("q_") {
                field.quantizable(largest, q.q)?;
            }
            match name {
                "normal" => Distribution::Normal { mu, sigma },
                "q_normal" => Distribution::QNormal { mu, sigma, q },
                "log_normal" => Distribution::LogNormal { mu, sigma },
                _ => Distribution::QLogNormal { mu, sigma, q },
            }
        }
    };
    Ok(ParamSpec::Leaf(distribution))
}

/// The explicit `distribution`, or the one W&B infers from the keys present.
fn distribution_name(map: &Mapping, path: &str) -> Result<&'static str, SweepError> {
    if let Some(value) = get(map, "distribution") {
        let name = value.as_str().unwrap_or_default();
        return DISTRIBUTIONS.iter().copied().find(|known| *known == name).ok_or_else(|| {
            let shown = read::key_text(value);
            let message = format!("unknown distribution `{shown}`; known: {}", DISTRIBUTIONS.join(", "));
            invalid(join(path, "distribution"), message)
        });
    }
    let is_int = |key| get(map, key).is_some_and(|value| value.as_i64().is_some());
    Ok(if map.contains_key("values") {
        "categorical"
    } else if map.contains_key("value") {
        "constant"
    } else if map.contains_key("min") || map.contains_key("max") {
        if is_int("min") && is_int("max") {
            "int_uniform"
        } else {
            "uniform"
        }
    } else {
        let message = "a parameter spec needs `values`, `value`, `distribution`, `min`/`max` or `parameters`";
        return Err(invalid(path, message));
    })
}

/// Refuses keys the distribution does not read, so a typo'd spec is not silently changed.
fn check_applicable(map: &Mapping, path: &str, name: &str) -> Result<(), SweepError> {
    let applicable: &[&str] = match name {
        "constant" => &["value"],
        "categorical" => &["values", "probabilities"],
        "uniform"
        | "int_uniform"
        | "log_uniform"
        | "log_uniform_values"
        | "inv_log_uniform"
        | "inv_log_uniform_values" => &["min", "max"],
        "q_uniform" | "q_log_uniform" | "q_log_uniform_values" => &["min", "max", "q"],
        "beta" => &["a", "b"],
        "q_beta" => &["a", "b", "q"],
        "normal" | "log_normal" => &["mu", "sigma"],
        _ => &["mu", "sigma", "q"],
    };
    let stray = map.keys().filter_map(Value::as_str).find(|key| *key != "distribution" && !applicable.contains(key));
    match stray {
        Some(key) => Err(invalid(join(path, key), format!("`{key}` does not apply to distribution {name}"))),
        None => Ok(()),
    }
}

fn render(value: &Value, path: &str) -> Result<Rendered, SweepError> {
    Rendered::new(value).map_err(|message| invalid(path, message))
}

fn categorical(field: &Fields<'_>) -> Result<Distribution, SweepError> {
    let values_path = join(field.path, "values");
    let values = match field.required("values", "categorical")? {
        Value::Sequence(items) if !items.is_empty() => items,
        other => {
            return Err(invalid(values_path, format!("expected a non-empty list of values, found {}", describe(other))))
        }
    };
    let values = values.iter().map(|value| render(value, &values_path)).collect::<Result<Vec<_>, _>>()?;
    let Some(probabilities) = get(field.map, "probabilities") else {
        return Ok(Distribution::Categorical { values, cumulative: None });
    };
    let path = join(field.path, "probabilities");
    let weights = match probabilities {
        Value::Sequence(items) if items.len() == values.len() => items,
        _ => return Err(invalid(path, format!("expected a list of {} probabilities, one per value", values.len()))),
    };
    let mut cumulative = Vec::with_capacity(weights.len());
    let mut sum = 0.0;
    for weight in weights {
        let weight = read::number(weight, &path)?;
        if weight < 0.0 {
            return Err(invalid(path, format!("probabilities must not be negative, found {weight}")));
        }
        sum += weight;
        cumulative.push(sum);
    }
    if (sum - 1.0).abs() > 1e-3 {
        return Err(invalid(path, format!("probabilities must sum to 1, found {sum}")));
    }
    Ok(Distribution::Categorical { values, cumulative: Some(cumulative) })
}

/// Reads the numeric fields of one spec, with errors at `path.key`.
struct Fields<'a> {
    map: &'a Mapping,
    path: &'a str,
}

impl Fields<'_> {
    fn required(&self, key: &str, distribution: &str) -> Result<&Value, SweepError> {
        get(self.map, key)
            .ok_or_else(|| invalid(join(self.path, key), format!("distribution {distribution} needs `{key}`")))
    }

    fn number(&self, key: &str, distribution: &str) -> Result<f64, SweepError> {
        read::number(self.required(key, distribution)?, &join(self.path, key))
    }

    /// `q` and `sigma`: default 1, must be positive.
    fn positive_or_one(&self, key: &str) -> Result<f64, SweepError> {
        let Some(value) = get(self.map, key) else { return Ok(1.0) };
        let number = read::number(value, &join(self.path, key))?;
        if number <= 0.0 {
            return Err(invalid(join(self.path, key), format!("`{key}` must be greater than 0, found {number}")));
        }
        Ok(number)
    }

    /// `q`: default the integer 1 (W&B's default); an integer `q` gives integers.
    fn step(&self) -> Result<Step, SweepError> {
        let integer = get(self.map, "q").is_none_or(|q| q.as_i64().is_some() || q.as_u64().is_some());
        Ok(Step { q: self.positive_or_one("q")?, integer })
    }

    /// Refuses a `q` so small that `largest / q` overflows (every such draw would be null).
    fn quantizable(&self, largest: f64, q: f64) -> Result<(), SweepError> {
        if !(largest / q).is_finite() {
            let message = format!("`q` ({q}) is too small for draws up to {largest}: value / q overflows");
            return Err(invalid(join(self.path, "q"), message));
        }
        Ok(())
    }

    fn ordered(&self, min: f64, max: f64) -> Result<(), SweepError> {
        if min >= max {
            return Err(invalid(join(self.path, "max"), format!("`max` ({max}) must be greater than `min` ({min})")));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(text: &str) -> Result<ParamSpec, SweepError> {
        parse_spec(&serde_norway::from_str(text).unwrap(), "parameters.x")
    }

    fn error_path(text: &str) -> String {
        match spec(text) {
            Err(SweepError::Invalid { path, .. }) => path,
            other => panic!("{text}: {other:?}"),
        }
    }

    #[test]
    fn infers_the_distribution_from_the_keys() {
        assert_eq!(spec("{min: 1, max: 5}"), Ok(ParamSpec::Leaf(Distribution::IntUniform { min: 1, max: 5 })));
        assert_eq!(spec("{min: 0, max: 0.5}"), Ok(ParamSpec::Leaf(Distribution::Uniform { min: 0.0, max: 0.5 })));
        let Ok(ParamSpec::Leaf(Distribution::Categorical { values, .. })) = spec("{values: [a, 2]}") else { panic!() };
        assert_eq!(values.len(), 2);
        assert!(matches!(spec("{value: 3}"), Ok(ParamSpec::Leaf(Distribution::Constant(_)))));
        let nested = spec("{parameters: {lr: {value: 1}}}").unwrap();
        assert!(matches!(nested, ParamSpec::Nested(ref inner) if inner[0].0 == "lr"));
    }

    #[test]
    fn errors_point_at_the_offending_field() {
        assert_eq!(error_path("{min: 1, max: 1}"), "parameters.x.max");
        assert_eq!(error_path("{distribution: log_uniform_values, min: 0, max: 1}"), "parameters.x.min");
        assert_eq!(error_path("{distribution: normal, sigma: 0}"), "parameters.x.sigma");
        assert_eq!(error_path("{distribution: q_uniform, min: 0, max: 1, q: -1}"), "parameters.x.q");
        assert_eq!(error_path("{distribution: int_uniform, min: 0.5, max: 3}"), "parameters.x.min");
        assert_eq!(error_path("{distribution: beta, min: 0, max: 1}"), "parameters.x.min");
        assert_eq!(error_path("{distribution: betta}"), "parameters.x.distribution");
        assert_eq!(error_path("{distribution: beta, a: 0}"), "parameters.x.a");
        assert_eq!(error_path("{distribution: inv_log_uniform_values, min: 0, max: 1}"), "parameters.x.min");
        assert_eq!(error_path("{distribution: uniform, min: 0}"), "parameters.x.max");
        assert_eq!(error_path("{distribution: uniform, min: 0, max: 1, values: [1]}"), "parameters.x.values");
        assert_eq!(error_path("{values: []}"), "parameters.x.values");
        assert_eq!(error_path("{values: [1, 2], probabilities: [0.5]}"), "parameters.x.probabilities");
        assert_eq!(error_path("{values: [1, 2], probabilities: [0.5, 0.6]}"), "parameters.x.probabilities");
        assert_eq!(error_path("{valeus: [1]}"), "parameters.x.valeus");
        assert_eq!(error_path("{parameters: {a: {value: 1}}, value: 2}"), "parameters.x.value");
        assert_eq!(error_path("{}"), "parameters.x");
        assert_eq!(error_path("{distribution: uniform, min: -1e308, max: 1e308}"), "parameters.x.max");
        assert_eq!(error_path("{distribution: q_uniform, min: 0, max: 1e300, q: 1e-10}"), "parameters.x.q");
        assert_eq!(error_path("{distribution: q_log_uniform, min: 0, max: 700, q: 1e-10}"), "parameters.x.q");
        assert_eq!(error_path("{distribution: normal, mu: 0, sigma: 1e307}"), "parameters.x.sigma");
        assert_eq!(error_path("{distribution: log_normal, mu: 700, sigma: 2}"), "parameters.x.sigma");
        assert_eq!(error_path("{distribution: q_log_normal, mu: 600, sigma: 1, q: 1e-100}"), "parameters.x.q");
        assert_eq!(error_path("0.1"), "parameters.x");
    }
}
