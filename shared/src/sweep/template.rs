//! Job texts (params JSON, command, config) pre-split into literal text and value slots.
//!
//! A template is built once per sweep; rendering job `i` walks its pieces and appends the
//! chosen values' precomputed texts, which keeps a job in the sub-microsecond range.

use std::fmt::Write as _;

use super::render::{shell_word, Rendered, Style};
use super::yaml::json_string;

/// `{config}` in a command: the worker sets `APP_CONFIG` to the resolved config file.
pub(crate) const CONFIG_REF: &str = "\"$APP_CONFIG\"";
/// `{sweep}` in a command.
pub(crate) const SWEEP_REF: &str = "\"$APP_SWEEP\"";

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Piece {
    Text(String),
    /// The chosen value of slot `slot` (an axis or a sampled parameter).
    Slot(usize, Style),
    /// The job index.
    Index,
    /// The inner pieces rendered, then made one shell word (W&B `--name=value` tokens).
    Quoted(Vec<Piece>),
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
            Piece::Slot(slot, style) => out.push_str(values[*slot].text(*style)),
            Piece::Index => {
                // Writing to a String cannot fail.
                let _ = write!(out, "{index}");
            }
            Piece::Quoted(inner) => {
                let mut word = String::new();
                render_pieces(inner, values, index, &mut word);
                // Rendered values were checked for NUL bytes, so quoting cannot fail.
                out.push_str(&shell_word(&word).unwrap_or_default());
            }
        }
    }
}

/// Splits a command at its placeholders. `{config}`, `{sweep}` and `{index}` are special
/// and win over a parameter of the same name; `{name}` is a parameter when `resolve` knows
/// it. Everything else stays as written, including `${NAME}` (a shell variable, never a
/// placeholder) and braces in `awk '{print $1}'`.
pub(crate) fn command_template(command: &str, resolve: impl Fn(&str) -> Option<usize>) -> Template {
    let mut template = Template::default();
    let mut rest = command;
    while let Some(open) = rest.find('{') {
        let after = &rest[open + 1..];
        let close = after.find(['{', '}']).filter(|&close| after.as_bytes()[close] == b'}');
        let name = close.map(|close| &after[..close]);
        let after_dollar = rest[..open].ends_with('$');
        let piece = match name {
            _ if after_dollar => None,
            Some("config") => Some(Piece::Text(CONFIG_REF.to_owned())),
            Some("sweep") => Some(Piece::Text(SWEEP_REF.to_owned())),
            Some("index") => Some(Piece::Index),
            Some(name) => resolve(name).map(|slot| Piece::Slot(slot, Style::Shell)),
            None => None,
        };
        match (piece, close) {
            (Some(piece), Some(close)) => {
                template.push_text(&rest[..open]);
                template.push(piece);
                rest = &after[close + 1..];
            }
            _ => {
                template.push_text(&rest[..=open]);
                rest = after;
            }
        }
    }
    template.push_text(rest);
    template
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::yaml::Loader;

    fn values(texts: &[&str]) -> Vec<Rendered> {
        let loader = Loader::for_text("");
        texts.iter().map(|text| Rendered::new(&loader.load(text).unwrap(), &loader).unwrap()).collect()
    }

    fn render(template: &Template, values: &[Rendered], index: u64) -> String {
        let refs: Vec<&Rendered> = values.iter().collect();
        let mut out = String::new();
        template.render(&refs, index, &mut out);
        out
    }

    #[test]
    fn placeholders_are_replaced_and_other_braces_kept() {
        let resolve = |name: &str| ["lr", "hidden", "config"].iter().position(|known| *known == name);
        let template = command_template(
            "run --lr {lr} --h {hidden} -c {config} -i {index} -s {sweep} {nope} ${lr} ${HOME} awk '{print $1}' {{lr}} {",
            resolve,
        );
        let out = render(&template, &values(&["0.001", "[128, 64]", "x"]), 7);
        assert_eq!(
            out,
            "run --lr 0.001 --h [128,64] -c \"$APP_CONFIG\" -i 7 -s \"$APP_SWEEP\" {nope} ${lr} ${HOME} awk '{print $1}' {0.001} {"
        );
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
        template.push(Piece::Quoted(vec![Piece::Text("--name=".into()), Piece::Slot(0, Style::Raw)]));
        assert_eq!(render(&template, &values(&["'a b'"]), 0), "'--name=a b'");
        assert_eq!(render(&template, &values(&["ab"]), 0), "--name=ab");
    }
}
