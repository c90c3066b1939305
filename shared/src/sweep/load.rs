//! The one YAML loader: text to [`Value`] in a single streaming pass, bounded while it scans.
//!
//! Events come one at a time from `saphyr-parser`, so a hostile document is refused as soon as
//! it crosses a limit, before the rest of it is read or anything is built: nesting deeper than
//! the allowed depth (100,000 `[` cost the old two-pass reader 83 s: its scanner is quadratic
//! in flow depth), more nodes than the budget (each alias counts every node it copies, so an
//! alias bomb stops at the budget), or more string bytes than the file could hold. Scalars are
//! resolved as serde_norway resolves them (YAML 1.2 core schema), so values read the same as
//! before. Tags other than the core schema's are kept on the value as written (`!!python/tuple`,
//! `!foo`), which is what lets a CVLab config's tuple stay a tuple. Errors carry the line and
//! column, or the key path of the offending node.

use std::cell::Cell;
use std::collections::HashMap;

use saphyr_parser::{Event, Parser, ScalarStyle, ScanError, Span, Tag as EventTag};
use serde_norway::value::{Tag, TaggedValue};
use serde_norway::{Mapping, Value};

use super::error::{invalid, SweepError};
use super::read::{join, key_text};
use super::scalar::resolve_plain;

/// The most nodes a sweep file may expand to, counting each alias's copy. Sweep files need
/// hundreds; a 100,000-value axis fits. At ~0.4 µs a node (release, measured) this bounds the
/// work a hostile file can cause to under 0.1 s.
pub(crate) const MAX_NODES: usize = 200_000;
/// The deepest nesting of lists and maps a sweep file may be allowed, and the default.
/// Sweep files need a handful.
pub const MAX_DEPTH: usize = 100;
pub const DEFAULT_DEPTH: usize = 64;
/// String bytes allowed beyond twice the file's own length (escapes can lengthen a string
/// a little: `\L` is two characters in the file and three bytes in the string).
const SPARE_STRING_BYTES: usize = 64 << 20;
const CORE_SCHEMA: &str = "tag:yaml.org,2002:";

/// Loads the documents of one sweep file: the file itself, then (CVLab form) its list-looking
/// strings, all spending one budget.
#[derive(Debug, Clone)]
pub(crate) struct Loader {
    nodes_left: Cell<usize>,
    bytes_left: Cell<usize>,
    /// Whether a document has gone over the budget; every later load then fails too.
    spent: Cell<bool>,
    max_depth: usize,
}

impl Loader {
    /// A loader with the budget of a sweep file of `text`.
    pub(crate) fn for_text(text: &str) -> Loader {
        Loader {
            nodes_left: Cell::new(MAX_NODES),
            bytes_left: Cell::new(text.len().saturating_mul(2).saturating_add(SPARE_STRING_BYTES)),
            spent: Cell::new(false),
            max_depth: DEFAULT_DEPTH,
        }
    }

    /// The same loader, refusing documents nested deeper than `depth` (at most [`MAX_DEPTH`]).
    pub(crate) fn with_max_depth(mut self, depth: usize) -> Loader {
        self.max_depth = depth.min(MAX_DEPTH);
        self
    }

    /// Whether a load went over the sweep file's budget.
    pub(crate) fn is_spent(&self) -> bool {
        self.spent.get()
    }

    /// Parses one YAML document, resolving merge keys (`<<: *defaults`). A document refused
    /// only for a flow collection's indentation is read as PyYAML reads it (`flow_indent`).
    pub(crate) fn load(&self, text: &str) -> Result<Value, SweepError> {
        match self.load_once(text) {
            Err(error) if is_indentation(&error) => match super::flow_indent::indent_flow_lines(text) {
                Some(indented) => {
                    let again = Loader::for_text(&indented).with_max_depth(self.max_depth);
                    let loaded = again.load_once(&indented).map_err(|_| error);
                    if again.is_spent() {
                        self.spent.set(true);
                    }
                    loaded
                }
                None => Err(error),
            },
            loaded => loaded,
        }
    }

