//! Writing YAML: values as one line of flow YAML, and whole documents in block style with
//! slots where each job's values go.
//!
//! The writer is ours rather than serde_norway's for two reasons. Floats must be read back by
//! YAML 1.1 readers (PyYAML takes `1e-6` for a string), so they go out as `1.0e-06`. And a
//! resolved config file is a template: the document is written once, with a slot piece where
//! each axis sits, and job `i` only appends its values' one-line flow texts into the slots,
//! which reads back as the same document since axes only ever sit at mapping values. Tags are
//! written as they were read (`!!python/tuple [0.9, 0.999]`), so the Python loader still gets a
//! tuple.

use serde_norway::{Mapping, Value};

use super::json::json_string;
use super::template::{Piece, Template};
use super::Style;

/// A document about to be written: mappings in block style, any other value in flow style,
/// and slots for the values of one job.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Doc {
    Value(Value),
    Slot(usize),
    Map(Vec<(Value, Doc)>),
}

impl Doc {
    /// The value with every (untagged) mapping opened for slots.
    pub(crate) fn from_value(value: Value) -> Doc {
        match value {
            Value::Mapping(map) => Doc::from_mapping(map),
            other => Doc::Value(other),
        }
    }

    pub(crate) fn from_mapping(map: Mapping) -> Doc {
        Doc::Map(map.into_iter().map(|(key, item)| (key, Doc::from_value(item))).collect())
    }

    /// The block-style text of the document, as a template of its slots.
    pub(crate) fn template(&self) -> Template {
        let mut template = Template::default();
        match self {
            Doc::Map(entries) if !entries.is_empty() => write_entries(entries, 0, &mut template),
            Doc::Map(_) => template.push_text("{}\n"),
            Doc::Value(value) => {
                let mut text = String::new();
                flow(value, &mut text);
                text.push('\n');
                template.push_text(&text);
            }
            Doc::Slot(slot) => {
                template.push(Piece::Slot(*slot, Style::Yaml));
                template.push_text("\n");
            }
        }
        template
    }
}

fn write_entries(entries: &[(Value, Doc)], indent: usize, template: &mut Template) {
    for (key, doc) in entries {
        let mut line = " ".repeat(indent);
        flow(key, &mut line);
        line.push(':');
        match doc {
            Doc::Slot(slot) => {
                line.push(' ');
                template.push_text(&line);
                template.push(Piece::Slot(*slot, Style::Yaml));
                template.push_text("\n");
            }
            Doc::Map(inner) if !inner.is_empty() => {
                line.push('\n');
                template.push_text(&line);
                write_entries(inner, indent + 2, template);
            }
            Doc::Map(_) => template.push_text(&format!("{line} {{}}\n")),
            Doc::Value(value) => {
                line.push(' ');
                flow(value, &mut line);
                line.push('\n');
                template.push_text(&line);
            }
        }
    }
}

/// A whole value as a block document (no slots).
pub(crate) fn document(value: &Value) -> String {
    let mut out = String::new();
    Doc::from_value(value.clone()).template().render(&[], 0, &mut out);
    out
}

/// The value as one line of flow-style YAML (`[128, 64]`, `{a: 1}`, `"x y"`), which is valid
/// after `key: ` anywhere in a block document.
pub(crate) fn flow(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(flag) => out.push_str(if *flag { "true" } else { "false" }),
        Value::Number(number) => match number.as_f64().filter(|_| number.is_f64()) {
            Some(float) => out.push_str(&yaml_float(float)),
            None => out.push_str(&number.to_string()),
        },
        Value::String(text) if is_plain_safe(text) => out.push_str(text),
        // A JSON string is a valid YAML double-quoted scalar, and stays on one line.
        Value::String(text) => out.push_str(&json_string(text)),
        Value::Sequence(items) => {
            out.push('[');
            for (position, item) in items.iter().enumerate() {
                if position > 0 {
                    out.push_str(", ");
                }
                flow(item, out);
            }
            out.push(']');
        }
        Value::Mapping(map) => {
            out.push('{');
            for (position, (key, item)) in map.iter().enumerate() {
                if position > 0 {
                    out.push_str(", ");
                }
                flow(key, out);
                out.push_str(": ");
                flow(item, out);
            }
            out.push('}');
        }
        Value::Tagged(tagged) => {
            out.push_str(&tagged.tag.to_string());
            out.push(' ');
            flow(&tagged.value, out);
        }
    }
}

