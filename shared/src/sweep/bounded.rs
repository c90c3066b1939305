//! Reading a YAML document into a [`Value`] with a budget.
//!
//! serde_norway expands aliases by replaying the anchored node's events, so a 30 KB file of
//! `*a` aliases to a 6,000-element anchor becomes 36 million values (seconds and gigabytes).
//! Its own limit (100 replays per event) stops only the classic billion laughs. Here every
//! node the deserializer hands over, through aliases too, is counted, and so is every byte
//! of string; past the budget the document is refused before it is built.
//!
//! The same visitor knows where it is in the document, so an integer too large for 64 bits
//! is reported at its key path instead of as serde's "invalid type ... as u128".

use std::cell::{Cell, RefCell};
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, EnumAccess, MapAccess, SeqAccess, VariantAccess, Visitor};
use serde_norway::value::{Tag, TaggedValue};
use serde_norway::{Mapping, Value};

use super::error::{invalid, SweepError};
use super::yaml::{join, key_text};

/// The most nodes a document may expand to, counting each alias's copy.
pub(crate) const MAX_NODES: usize = 1_000_000;
/// The deepest nesting of lists and maps a sweep file may be allowed (the YAML reader itself
/// stops at 128, with a terser message), and the default. Sweep files need a handful.
pub const MAX_DEPTH: usize = 100;
pub const DEFAULT_DEPTH: usize = 64;
/// String bytes allowed beyond twice the file's own length (escapes can lengthen a string
/// a little: `\L` is two characters in the file and three bytes in the string).
const SPARE_STRING_BYTES: usize = 64 << 20;

/// What is left of a sweep file's budget, shared by every document parsed for it (the file,
/// then the list-looking strings that the CVLab form parses in turn).
#[derive(Debug, Clone)]
pub(crate) struct Allowance {
    nodes_left: Cell<usize>,
    bytes_left: Cell<usize>,
    /// Whether a document has gone over the budget.
    spent: Cell<bool>,
    /// The deepest nesting accepted.
    max_depth: usize,
}

impl Allowance {
    /// The budget for a sweep file of `text`.
    pub(crate) fn for_text(text: &str) -> Allowance {
        Allowance {
            nodes_left: Cell::new(MAX_NODES),
            bytes_left: Cell::new(text.len().saturating_mul(2).saturating_add(SPARE_STRING_BYTES)),
            spent: Cell::new(false),
            max_depth: DEFAULT_DEPTH,
        }
    }

    /// The same budget with another nesting limit (capped at [`MAX_DEPTH`]).
    pub(crate) fn with_max_depth(mut self, depth: usize) -> Allowance {
        self.max_depth = depth.min(MAX_DEPTH);
        self
    }

    /// Whether a document parsed with this allowance was refused for going over it.
    pub(crate) fn is_spent(&self) -> bool {
        self.spent.get()
    }
}

/// Parses one YAML document of `text`, spending `allowance`. `Err(Ok(refusal))` is a budget
/// or value refusal with its own message; `Err(Err(error))` is serde_norway's (a syntax
/// error, say).
pub(crate) fn parse(text: &str, allowance: &Allowance) -> Result<Value, Result<SweepError, serde_norway::Error>> {
    let budget = Budget { allowance, refusal: RefCell::new(None) };
    let result = Node { budget: &budget, at: None, depth: 0 }.deserialize(serde_norway::Deserializer::from_str(text));
    // A refusal wins over the error serde_norway built around it.
    match (result, budget.refusal.into_inner()) {
        (_, Some(refusal)) => Err(Ok(refusal)),
        (Ok(value), None) => Ok(value),
        (Err(error), None) => Err(Err(error)),
    }
}

struct Budget<'a> {
    allowance: &'a Allowance,
    /// Set when the visitor refuses the document; the error it returns is only a carrier.
    refusal: RefCell<Option<SweepError>>,
}