    fn load_once(&self, text: &str) -> Result<Value, SweepError> {
        if self.is_spent() {
            return Err(budget_refusal("the sweep file's YAML budget is spent"));
        }
        let mut builder = Builder { loader: self, stack: Vec::new(), anchors: HashMap::new(), root: None };
        let mut documents = 0;
        for event in Parser::new_from_str(text) {
            let (event, span) = event.map_err(|error| syntax_error(error, self.max_depth))?;
            match event {
                Event::StreamStart | Event::StreamEnd | Event::DocumentEnd | Event::Nothing => {}
                Event::DocumentStart(_) => {
                    documents += 1;
                    if documents > 1 {
                        let message = "a sweep file holds one YAML document; found a second `---`";
                        return Err(at(span, message));
                    }
                }
                event => builder.event(event, span)?,
            }
        }
        let mut value = builder.root.unwrap_or(Value::Null);
        value.apply_merge().map_err(|error| invalid("(root)", format!("cannot apply a `<<` merge key: {error}")))?;
        Ok(value)
    }

    fn take_node(&self) -> Result<(), SweepError> {
        self.take(&self.nodes_left, 1).map_err(|()| {
            budget_refusal(&format!("the sweep file has more than {MAX_NODES} YAML nodes, counting what aliases copy"))
        })
    }

    fn take_bytes(&self, bytes: usize) -> Result<(), SweepError> {
        self.take(&self.bytes_left, bytes)
            .map_err(|()| budget_refusal("the sweep file expands to far more text than it contains (aliases?)"))
    }

    fn take(&self, left: &Cell<usize>, amount: usize) -> Result<(), ()> {
        match left.get().checked_sub(amount) {
            Some(rest) => {
                left.set(rest);
                Ok(())
            }
            None => {
                self.spent.set(true);
                Err(())
            }
        }
    }
}

fn budget_refusal(what: &str) -> SweepError {
    invalid("(root)", format!("{what}; refusing it"))
}

/// An open list or map, with the anchor and tag it will carry once complete.
struct Frame {
    node: Open,
    anchor: usize,
    tag: Option<String>,
}

enum Open {
    Sequence(Vec<Value>),
    /// The map so far, and a key waiting for its value (with where the key was).
    Mapping(Mapping, Option<(Value, Span)>),
}

/// A completed anchored node and what copying it costs.
struct Anchored {
    value: Value,
    nodes: usize,
    bytes: usize,
}

struct Builder<'a> {
    loader: &'a Loader,
    stack: Vec<Frame>,
    anchors: HashMap<usize, Anchored>,
    root: Option<Value>,
}