/// A float as YAML 1.1 (PyYAML) and YAML 1.2 both read it back as the same float: a dot in
/// the mantissa and a signed exponent of at least two digits (`1.0e-06`, `2.5e+20`, as PyYAML
/// writes them), plain decimals as they are (`0.001`, `3.0`), and `.inf`, `-.inf`, `.nan`.
pub(crate) fn yaml_float(number: f64) -> String {
    if number.is_nan() {
        return ".nan".to_owned();
    }
    if number.is_infinite() {
        return if number > 0.0 { ".inf" } else { "-.inf" }.to_owned();
    }
    // The shortest text that reads back as the same float.
    let text = serde_norway::Number::from(number).to_string();
    let Some((mantissa, exponent)) = text.split_once(['e', 'E']) else {
        return if text.contains('.') { text } else { format!("{text}.0") };
    };
    let dot = if mantissa.contains('.') { "" } else { ".0" };
    let (sign, digits) = match exponent.strip_prefix('-') {
        Some(digits) => ('-', digits),
        None => ('+', exponent.trim_start_matches('+')),
    };
    format!("{mantissa}{dot}e{sign}{digits:0>2}")
}

/// Whether a string may be written unquoted in flow context and still read back as the same
/// string. Deliberately narrow: anything doubtful is quoted.
fn is_plain_safe(text: &str) -> bool {
    const RESERVED: [&str; 12] =
        ["true", "false", "yes", "no", "on", "off", "y", "n", "null", "nan", "inf", "infinity"];
    let mut chars = text.chars();
    let starts_well = chars.next().is_some_and(|first| first.is_ascii_alphabetic() || first == '_');
    starts_well
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '-'))
        && !RESERVED.contains(&text.to_ascii_lowercase().as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::load::Loader;

    fn load(text: &str) -> Value {
        Loader::for_text(text).load(text).unwrap()
    }

    #[test]
    fn documents_read_back_as_the_same_value() {
        let text =
            "a: 1.0e-6\nb: [2.5e+20, 7]\n1.5: !t 1e-9\nc: x __app_float_0__\nbetas: !!python/tuple [0.9, 0.999]\n\
                    n: {deep: {er: [yes, 'a b', \"x\\ny\", '', .inf, a.b/c, {k: [null, true]}]}, e: {}}\n";
        let value = load(text);
        let written = document(&value);
        assert_eq!(load(&written), value, "{written}");
        assert!(written.starts_with("a: 1.0e-06\nb: [2.5e+20, 7]\n1.5: !t 1.0e-09\n"), "{written}");
        assert!(written.contains("betas: !!python/tuple [0.9, 0.999]\n"), "{written}");
        assert_eq!(document(&load("{}")), "{}\n");
    }

    #[test]
    fn slots_take_flow_values() {
        let mut doc = Doc::from_value(load("model: {dims: x, name: y}\nlr: 1\n"));
        let Doc::Map(entries) = &mut doc else { panic!() };
        entries[1].1 = Doc::Slot(0);
        let Doc::Map(model) = &mut entries[0].1 else { panic!() };
        model[0].1 = Doc::Slot(1);
        let values: Vec<_> = ["0.2", "{a: [1, 2], b: 'x: y'}"]
            .iter()
            .map(|text| crate::sweep::render::Rendered::new(&load(text)).unwrap())
            .collect();
        let refs: Vec<_> = values.iter().collect();
        let mut out = String::new();
        doc.template().render(&refs, 0, &mut out);
        assert_eq!(load(&out), load("model: {dims: {a: [1, 2], b: 'x: y'}, name: y}\nlr: 0.2\n"), "{out}");
    }

    #[test]
    fn floats_are_written_for_yaml_1_1_readers() {
        let cases = [
            (1.0e-6, "1.0e-06"),
            (2.5e20, "2.5e+20"),
            (-1.5e-300, "-1.5e-300"),
            (1e16, "1.0e+16"),
            (0.001, "0.001"),
            (3.0, "3.0"),
            (-0.0, "-0.0"),
            (f64::INFINITY, ".inf"),
            (f64::NEG_INFINITY, "-.inf"),
            (f64::NAN, ".nan"),
        ];
        for (number, expected) in cases {
            assert_eq!(yaml_float(number), expected);
            let back = load(expected);
            assert!(
                back.as_f64().is_some_and(|read| read.to_bits() == number.to_bits() || number.is_nan()),
                "{expected}"
            );
        }
    }
}
