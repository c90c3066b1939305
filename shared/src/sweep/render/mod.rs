//! Every text a parameter value becomes, in one place: computed once per value at parse time,
//! so building a job is only string concatenation.
//!
//! - `json`: compact JSON, tags dropped, for the job's params (exact: shortest round-trip floats);
//! - `raw` and `shell`: for native `{name}` placeholders (strings as they are, else JSON;
//!   shell-quoted when needed, see [`shell`]);
//! - `yaml`: one-line flow YAML with tags, for resolved config files (see [`yaml`]);
//! - `python` and `python_json`: what the W&B agent passes, Python's `str()` and `json.dumps()`
//!   of the value (see [`python`]), so `True`, `128`, `['a', 'b']`, `1e-05`;
//! - `flag`: whether the value is a boolean, for `${args_no_boolean_flags}`.
//!
//! Submodules: `json`, `yaml` (flow values, block documents with slots), `python`, `shell`
//! (quote contexts of `sh -c` commands) and `template` (texts pre-split into literal pieces and
//! value slots). Nothing here depends on the form parsers.

pub(crate) mod json;
pub(crate) mod python;
pub(crate) mod shell;
pub(crate) mod template;
pub(crate) mod yaml;

use serde_norway::Value;

use shell::{push_quoted, shell_word, Quote};

/// One value's texts in each of the styles a template can ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rendered {
    pub json: String,
    pub raw: String,
    pub shell: String,
    pub yaml: String,
    pub python: String,
    /// Python's `repr()`: how the value prints inside a list or dict.
    pub python_repr: String,
    pub python_json: String,
    pub flag: Option<bool>,
}

/// Which of a value's texts a template slot inserts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Style {
    Json,
    /// `raw` written for a placeholder in this quote context of a command.
    Shell(Quote),
    Yaml,
    Python,
    PythonRepr,
    PythonJson,
}

impl Rendered {
    /// All texts of `value`; fails (with a message for the caller's key path) on values a job
    /// cannot carry: NaN or infinity (JSON has neither) and NUL bytes (no command takes them).
    pub(crate) fn new(value: &Value) -> Result<Rendered, String> {
        let mut json = String::new();
        json::write_json(value, &mut json)?;
        let raw = match untagged(value) {
            Value::String(text) => text.clone(),
            _ => json.clone(),
        };
        let shell = shell_word(&raw)?;
        let mut yaml = String::new();
        yaml::flow(value, &mut yaml);
        let flag = untagged(value).as_bool();
        Ok(Rendered {
            json,
            raw,
            shell,
            yaml,
            python: python::to_str(value),
            python_repr: python::to_repr(value),
            python_json: python::json_dumps(value),
            flag,
        })
    }

    /// Appends the text of one style.
    pub(crate) fn write(&self, style: Style, out: &mut String) {
        match style {
            Style::Json => out.push_str(&self.json),
            Style::Shell(Quote::None) => out.push_str(&self.shell),
            Style::Shell(quote) => push_quoted(&self.raw, quote, out),
            Style::Yaml => out.push_str(&self.yaml),
            Style::Python => out.push_str(&self.python),
            Style::PythonRepr => out.push_str(&self.python_repr),
            Style::PythonJson => out.push_str(&self.python_json),
        }
    }

    /// A sampled integer: the same text in every style.
    pub(crate) fn integer(value: i128) -> Rendered {
        let text = value.to_string();
        Rendered {
            json: text.clone(),
            raw: text.clone(),
            shell: text.clone(),
            yaml: text.clone(),
            python: text.clone(),
            python_repr: text.clone(),
            python_json: text,
            flag: None,
        }
    }

    /// A sampled float; one that overflowed is `null` (`None` for Python), the only JSON for
    /// it (parsing refuses parameters whose draws can overflow, so this is a last resort).
    pub(crate) fn float(value: f64) -> Rendered {
        let mut text = String::new();
        if json::write_float(value, &mut text).is_err() {
            let null = "null".to_owned();
            let python = "None".to_owned();
            return Rendered { python: python.clone(), python_repr: python, ..Rendered::integer(0) }
                .with_all_json(null);
        }
        Rendered {
            json: text.clone(),
            raw: text.clone(),
            shell: text,
            yaml: yaml::yaml_float(value),
            python: python::float_repr(value),
            python_repr: python::float_repr(value),
            python_json: python::float_repr(value),
            flag: None,
        }
    }

    fn with_all_json(self, text: String) -> Rendered {
        Rendered {
            raw: text.clone(),
            shell: text.clone(),
            yaml: text.clone(),
            python_json: text.clone(),
            json: text,
            ..self
        }
    }
}

/// The value under any tags.
pub(crate) fn untagged(mut value: &Value) -> &Value {
    while let Value::Tagged(tagged) = value {
        value = &tagged.value;
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::load::Loader;

    fn render(text: &str) -> Rendered {
        Rendered::new(&Loader::for_text(text).load(text).unwrap()).unwrap()
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
    fn python_texts_follow_str_and_json_dumps() {
        let value = render("[a, 1, 2.5, true, null, {k: 1e-5}]");
        assert_eq!(value.python, "['a', 1, 2.5, True, None, {'k': 1e-05}]");
        assert_eq!(value.python_json, r#"["a", 1, 2.5, true, null, {"k": 1e-05}]"#);
        assert_eq!(render("true").python, "True");
        assert_eq!(render("true").flag, Some(true));
        assert_eq!(render("'x y'").python, "x y");
        assert_eq!(Rendered::float(128.0).python, "128.0");
        assert_eq!(Rendered::integer(128).python, "128");
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
        assert!(Rendered::new(&Value::Number(f64::NAN.into())).is_err());
        assert!(Rendered::new(&Value::String("a\0b".into())).is_err());
    }
}