impl Builder<'_> {
    fn event(&mut self, event: Event<'_>, span: Span) -> Result<(), SweepError> {
        match event {
            Event::Scalar(text, style, anchor, tag) => {
                self.enter(span)?;
                self.loader.take_bytes(text.len())?;
                let value = self.scalar(&text, style, tag.as_deref(), span)?;
                self.complete(value, anchor, span)
            }
            Event::SequenceStart(anchor, tag) => {
                self.enter(span)?;
                self.stack.push(Frame { node: Open::Sequence(Vec::new()), anchor, tag: kept_tag(tag.as_deref()) });
                Ok(())
            }
            Event::MappingStart(anchor, tag) => {
                self.enter(span)?;
                let node = Open::Mapping(Mapping::new(), None);
                self.stack.push(Frame { node, anchor, tag: kept_tag(tag.as_deref()) });
                Ok(())
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let Some(frame) = self.stack.pop() else { return Ok(()) };
                let value = match frame.node {
                    Open::Sequence(items) => Value::Sequence(items),
                    Open::Mapping(map, _) => Value::Mapping(map),
                };
                self.complete(with_tag(value, frame.tag), frame.anchor, span)
            }
            Event::Alias(id) => {
                let Some(anchored) = self.anchors.get(&id) else {
                    return Err(at(span, "an alias refers to an anchor that is not defined before it"));
                };
                let (value, nodes, bytes) = (anchored.value.clone(), anchored.nodes, anchored.bytes);
                self.enter(span)?;
                // The alias node itself was counted by `enter`; its copy costs the rest.
                for _ in 1..nodes {
                    self.loader.take_node()?;
                }
                self.loader.take_bytes(bytes)?;
                self.place(value, span)
            }
            _ => Ok(()),
        }
    }

    /// Counts a new node and refuses it when it sits deeper than allowed.
    fn enter(&self, span: Span) -> Result<(), SweepError> {
        self.loader.take_node()?;
        let depth = self.stack.len();
        if depth > self.loader.max_depth {
            let max_depth = self.loader.max_depth;
            let message = format!(
                "the YAML is nested more than {max_depth} levels deep (line {}); refusing it",
                span.start.line()
            );
            return Err(invalid(self.path(), message));
        }
        Ok(())
    }

    fn complete(&mut self, value: Value, anchor: usize, span: Span) -> Result<(), SweepError> {
        if anchor != 0 {
            let (nodes, bytes) = size_of(&value);
            self.anchors.insert(anchor, Anchored { value: value.clone(), nodes, bytes });
        }
        self.place(value, span)
    }

    /// Puts a finished node into its parent (or makes it the document).
    fn place(&mut self, value: Value, span: Span) -> Result<(), SweepError> {
        let Some(frame) = self.stack.last_mut() else {
            self.root = Some(value);
            return Ok(());
        };
        match &mut frame.node {
            Open::Sequence(items) => items.push(value),
            Open::Mapping(map, pending) => match pending.take() {
                None => *pending = Some((value, span)),
                Some((key, key_span)) => match map.entry(key) {
                    serde_norway::mapping::Entry::Occupied(entry) => {
                        return Err(at(key_span, &duplicate_key(entry.key())))
                    }
                    serde_norway::mapping::Entry::Vacant(entry) => {
                        entry.insert(value);
                    }
                },
            },
        }
        Ok(())
    }

    /// The key path of the node being read, for messages.
    fn path(&self) -> String {
        let mut path = String::new();
        for frame in &self.stack {
            let step = match &frame.node {
                Open::Sequence(items) => items.len().to_string(),
                Open::Mapping(_, Some((key, _))) => key_text(key),
                Open::Mapping(_, None) => continue,
            };
            path = join(&path, &step);
        }
        if path.is_empty() {
            "(root)".to_owned()
        } else {
            path
        }
    }

    fn scalar(&self, text: &str, style: ScalarStyle, tag: Option<&EventTag>, span: Span) -> Result<Value, SweepError> {
        let core = tag.filter(|tag| tag.handle == CORE_SCHEMA).map(|tag| tag.suffix.as_str());
        let value = match core {
            Some("str") => Value::String(text.to_owned()),
            Some("null") => Value::Null,
            Some(kind @ ("int" | "float" | "bool")) => match self.resolve(text)? {
                value @ Value::Number(_) if kind == "int" && !is_float(&value) => value,
                value @ Value::Number(_) if kind == "float" => Value::Number(value.as_f64().unwrap_or(f64::NAN).into()),
                value @ Value::Bool(_) if kind == "bool" => value,
                _ => return Err(at(span, &format!("`{text}` is not a valid !!{kind}"))),
            },
            _ if style == ScalarStyle::Plain => self.resolve(text)?,
            _ => Value::String(text.to_owned()),
        };
        Ok(with_tag(value, kept_tag(tag)))
    }
}

impl Builder<'_> {
    fn resolve(&self, text: &str) -> Result<Value, SweepError> {
        resolve_plain(text).ok_or_else(|| {
            invalid(self.path(), format!("the integer {text} is too large: integers must fit in 64 bits"))
        })
    }
}

