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

/// `base` followed by enough `x_` that none of `texts` contains it: one `x_` more than the
/// longest run of them after any occurrence of `base`. If a text contained the result, the
/// `base` it starts with would be followed by a longer run. One pass over each text (a
/// crafted `__app_slot_x_x_...` used to cost a search per `x_`).
pub(crate) fn unused_prefix<'a>(base: &str, texts: impl IntoIterator<Item = &'a str>) -> String {
    let mut longest: Option<usize> = None;
    for text in texts {
        let mut from = 0;
        // Occurrences may overlap (`base` begins and ends with `_`), so search from the
        // next byte rather than past the match.
        while let Some(found) = text[from..].find(base) {
            let start = from + found;
            let after = &text.as_bytes()[start + base.len()..];
            let run = after.chunks_exact(2).take_while(|pair| *pair == b"x_").count();
            longest = Some(longest.map_or(run, |longest| longest.max(run)));
            from = start + 1;
            while !text.is_char_boundary(from) {
                from += 1;
            }
        }
    }
    let mut prefix = base.to_owned();
    if let Some(run) = longest {
        prefix.push_str(&"x_".repeat(run + 1));
    }
    prefix
}

/// Marker strings for one sweep, chosen so that the sweep file never contains them.
#[derive(Debug, Clone)]
pub(crate) struct SlotMarkers {
    prefix: String,
}

impl SlotMarkers {
    pub(crate) fn for_text(text: &str) -> SlotMarkers {
        SlotMarkers { prefix: unused_prefix("__app_slot_", [text]) }
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

    #[test]
    fn unused_prefixes_are_absent_from_every_text() {
        let texts = [
            "",
            "__app_slot_",
            "__app_slot_x_x_",
            "__app_slot__app_slot_x_x_x_",
            "é__app_slot_x___app_slot_x_x_",
            "__app_slot_x_x_x_x_ and __app_slot_",
        ];
        for text in texts {
            let prefix = unused_prefix("__app_slot_", [text]);
            assert!(!text.contains(&prefix), "{text:?} contains {prefix:?}");
        }
        assert_eq!(unused_prefix("__app_slot_", ["plain"]), "__app_slot_");
        assert_eq!(unused_prefix("__app_slot_", ["__app_slot__app_slot_x_x_x_"]), "__app_slot_x_x_x_x_");
        let all = unused_prefix("__b_", texts.iter().copied().chain(["__b_x_"]));
        assert_eq!(all, "__b_x_x_");
    }
}