impl Budget<'_> {
    fn refuse<E: de::Error>(&self, refusal: SweepError) -> E {
        let message = refusal.to_string();
        self.refusal.borrow_mut().get_or_insert(refusal);
        E::custom(message)
    }

    fn take_node<E: de::Error>(&self) -> Result<(), E> {
        match self.allowance.nodes_left.get().checked_sub(1) {
            Some(left) => {
                self.allowance.nodes_left.set(left);
                Ok(())
            }
            None => {
                self.allowance.spent.set(true);
                let message =
                    format!("the sweep file expands to more than {MAX_NODES} YAML nodes (aliases?); refusing it");
                Err(self.refuse(invalid("(root)", message)))
            }
        }
    }

    fn take_bytes<E: de::Error>(&self, bytes: usize) -> Result<(), E> {
        match self.allowance.bytes_left.get().checked_sub(bytes) {
            Some(left) => {
                self.allowance.bytes_left.set(left);
                Ok(())
            }
            None => {
                self.allowance.spent.set(true);
                let message = "the sweep file expands to far more text than it contains (aliases?); refusing it";
                Err(self.refuse(invalid("(root)", message)))
            }
        }
    }
}

/// Where a node sits: a linked list through the stack frames of its parents, so that
/// tracking the path costs nothing until an error needs it.
struct Link<'a> {
    parent: Option<&'a Link<'a>>,
    step: Step<'a>,
}

enum Step<'a> {
    Key(&'a Value),
    Index(usize),
}

fn path_of(at: Option<&Link<'_>>) -> String {
    let mut steps = Vec::new();
    let mut current = at;
    while let Some(link) = current {
        steps.push(match link.step {
            Step::Key(key) => key_text(key),
            Step::Index(index) => index.to_string(),
        });
        current = link.parent;
    }
    let path = steps.iter().rev().fold(String::new(), |path, step| join(&path, step));
    if path.is_empty() {
        "(root)".to_owned()
    } else {
        path
    }
}

/// One node to read: both the seed and the visitor.
#[derive(Clone, Copy)]
struct Node<'b> {
    budget: &'b Budget<'b>,
    at: Option<&'b Link<'b>>,
    /// Lists and maps around this node.
    depth: usize,
}

impl<'de> DeserializeSeed<'de> for Node<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        self.budget.take_node()?;
        let max_depth = self.budget.allowance.max_depth;
        if self.depth > max_depth {
            let message = format!("the YAML is nested more than {max_depth} levels deep; refusing it");
            return Err(self.budget.refuse(invalid(path_of(self.at), message)));
        }
        deserializer.deserialize_any(self)
    }
}

impl Node<'_> {
    fn too_large<E: de::Error>(self, number: &dyn fmt::Display) -> E {
        let message = format!("the integer {number} is too large: integers must fit in 64 bits");
        self.budget.refuse(invalid(path_of(self.at), message))
    }
}