fn is_float(value: &Value) -> bool {
    matches!(value, Value::Number(number) if number.is_f64())
}

/// The tag to keep on a value: anything but the core schema's own types, written as in YAML.
fn kept_tag(tag: Option<&EventTag>) -> Option<String> {
    let tag = tag?;
    match tag.handle.as_str() {
        CORE_SCHEMA if matches!(tag.suffix.as_str(), "str" | "int" | "float" | "bool" | "null" | "seq" | "map") => None,
        CORE_SCHEMA => Some(format!("!!{}", tag.suffix)),
        "!" if tag.suffix.is_empty() => None,
        "!" => Some(format!("!{}", tag.suffix)),
        handle => Some(format!("!<{handle}{}>", tag.suffix)),
    }
}

fn with_tag(value: Value, tag: Option<String>) -> Value {
    match tag {
        Some(tag) => Value::Tagged(Box::new(TaggedValue { tag: Tag::new(tag), value })),
        None => value,
    }
}

/// Nodes and string bytes of a value, which is what an alias to it copies.
fn size_of(value: &Value) -> (usize, usize) {
    match value {
        Value::String(text) => (1, text.len()),
        Value::Sequence(items) => items.iter().map(size_of).fold((1, 0), |(n, b), (i, j)| (n + i, b + j)),
        Value::Mapping(map) => map.iter().fold((1, 0), |(n, b), (key, item)| {
            let (key_nodes, key_bytes) = size_of(key);
            let (item_nodes, item_bytes) = size_of(item);
            (n + key_nodes + item_nodes, b + key_bytes + item_bytes)
        }),
        Value::Tagged(tagged) => size_of(&tagged.value),
        _ => (1, 0),
    }
}

/// serde_norway's own wording for a repeated key.
fn duplicate_key(key: &Value) -> String {
    match key {
        Value::Null => "duplicate entry with null key".to_owned(),
        Value::Bool(flag) => format!("duplicate entry with key `{flag}`"),
        Value::Number(number) => format!("duplicate entry with key {number}"),
        Value::String(text) => format!("duplicate entry with key {text:?}"),
        Value::Sequence(_) | Value::Mapping(_) | Value::Tagged(_) => "duplicate entry in YAML map".to_owned(),
    }
}

fn at(span: Span, message: &str) -> SweepError {
    SweepError::Syntax { line: span.start.line().max(1), column: span.start.col() + 1, message: message.to_owned() }
}

/// Whether the scanner refused a line for its indentation.
fn is_indentation(error: &SweepError) -> bool {
    matches!(error, SweepError::Syntax { message, .. } if message == "invalid indentation")
}

