//! Job texts (params JSON, command, config) pre-split into literal text and value slots.
//!
//! A template is built once per sweep; rendering job `i` walks its pieces and appends the
//! chosen values' precomputed texts, which keeps a job in the sub-microsecond range.

use std::fmt::Write as _;

use super::json::json_string;
use super::shell::{push_quoted, Quote};
use super::{Rendered, Style};

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Piece {
    Text(String),
    /// The chosen value of slot `slot` (an axis or a sampled parameter).
    Slot(usize, Style),
    /// The job index.
    Index,
    /// The inner pieces rendered, then written as one piece of text for the quote context
    /// (W&B `--name=value` tokens).
    Quoted(Vec<Piece>, Quote),
    /// `text` (a W&B `--name` flag) written for the quote context when slot `slot`'s value is
    /// `true`, nothing when it is `false`, and `text=value` for any other value: what
    /// `${args_no_boolean_flags}` passes.
    Flag {
        slot: usize,
        text: String,
        quote: Quote,
    },
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Template {
    pieces: Vec<Piece>,
}

impl Template {
    pub(crate) fn text(text: &str) -> Template {
        let mut template = Template::default();
        template.push_text(text);
        template
    }

    /// Appends literal text, merged with a literal before it.
    pub(crate) fn push_text(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        match self.pieces.last_mut() {
            Some(Piece::Text(last)) => last.push_str(text),
            _ => self.pieces.push(Piece::Text(text.to_owned())),
        }
    }

    pub(crate) fn push(&mut self, piece: Piece) {
        match piece {
            Piece::Text(text) => self.push_text(&text),
            other => self.pieces.push(other),
        }
    }

    pub(crate) fn append(&mut self, other: Template) {
        other.pieces.into_iter().for_each(|piece| self.push(piece));
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    pub(crate) fn into_pieces(self) -> Vec<Piece> {
        self.pieces
    }

    /// Renders with `values[slot]` as each slot's value.
    pub(crate) fn render(&self, values: &[&Rendered], index: u64, out: &mut String) {
        render_pieces(&self.pieces, values, index, out);
    }
}

fn render_pieces(pieces: &[Piece], values: &[&Rendered], index: u64, out: &mut String) {
    for piece in pieces {
        match piece {
            Piece::Text(text) => out.push_str(text),
            Piece::Slot(slot, style) => values[*slot].write(*style, out),
            Piece::Index => {
                // Writing to a String cannot fail.
                let _ = write!(out, "{index}");
            }
            Piece::Quoted(inner, quote) => {
                let mut word = String::new();
                render_pieces(inner, values, index, &mut word);
                push_quoted(&word, *quote, out);
            }
            Piece::Flag { slot, text, quote } => match values[*slot].flag {
                Some(true) => push_quoted(text, *quote, out),
                Some(false) => {}
                None => push_quoted(&format!("{text}={}", values[*slot].python), *quote, out),
            },
        }
    }
}

/// The shape of a params object: keys in order, each a slot or a nested object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum JsonShape {
    Slot(usize),
    Object(Vec<(String, JsonShape)>),
}

impl JsonShape {
    /// A flat object `{"a": slot 0, "b": slot 1, ...}`.
    pub(crate) fn flat<'a>(names: impl IntoIterator<Item = &'a str>) -> JsonShape {
        let entries = names.into_iter().enumerate().map(|(slot, name)| (name.to_owned(), JsonShape::Slot(slot)));
        JsonShape::Object(entries.collect())
    }

    /// The template of this value's JSON text, keys escaped once here.
    pub(crate) fn template(&self) -> Template {
        let mut template = Template::default();
        self.write(&mut template);
        template
    }

    /// The template of the value as Python's `repr` writes a dict (a nested W&B parameter in
    /// `--name={'lr': 0.1}`).
    pub(crate) fn python_repr_template(&self) -> Template {
        let mut template = Template::default();
        self.write_python_repr(&mut template);
        template
    }

    fn write_python_repr(&self, template: &mut Template) {
        match self {
            JsonShape::Slot(slot) => template.push(Piece::Slot(*slot, Style::PythonRepr)),
            JsonShape::Object(entries) => {
                template.push_text("{");
                for (position, (key, shape)) in entries.iter().enumerate() {
                    if position > 0 {
                        template.push_text(", ");
                    }
                    template.push_text(&super::python::to_repr(&serde_norway::Value::String(key.clone())));
                    template.push_text(": ");
                    shape.write_python_repr(template);
                }
                template.push_text("}");
            }
        }
    }

    /// The template of the value as Python's `json.dumps` writes it (W&B's `${args_json}`).
    pub(crate) fn python_template(&self) -> Template {
        let mut template = Template::default();
        self.write_python(&mut template);
        template
    }

    fn write(&self, template: &mut Template) {
        match self {
            JsonShape::Slot(slot) => template.push(Piece::Slot(*slot, Style::Json)),
            JsonShape::Object(entries) => {
                template.push_text("{");
                for (position, (key, shape)) in entries.iter().enumerate() {
                    if position > 0 {
                        template.push_text(",");
                    }
                    template.push_text(&json_string(key));
                    template.push_text(":");
                    shape.write(template);
                }
                template.push_text("}");
            }
        }
    }

    fn write_python(&self, template: &mut Template) {
        match self {
            JsonShape::Slot(slot) => template.push(Piece::Slot(*slot, Style::PythonJson)),
            JsonShape::Object(entries) => {
                template.push_text("{");
                for (position, (key, shape)) in entries.iter().enumerate() {
                    if position > 0 {
                        template.push_text(", ");
                    }
                    template.push_text(&super::python::json_dumps(&serde_norway::Value::String(key.clone())));
                    template.push_text(": ");
                    shape.write_python(template);
                }
                template.push_text("}");
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::sweep::load::Loader;

    /// Each YAML text loaded and rendered as a parameter value.
    pub(crate) fn values(texts: &[&str]) -> Vec<Rendered> {
        let loader = Loader::for_text("");
        texts.iter().map(|text| Rendered::new(&loader.load(text).unwrap()).unwrap()).collect()
    }

    /// The template rendered with `values` for job `index`.
    pub(crate) fn render(template: &Template, values: &[Rendered], index: u64) -> String {
        let refs: Vec<&Rendered> = values.iter().collect();
        let mut out = String::new();
        template.render(&refs, index, &mut out);
        out
    }

    #[test]
    fn json_shape_nests_and_escapes_keys() {
        let shape = JsonShape::Object(vec![
            ("a\"b".into(), JsonShape::Slot(0)),
            ("opt".into(), JsonShape::Object(vec![("lr".into(), JsonShape::Slot(1))])),
            ("empty".into(), JsonShape::Object(vec![])),
        ]);
        let out = render(&shape.template(), &values(&["'x y'", "0.5"]), 0);
        assert_eq!(out, r#"{"a\"b":"x y","opt":{"lr":0.5},"empty":{}}"#);
        let json: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(json["opt"]["lr"], 0.5);
    }

    #[test]
    fn quoted_pieces_become_one_shell_word() {
        let mut template = Template::default();
        template.push(Piece::Quoted(vec![Piece::Text("--name=".into()), Piece::Slot(0, Style::Python)], Quote::None));
        template.push_text(" \"");
        template.push(Piece::Quoted(vec![Piece::Text("--name=".into()), Piece::Slot(0, Style::Python)], Quote::Double));
        template.push_text("\"");
        assert_eq!(render(&template, &values(&["'a b'"]), 0), "'--name=a b' \"--name=a b\"");
        assert_eq!(render(&template, &values(&["ab"]), 0), "--name=ab \"--name=ab\"");
        assert_eq!(render(&template, &values(&["'$x'"]), 0), "'--name=$x' \"--name=\\$x\"");
    }
}
