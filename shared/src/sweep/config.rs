//! Resolved config files as templates: the base document is written once with a marker
//! string where each axis goes, and the written text is split at the markers.
//!
//! Serialising a whole YAML document per job would cost tens of microseconds; splicing a
//! value's one-line flow text after `key: ` costs nothing and reads back as the same
//! document, since axes only ever sit at mapping values.

use serde_norway::Value;

use super::error::SweepError;
use super::render::Style;
use super::template::{Piece, Template};
use super::yaml::Loader;

/// Marker strings for one sweep, chosen so that the sweep file never contains them.
#[derive(Debug, Clone)]
pub(crate) struct SlotMarkers {
    prefix: String,
}

impl SlotMarkers {
    pub(crate) fn for_text(text: &str) -> SlotMarkers {
        let mut prefix = "__app_slot_".to_owned();
        while text.contains(prefix.as_str()) {
            prefix.push_str("x_");
        }
        SlotMarkers { prefix }
    }

    /// The placeholder to put in the document where slot `slot`'s value goes; a plain
    /// scalar, so the writer keeps it on the key's line.
    pub(crate) fn marker(&self, slot: usize) -> Value {
        Value::String(format!("{}{slot}__", self.prefix))
    }

    /// Writes `document` and splits it at the markers of slots `0..slots`.
    pub(crate) fn template(&self, loader: &Loader, document: &Value, slots: usize) -> Result<Template, SweepError> {
        let text = loader.to_yaml(document)?;
        let mut template = Template::default();
        let mut rest = text.as_str();
        while let Some(start) = rest.find(self.prefix.as_str()) {
            let after = &rest[start + self.prefix.len()..];
            let digits = after.find(|c: char| !c.is_ascii_digit()).unwrap_or(after.len());
            let slot =
                after[..digits].parse::<usize>().ok().filter(|slot| *slot < slots && after[digits..].starts_with("__"));
            template.push_text(&rest[..start]);
            match slot {
                Some(slot) => {
                    template.push(Piece::Slot(slot, Style::Yaml));
                    rest = &after[digits + 2..];
                }
                // Cannot happen (the prefix is not in the input), but text stays text.
                None => {
                    template.push_text(&self.prefix);
                    rest = after;
                }
            }
        }
        template.push_text(rest);
        Ok(template)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::render::Rendered;

    #[test]
    fn spliced_values_read_back_as_the_resolved_document() {
        let source = "model:\n  dims: [[1, 2], [3]]\n  name: x\nlr: [0.1, 0.2]\n";
        let loader = Loader::for_text(source);
        let markers = SlotMarkers::for_text(source);
        let mut document = loader.load(source).unwrap();
        document["model"]["dims"] = markers.marker(0);
        document["lr"] = markers.marker(1);
        let template = markers.template(&loader, &document, 2).unwrap();

        let chosen: Vec<Rendered> = ["{a: [1, 2], b: 'x: y'}", "0.2"]
            .iter()
            .map(|text| Rendered::new(&loader.load(text).unwrap(), &loader).unwrap())
            .collect();
        let refs: Vec<&Rendered> = chosen.iter().collect();
        let mut text = String::new();
        template.render(&refs, 0, &mut text);

        let mut expected = loader.load(source).unwrap();
        expected["model"]["dims"] = loader.load("{a: [1, 2], b: 'x: y'}").unwrap();
        expected["lr"] = loader.load("0.2").unwrap();
        assert_eq!(loader.load(&text).unwrap(), expected, "{text}");
    }

    #[test]
    fn markers_avoid_text_already_in_the_file() {
        let markers = SlotMarkers::for_text("note: __app_slot_0__");
        assert_ne!(markers.marker(0), Value::String("__app_slot_0__".into()));
    }
}