impl<'de> Visitor<'de> for Node<'_> {
    type Value = Value;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("any YAML value")
    }

    fn visit_bool<E: de::Error>(self, flag: bool) -> Result<Value, E> {
        Ok(Value::Bool(flag))
    }

    fn visit_i64<E: de::Error>(self, number: i64) -> Result<Value, E> {
        Ok(Value::Number(number.into()))
    }

    fn visit_u64<E: de::Error>(self, number: u64) -> Result<Value, E> {
        Ok(Value::Number(number.into()))
    }

    fn visit_i128<E: de::Error>(self, number: i128) -> Result<Value, E> {
        match i64::try_from(number) {
            Ok(number) => Ok(Value::Number(number.into())),
            Err(_) => Err(self.too_large(&number)),
        }
    }

    fn visit_u128<E: de::Error>(self, number: u128) -> Result<Value, E> {
        match u64::try_from(number) {
            Ok(number) => Ok(Value::Number(number.into())),
            Err(_) => Err(self.too_large(&number)),
        }
    }

    fn visit_f64<E: de::Error>(self, number: f64) -> Result<Value, E> {
        Ok(Value::Number(number.into()))
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Value, E> {
        self.budget.take_bytes(text.len())?;
        Ok(Value::String(text.to_owned()))
    }

    fn visit_string<E: de::Error>(self, text: String) -> Result<Value, E> {
        self.budget.take_bytes(text.len())?;
        Ok(Value::String(text))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        self.deserialize(deserializer)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<Value, A::Error> {
        let mut sequence = Vec::new();
        loop {
            let link = Link { parent: self.at, step: Step::Index(sequence.len()) };
            match items.next_element_seed(Node { budget: self.budget, at: Some(&link), depth: self.depth + 1 })? {
                Some(item) => sequence.push(item),
                None => return Ok(Value::Sequence(sequence)),
            }
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut entries: A) -> Result<Value, A::Error> {
        let mut mapping = Mapping::new();
        while let Some(key) = entries.next_key_seed(self)? {
            if mapping.contains_key(&key) {
                return Err(de::Error::custom(duplicate_key(&key)));
            }
            let link = Link { parent: self.at, step: Step::Key(&key) };
            let value =
                entries.next_value_seed(Node { budget: self.budget, at: Some(&link), depth: self.depth + 1 })?;
            mapping.insert(key, value);
        }
        Ok(Value::Mapping(mapping))
    }

    /// serde_norway hands a tagged node (`!foo x`) over as an enum: the tag, then the value.
    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<Value, A::Error> {
        let (tag, contents) = data.variant_seed(TagSeed)?;
        let value = contents.newtype_variant_seed(self)?;
        Ok(Value::Tagged(Box::new(TaggedValue { tag, value })))
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

struct TagSeed;

impl<'de> DeserializeSeed<'de> for TagSeed {
    type Value = Tag;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Tag, D::Error> {
        deserializer.deserialize_string(self)
    }
}

impl<'de> Visitor<'de> for TagSeed {
    type Value = Tag;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a YAML tag string")
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Tag, E> {
        if text.is_empty() {
            return Err(E::custom("empty YAML tag is not allowed"));
        }
        Ok(Tag::new(text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Value, Result<SweepError, serde_norway::Error>> {
        super::parse(text, &Allowance::for_text(text))
    }

    fn refusal(text: &str) -> SweepError {
        match parse(text) {
            Err(Ok(refusal)) => refusal,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn reads_the_same_values_as_serde_norway() {
        let text = "a: [1, -2, 3.5, x, 'y', null, true, ~, !tag {k: v}, !!str 5]\nb: &b {c: [1]}\nd: *b\n";
        let expected: Value = serde_norway::from_str(text).unwrap();
        assert_eq!(parse(text).unwrap(), expected);
        assert_eq!(parse("").unwrap(), serde_norway::from_str::<Value>("").unwrap());
    }

    #[test]
    fn duplicate_keys_keep_serde_norway_wording() {
        let ours = parse("a: 1\na: 2\n").unwrap_err().unwrap_err().to_string();
        let theirs = serde_norway::from_str::<Value>("a: 1\na: 2\n").unwrap_err().to_string();
        assert_eq!(ours, theirs);
    }

    #[test]
    fn aliases_count_against_the_budget() {
        let aliases = vec!["*a"; 2000].join(", ");
        let text = format!("x: &a [{}]\ny: [{aliases}]\n", vec!["0"; 1000].join(", "));
        let SweepError::Invalid { path, message } = refusal(&text) else { panic!() };
        assert_eq!(path, "(root)");
        assert!(message.contains("1000000 YAML nodes"), "{message}");
        // Just under the budget is fine.
        let text = format!("x: &a [{}]\ny: [{}]\n", vec!["0"; 1000].join(", "), vec!["*a"; 990].join(", "));
        assert!(parse(&text).is_ok());
        // The budget is for all documents parsed with one allowance.
        let allowance = Allowance::for_text(&text);
        assert!(super::parse(&text, &allowance).is_ok());
        assert!(matches!(super::parse(&text, &allowance), Err(Ok(_))));
    }

    #[test]
    fn huge_integers_name_their_path() {
        let error = refusal("a:\n  b: [1, 2, 99999999999999999999999]\n");
        assert_eq!(
            error,
            invalid("a.b.2", "the integer 99999999999999999999999 is too large: integers must fit in 64 bits")
        );
        let error = refusal("-99999999999999999999999");
        assert!(matches!(error, SweepError::Invalid { ref path, .. } if path == "(root)"), "{error:?}");
        assert_eq!(parse("a: 18446744073709551615").unwrap()["a"].as_u64(), Some(u64::MAX));
        assert_eq!(parse("a: -9223372036854775808").unwrap()["a"].as_i64(), Some(i64::MIN));
    }
}
