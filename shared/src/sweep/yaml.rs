//! Reading the sweep file into a YAML value and writing values back as YAML.
//!
//! serde_norway keeps local tags (`!foo`) but silently drops tags written with the `!!`
//! handle, because they resolve to `tag:yaml.org,2002:...`, which it reads as the core schema.
//! A CVLab-Kit config's `!!python/tuple [0.9, 0.999]` would then reach us as a plain list and
//! be swept over. So before parsing, [`Loader`] rewrites `!!python/` to a local tag of the
//! same length (columns in syntax errors stay right), and every writer here turns that local
//! tag back into `!!python/` so the Python loader still gets a tuple.

use std::borrow::Cow;

use serde_norway::value::TaggedValue;
use serde_norway::{Mapping, Value};

use super::bounded::{self, Allowance};
use super::config::unused_prefix;
use super::error::{invalid, SweepError};

/// The tag handle that serde_norway would drop.
const PYTHON_TAG: &str = "!!python/";

/// Parses sweep files and their embedded list-looking strings the same way, and writes
/// values back with their `!!python/` tags.
#[derive(Debug, Clone)]
pub(crate) struct Loader {
    /// A local tag as long as `!!python/` that the input never contains, so every occurrence
    /// of it in our values or output came from the rewrite.
    python_marker: Option<String>,
    /// What every document loaded for this sweep file may still expand to.
    allowance: Allowance,
}

impl Loader {
    /// A loader whose private tag does not occur in `text`, and with the budget of a sweep
    /// file of `text`.
    pub(crate) fn for_text(text: &str) -> Loader {
        let python_marker = (0..100).map(|n| format!("!pytag{n:02}/")).find(|marker| !text.contains(marker.as_str()));
        Loader { python_marker, allowance: Allowance::for_text(text) }
    }

    /// The same loader, refusing documents nested deeper than `depth`.
    pub(crate) fn with_max_depth(mut self, depth: usize) -> Loader {
        self.allowance = self.allowance.with_max_depth(depth);
        self
    }

    /// Parses one YAML document, resolving merge keys (`<<: *defaults`), common in configs.
    pub(crate) fn load(&self, text: &str) -> Result<Value, SweepError> {
        let marker = self.python_marker.as_deref().filter(|_| text.contains(PYTHON_TAG));
        let Some(marker) = marker else {
            return parse_document(text, &self.allowance);
        };
        let mut value = parse_document(&text.replace(PYTHON_TAG, marker), &self.allowance)?;
        // The rewrite also touched `!!python/` inside quoted strings; put those back.
        restore_strings(&mut value, marker);
        Ok(value)
    }

    /// Whether a document loaded here went over the sweep file's budget; once it has, every
    /// later load fails too, and the sweep must be refused rather than read differently.
    pub(crate) fn is_spent(&self) -> bool {
        self.allowance.is_spent()
    }

    /// The tag as it must be written: `!!python/tuple` or `!foo`.
    fn tag_text(&self, tag: &serde_norway::value::Tag) -> String {
        let text = tag.to_string();
        match self.python_marker.as_deref().and_then(|marker| text.strip_prefix(marker)) {
            Some(rest) => format!("{PYTHON_TAG}{rest}"),
            None => text,
        }
    }

    /// The value as a block-style YAML document, floats written by [`yaml_float`].
    ///
    /// serde_norway writes `1e-6`, which YAML 1.1 readers (PyYAML) take for a string, so each
    /// float goes out as a marker string and the marker is then replaced by the float's text.
    pub(crate) fn to_yaml(&self, value: &Value) -> Result<String, SweepError> {
        let mut floats = Vec::new();
        let mut texts = Vec::new();
        collect_floats_and_texts(value, &mut floats, &mut texts);
        let written = if floats.is_empty() {
            write_block(value)?
        } else {
            let prefix = unused_prefix("__app_float_", texts.iter().map(|text| text.as_ref()));
            let mut next = 0;
            let marked = mark_floats(value, &prefix, &mut next);
            splice_floats(&write_block(&marked)?, &prefix, &floats)
        };
        Ok(match &self.python_marker {
            Some(marker) => written.replace(marker.as_str(), PYTHON_TAG),
            None => written,
        })
    }

