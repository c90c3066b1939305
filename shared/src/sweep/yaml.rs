//! Reading the sweep file into a YAML value and writing values back as YAML.
//!
//! serde_norway keeps local tags (`!foo`) but silently drops tags written with the `!!`
//! handle, because they resolve to `tag:yaml.org,2002:...`, which it reads as the core schema.
//! A CVLab-Kit config's `!!python/tuple [0.9, 0.999]` would then reach us as a plain list and
//! be swept over. So before parsing, [`Loader`] rewrites `!!python/` to a local tag of the
//! same length (columns in syntax errors stay right), and every writer here turns that local
//! tag back into `!!python/` so the Python loader still gets a tuple.

use serde_norway::{Mapping, Value};

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
}

impl Loader {
    /// A loader whose private tag does not occur in `text`.
    pub(crate) fn for_text(text: &str) -> Loader {
        let python_marker = (0..100).map(|n| format!("!pytag{n:02}/")).find(|marker| !text.contains(marker.as_str()));
        Loader { python_marker }
    }

    /// Parses one YAML document, resolving merge keys (`<<: *defaults`), common in configs.
    pub(crate) fn load(&self, text: &str) -> Result<Value, SweepError> {
        let marker = self.python_marker.as_deref().filter(|_| text.contains(PYTHON_TAG));
        let Some(marker) = marker else {
            return parse_document(text);
        };
        let mut value = parse_document(&text.replace(PYTHON_TAG, marker))?;
        // The rewrite also touched `!!python/` inside quoted strings; put those back.
        restore_strings(&mut value, marker);
        Ok(value)
    }

    /// The tag as it must be written: `!!python/tuple` or `!foo`.
    fn tag_text(&self, tag: &serde_norway::value::Tag) -> String {
        let text = tag.to_string();
        match self.python_marker.as_deref().and_then(|marker| text.strip_prefix(marker)) {
            Some(rest) => format!("{PYTHON_TAG}{rest}"),
            None => text,
        }
    }

    /// The value as a block-style YAML document.
    pub(crate) fn to_yaml(&self, value: &Value) -> Result<String, SweepError> {
        let text = serde_norway::to_string(value)
            .map_err(|error| invalid("(root)", format!("cannot write the config as YAML: {error}")))?;
        Ok(match &self.python_marker {
            Some(marker) => text.replace(marker.as_str(), PYTHON_TAG),
            None => text,
        })
    }

    /// The value as one line of flow-style YAML (`[128, 64]`, `{a: 1}`, `"x y"`), which is
    /// valid after `key: ` anywhere in a block document.
    pub(crate) fn flow(&self, value: &Value, out: &mut String) {
        match value {
            Value::Null => out.push_str("null"),
            Value::Bool(flag) => out.push_str(if *flag { "true" } else { "false" }),
            Value::Number(number) => out.push_str(&number.to_string()),
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

/// A string's JSON text: quoted and escaped.
pub(crate) fn json_string(text: &str) -> String {
    // Serialising a &str to JSON cannot fail.
    serde_json::to_string(text).unwrap_or_default()
}

fn parse_document(text: &str) -> Result<Value, SweepError> {
    let mut value: Value = serde_norway::from_str(text).map_err(syntax_error)?;
    value.apply_merge().map_err(|error| invalid("(root)", format!("cannot apply a `<<` merge key: {error}")))?;
    Ok(value)
}

fn syntax_error(error: serde_norway::Error) -> SweepError {
    let message = error.to_string();
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
            Loader { python_marker: None }.flow(other, &mut text);
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
    fn merge_keys_are_applied() {
        let value = Loader::for_text("").load("base: &b {x: 1}\nrun:\n  <<: *b\n  y: 2\n").unwrap();
        assert_eq!(value["run"]["x"], Value::Number(1.into()));
    }
}
