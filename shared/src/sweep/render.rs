//! The texts of one parameter value, computed once at parse time so that building a job is
//! only string concatenation.
//!
//! Commands get the value written for the quote context of its placeholder (see
//! [`super::shell`]): outside quotes it goes in as it is only when every character is one
//! the shell takes literally, and is quoted otherwise; inside double or single quotes it is
//! escaped for those quotes. A value therefore always reaches the program as one literal
//! piece of text and can never inject shell syntax, whatever quotes the template puts
//! around its placeholder. Lists are quoted too (`--hidden '[128,64]'`): unquoted, `[...]`
//! is a glob pattern.

use serde_norway::Value;

use super::shell::{push_quoted, shell_word, Quote};
use super::yaml::{json_string, Loader};

/// One value's texts in each of the styles a template can ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rendered {
    /// Compact JSON, tags dropped: for `params` and `${args_json}`.
    pub json: String,
    /// Strings as they are, everything else as JSON: inside a token quoted as a whole.
    pub raw: String,
    /// `raw`, shell-quoted when it needs it: for `{name}` placeholders outside quotes.
    pub shell: String,
    /// One-line flow YAML, tags kept: for resolved config files.
    pub yaml: String,
}

/// Which of a value's texts a template slot inserts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Style {
    Json,
    Raw,
    /// `raw` written for a placeholder in this quote context of a command.
    Shell(Quote),
    Yaml,
}

impl Rendered {
    /// All texts of `value`; fails (with a message for the caller's key path) on values a job
    /// cannot carry: NaN or infinity (JSON has neither) and NUL bytes (no shell takes them).
    pub(crate) fn new(value: &Value, loader: &Loader) -> Result<Rendered, String> {
        let mut json = String::new();
        write_json(value, &mut json)?;
        let raw = match untagged(value) {
            Value::String(text) => text.clone(),
            _ => json.clone(),
        };
        let shell = shell_word(&raw)?;
        let mut yaml = String::new();
        loader.flow(value, &mut yaml);
        Ok(Rendered { json, raw, shell, yaml })
    }

    /// Appends the text of one style.
    pub(crate) fn write(&self, style: Style, out: &mut String) {
        match style {
            Style::Json => out.push_str(&self.json),
            Style::Raw => out.push_str(&self.raw),
            Style::Shell(Quote::None) => out.push_str(&self.shell),
            Style::Shell(quote) => push_quoted(&self.raw, quote, out),
            Style::Yaml => out.push_str(&self.yaml),
        }
    }

    /// A number's texts: the same in every style.
    pub(crate) fn number(text: String) -> Rendered {
        Rendered { json: text.clone(), raw: text.clone(), shell: text.clone(), yaml: text }
    }
}

/// The value under any tags.
pub(crate) fn untagged(mut value: &Value) -> &Value {
    while let Value::Tagged(tagged) = value {
        value = &tagged.value;
    }
    value
}

/// Compact JSON of a YAML value, mapping keys in document order (a `serde_json::Map` may
/// sort them, depending on features other crates turn on).
pub(crate) fn write_json(value: &Value, out: &mut String) -> Result<(), String> {
    match untagged(value) {
        Value::Null => out.push_str("null"),
        Value::Bool(flag) => out.push_str(if *flag { "true" } else { "false" }),
        Value::Number(number) => {
            if let Some(whole) = number.as_i64() {
                out.push_str(&whole.to_string());
            } else if let Some(whole) = number.as_u64() {
                out.push_str(&whole.to_string());
            } else {
                write_float(number.as_f64().unwrap_or(f64::NAN), out)?;
            }
        }
        Value::String(text) => out.push_str(&json_string(text)),
        Value::Sequence(items) => {
            out.push('[');
            for (position, item) in items.iter().enumerate() {
                if position > 0 {
                    out.push(',');
                }
                write_json(item, out)?;
            }
            out.push(']');
        }
        Value::Mapping(map) => {
            out.push('{');
            for (position, (key, item)) in map.iter().enumerate() {
                if position > 0 {
                    out.push(',');
                }
                let key = match untagged(key) {
                    Value::String(text) => text.clone(),
                    Value::Sequence(_) | Value::Mapping(_) => {
                        return Err("a mapping used as a parameter value needs scalar keys".to_owned())
                    }
                    other => super::yaml::key_text(other),
                };
                out.push_str(&json_string(&key));
                out.push(':');
                write_json(item, out)?;
            }
            out.push('}');
        }
        Value::Tagged(_) => unreachable!("untagged() removed every tag"),
    }
    Ok(())
}

/// A float's JSON text (`0.001`, `1e-5`, `2.0`): serde_json's shortest round-trip form.
pub(crate) fn write_float(number: f64, out: &mut String) -> Result<(), String> {
    if !number.is_finite() {
        return Err(format!("`{number}` cannot be a parameter value: JSON has no NaN or infinity"));
    }
    out.push_str(&serde_json::Number::from_f64(number).map(|n| n.to_string()).unwrap_or_default());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(text: &str) -> Rendered {
        let loader = Loader::for_text(text);
        Rendered::new(&loader.load(text).unwrap(), &loader).unwrap()
    }

    #[test]
    fn numbers_keep_their_json_form() {
        assert_eq!(render("0.001").shell, "0.001");
        assert_eq!(render("1e-5").json.parse::<f64>(), Ok(1e-5));
        assert_eq!(render("2048").json, "2048");
        assert_eq!(render("1.0").json, "1.0");
        assert_eq!(render("-7").shell, "-7");
        assert_eq!(render("1.0e-6").yaml, "1.0e-06");
    }

    #[test]
    fn each_quote_context_gets_its_own_escaping() {
        let value = render("'it''s $(id) \"x\"'");
        let write = |quote| {
            let mut out = String::new();
            value.write(Style::Shell(quote), &mut out);
            out
        };
        assert_eq!(write(Quote::Double), "it's \\$(id) \\\"x\\\"");
        assert_eq!(write(Quote::Single), "it'\\''s $(id) \"x\"");
        assert_eq!(write(Quote::None), value.shell);
    }

    #[test]
    fn lists_and_mappings_become_compact_json_in_document_order() {
        let list = render("[128, 64]");
        assert_eq!(
            (list.json.as_str(), list.shell.as_str(), list.yaml.as_str()),
            ("[128,64]", "'[128,64]'", "[128, 64]")
        );
        let map = render("{z: 1, a: [x]}");
        assert_eq!(map.json, r#"{"z":1,"a":["x"]}"#);
        assert_eq!(map.shell, r#"'{"z":1,"a":["x"]}'"#);
    }

    #[test]
    fn unsafe_strings_are_quoted_and_safe_ones_are_not() {
        assert_eq!(render("resnet18").shell, "resnet18");
        assert_eq!(render("'a b'").shell, "'a b'");
        assert_eq!(render("'$(rm -rf /)'").shell, "'$(rm -rf /)'");
        assert_eq!(render("\"it's\"").shell, "\"it's\"");
        assert_eq!(render("''").shell, "''");
        assert_eq!(render("'a b'").raw, "a b");
        assert_eq!(render("yes").json, "\"yes\"");
    }

    #[test]
    fn refuses_values_a_job_cannot_carry() {
        let loader = Loader::for_text("");
        assert!(Rendered::new(&loader.load(".nan").unwrap(), &loader).is_err());
        assert!(Rendered::new(&Value::String("a\0b".into()), &loader).is_err());
    }
}