    /// The value as one line of flow-style YAML (`[128, 64]`, `{a: 1}`, `"x y"`), which is
    /// valid after `key: ` anywhere in a block document.
    pub(crate) fn flow(&self, value: &Value, out: &mut String) {
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
                    self.flow(item, out);
                }
                out.push(']');
            }
            Value::Mapping(map) => {
                out.push('{');
                for (position, (key, item)) in map.iter().enumerate() {
                    if position > 0 {
                        out.push_str(", ");
                    }
                    self.flow(key, out);
                    out.push_str(": ");
                    self.flow(item, out);
                }
                out.push('}');
            }
            Value::Tagged(tagged) => {
                out.push_str(&self.tag_text(&tagged.tag));
                out.push(' ');
                self.flow(&tagged.value, out);
            }
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

fn write_block(value: &Value) -> Result<String, SweepError> {
    serde_norway::to_string(value)
        .map_err(|error| invalid("(root)", format!("cannot write the config as YAML: {error}")))
}

/// The YAML texts of `value`'s floats in document order, and every text (strings, keys,
/// tags) that a marker must not occur in.
fn collect_floats_and_texts<'a>(value: &'a Value, floats: &mut Vec<String>, texts: &mut Vec<Cow<'a, str>>) {
    match value {
        Value::Number(number) if number.is_f64() => floats.push(yaml_float(number.as_f64().unwrap_or(f64::NAN))),
        Value::String(text) => texts.push(Cow::Borrowed(text)),
        Value::Sequence(items) => items.iter().for_each(|item| collect_floats_and_texts(item, floats, texts)),
        Value::Mapping(map) => {
            for (key, item) in map {
                collect_floats_and_texts(key, floats, texts);
                collect_floats_and_texts(item, floats, texts);
            }
        }
        Value::Tagged(tagged) => {
            texts.push(Cow::Owned(tagged.tag.to_string()));
            collect_floats_and_texts(&tagged.value, floats, texts);
        }
        _ => {}
    }
}

/// `value` with float number `n` (document order, as collected) replaced by `{prefix}{n}__`.
fn mark_floats(value: &Value, prefix: &str, next: &mut usize) -> Value {
    match value {
        Value::Number(number) if number.is_f64() => {
            *next += 1;
            Value::String(format!("{prefix}{}__", *next - 1))
        }
        Value::Sequence(items) => Value::Sequence(items.iter().map(|item| mark_floats(item, prefix, next)).collect()),
        Value::Mapping(map) => Value::Mapping(
            map.iter().map(|(key, item)| (mark_floats(key, prefix, next), mark_floats(item, prefix, next))).collect(),
        ),
        Value::Tagged(tagged) => Value::Tagged(Box::new(TaggedValue {
            tag: tagged.tag.clone(),
            value: mark_floats(&tagged.value, prefix, next),
        })),
        other => other.clone(),
    }
}