fn syntax_error(error: ScanError, max_depth: usize) -> SweepError {
    let marker = error.marker();
    // The scanner's own guard (deeper than any depth we allow), met while it looks ahead
    // through deep flow nesting before the parser hands us the events.
    let message = match error.info() {
        info if info.contains("recursion limit exceeded") => {
            format!("the YAML is nested more than {max_depth} levels deep; refusing it")
        }
        info => info.to_owned(),
    };
    SweepError::Syntax { line: marker.line().max(1), column: marker.col() + 1, message }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<Value, SweepError> {
        Loader::for_text(text).load(text)
    }

    #[test]
    fn reads_the_same_values_as_serde_norway() {
        let text = "a: [1, -2, 3.5, x, 'y', null, true, ~, !tag {k: v}, !!str 5, 0x1F, 007, 1e3, .inf, -0o7]\n\
                    b: &b {c: [1]}\nd: *b\ne: |\n  block\nf: yes\ng: -.inf\nh: 1_000\n";
        let expected: Value = serde_norway::from_str(text).unwrap();
        assert_eq!(load(text).unwrap(), expected);
        assert_eq!(load("").unwrap(), Value::Null);
        assert_eq!(load("# only a comment\n").unwrap(), Value::Null);
    }

    #[test]
    fn python_tags_are_kept_as_written() {
        let value = load("betas: !!python/tuple [0.9, 0.999]\nnote: 'see !!python/tuple'\nx: !!int '7'").unwrap();
        let Value::Tagged(tagged) = &value["betas"] else { panic!("tag lost: {value:?}") };
        assert_eq!(tagged.tag.to_string(), "!!python/tuple");
        assert_eq!(value["note"], Value::String("see !!python/tuple".into()));
        assert_eq!(value["x"], Value::from(7));
        assert!(load("x: !!int abc").is_err());
    }

    #[test]
    fn errors_carry_a_one_based_position() {
        let SweepError::Syntax { line, column, .. } = load("a: [1, 2\nb: 3").unwrap_err() else { panic!() };
        assert!(line >= 2 && column >= 1, "{line}:{column}");
        assert!(matches!(load("a: b: c"), Err(SweepError::Syntax { line: 1, column: 5, .. })), "{:?}", load("a: b: c"));
        let error = load("a: 1\na: 2\n").unwrap_err();
        assert_eq!(error.to_string(), "invalid YAML at line 2 column 1: duplicate entry with key \"a\"");
        assert!(matches!(load("a: 1\n---\nb: 2\n"), Err(SweepError::Syntax { line: 2, .. })));
        assert!(load("a: *nope").is_err());
    }

    #[test]
    fn depth_is_refused_while_scanning() {
        let text = format!("a: {}{}", "[".repeat(100_000), "]".repeat(100_000));
        let error = load(&text).unwrap_err();
        assert!(error.to_string().contains("nested more than 64 levels deep"), "{error}");
        let text = format!("a: {}{}", "[".repeat(70), "]".repeat(70));
        let error = load(&text).unwrap_err();
        assert!(error.to_string().contains("nested more than 64 levels"), "{error}");
        // The root mapping and 63 lists enclose the scalar: 64 levels.
        let text = format!("a: {}1{}", "[".repeat(63), "]".repeat(63));
        assert!(load(&text).is_ok());
        let loader = Loader::for_text("").with_max_depth(3);
        assert!(loader.load("a: [[[1]]]").is_err());
        assert!(loader.load("a: [[1]]").is_ok());
    }

    #[test]
    fn aliases_count_against_one_budget() {
        let aliases = vec!["*a"; 2000].join(", ");
        let text = format!("x: &a [{}]\ny: [{aliases}]\n", vec!["0"; 1000].join(", "));
        let SweepError::Invalid { path, message } = load(&text).unwrap_err() else { panic!() };
        assert_eq!(path, "(root)");
        assert!(message.contains("200000 YAML nodes"), "{message}");
        let text = format!("x: &a [{}]\ny: [{}]\n", vec!["0"; 1000].join(", "), vec!["*a"; 190].join(", "));
        let loader = Loader::for_text(&text);
        assert!(loader.load(&text).is_ok());
        assert!(loader.load(&text).is_err(), "the second document shares the budget");
        assert!(loader.is_spent());
    }

    #[test]
    fn huge_integers_name_their_path() {
        let error = load("a:\n  b: [1, 2, 99999999999999999999999]\n").unwrap_err();
        assert_eq!(
            error,
            invalid("a.b.2", "the integer 99999999999999999999999 is too large: integers must fit in 64 bits")
        );
        assert_eq!(load("a: 18446744073709551615").unwrap()["a"].as_u64(), Some(u64::MAX));
        assert_eq!(load("a: -9223372036854775808").unwrap()["a"].as_i64(), Some(i64::MIN));
    }

    #[test]
    fn merge_keys_are_applied() {
        let value = load("base: &b {x: 1}\nrun:\n  <<: *b\n  y: 2\n").unwrap();
        assert_eq!(value["run"]["x"], Value::Number(1.into()));
    }
}