/// Replaces each `{prefix}{n}__` of `text` by `floats[n]`.
fn splice_floats(text: &str, prefix: &str, floats: &[String]) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find(prefix) {
        out.push_str(&rest[..start]);
        let after = &rest[start + prefix.len()..];
        let digits = after.find(|c: char| !c.is_ascii_digit()).unwrap_or(after.len());
        let float = after[..digits].parse::<usize>().ok().filter(|_| after[digits..].starts_with("__"));
        match float.and_then(|index| floats.get(index)) {
            Some(float) => {
                out.push_str(float);
                rest = &after[digits + 2..];
            }
            // Cannot happen (no text of the document contains the prefix), but text stays text.
            None => {
                out.push_str(prefix);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// A string's JSON text: quoted and escaped.
pub(crate) fn json_string(text: &str) -> String {
    // Serialising a &str to JSON cannot fail.
    serde_json::to_string(text).unwrap_or_default()
}

fn parse_document(text: &str, allowance: &Allowance) -> Result<Value, SweepError> {
    let mut value = bounded::parse(text, allowance).map_err(|error| error.unwrap_or_else(syntax_error))?;
    value.apply_merge().map_err(|error| invalid("(root)", format!("cannot apply a `<<` merge key: {error}")))?;
    Ok(value)
}

fn syntax_error(error: serde_norway::Error) -> SweepError {
    let mut message = error.to_string();
    // The YAML reader's own guards against hostile input, said plainly.
    if message.contains("repetition limit exceeded") {
        message = message.replace(
            "repetition limit exceeded",
            "too many aliases expanded (a \"billion laughs\" document?); refusing it",
        );
    } else if message.contains("recursion limit exceeded") {
        message = message.replace("recursion limit exceeded", "nested too deep; refusing it");
    }
    let Some(location) = error.location() else {
        return SweepError::Syntax { line: 1, column: 1, message };
    };
    let (line, column) = (location.line().max(1), location.column().max(1));
    // The position is in the variant already; do not say it twice.
    let message = message.replacen(&format!(" at line {line} column {column}"), "", 1);
    SweepError::Syntax { line, column, message }
}

fn restore_strings(value: &mut Value, marker: &str) {
    match value {
        Value::String(text) if text.contains(marker) => *text = text.replace(marker, PYTHON_TAG),
        Value::Sequence(items) => items.iter_mut().for_each(|item| restore_strings(item, marker)),
        Value::Mapping(map) => {
            let old = std::mem::take(map);
            for (mut key, mut item) in old {
                restore_strings(&mut key, marker);
                restore_strings(&mut item, marker);
                map.insert(key, item);
            }
        }
        Value::Tagged(tagged) => restore_strings(&mut tagged.value, marker),
        _ => {}
    }
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

/// Looks up a key, treating an explicit `null` like an absent key.
pub(crate) fn get<'a>(map: &'a Mapping, key: &str) -> Option<&'a Value> {
    map.get(key).filter(|value| !value.is_null())
}

/// A mapping key as it appears in a dotted path.
pub(crate) fn key_text(key: &Value) -> String {
    match key {
        Value::String(text) => text.clone(),
        Value::Number(number) => number.to_string(),
        Value::Bool(flag) => flag.to_string(),
        Value::Null => "null".to_owned(),
        other => {
            let mut text = String::new();
            Loader::for_text("").flow(other, &mut text);
            text
        }
    }
}

/// `parent.key`, or `key` at the top level.
pub(crate) fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}

/// What kind of value was found, for "expected X, found Y" messages.
pub(crate) fn describe(value: &Value) -> &'static str {
    match value {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(number) if number.is_f64() => "a float",
        Value::Number(_) => "an integer",
        Value::String(_) => "a string",
        Value::Sequence(_) => "a list",
        Value::Mapping(_) => "a mapping",
        Value::Tagged(_) => "a tagged value",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_tuple_tag_survives_a_round_trip() {
        let text = "betas: !!python/tuple [0.9, 0.999]\nnote: 'see !!python/tuple'\n";
        let loader = Loader::for_text(text);
        let value = loader.load(text).unwrap();
        let Value::Tagged(tagged) = &value["betas"] else { panic!("tag lost: {value:?}") };
        assert_eq!(loader.tag_text(&tagged.tag), "!!python/tuple");
        assert_eq!(value["note"], Value::String("see !!python/tuple".into()));
        let written = loader.to_yaml(&value).unwrap();
        assert!(written.contains("betas: !!python/tuple"), "{written}");
        let mut flow = String::new();
        loader.flow(&value["betas"], &mut flow);
        assert_eq!(flow, "!!python/tuple [0.9, 0.999]");
    }

    #[test]
    fn syntax_errors_carry_a_one_based_position() {
        let error = Loader::for_text("").load("a: [1, 2\nb: 3").unwrap_err();
        let SweepError::Syntax { line, column, message } = error else { panic!("{error:?}") };
        assert_eq!((line, column), (2, 2));
        assert!(!message.contains("at line 2 column 2"), "{message}");
    }

    #[test]
    fn flow_text_reads_back_as_the_same_value() {
        let text = "v: [yes, 'a b', \"x\\ny\", 1e-5, 3, {k: [null, true]}, '', inf, .inf, a.b/c]\n";
        let loader = Loader::for_text(text);
        let value = loader.load(text).unwrap();
        let mut flow = String::from("v: ");
        loader.flow(&value["v"], &mut flow);
        assert_eq!(loader.load(&flow).unwrap(), value, "{flow}");
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
            let back: Value = serde_norway::from_str(expected).unwrap();
            assert!(
                back.as_f64().is_some_and(|read| read.to_bits() == number.to_bits() || number.is_nan()),
                "{expected}"
            );
        }
        let loader = Loader::for_text("");
        let value = loader.load("a: 1.0e-6\nb: [2.5e+20, 7]\n1.5: !t 1e-9\nc: x __app_float_0__\n").unwrap();
        let written = loader.to_yaml(&value).unwrap();
        assert_eq!(written, "a: 1.0e-06\nb:\n- 2.5e+20\n- 7\n1.5: !t 1.0e-09\nc: x __app_float_0__\n");
        let mut flow = String::new();
        loader.flow(&value["b"], &mut flow);
        assert_eq!(flow, "[2.5e+20, 7]");
    }

    #[test]
    fn merge_keys_are_applied() {
        let value = Loader::for_text("").load("base: &b {x: 1}\nrun:\n  <<: *b\n  y: 2\n").unwrap();
        assert_eq!(value["run"]["x"], Value::Number(1.into()));
    }
}
