//! Flow collections written as PyYAML reads them. YAML 1.2 wants every line of a flow
//! collection (`[...]`, `{...}`) indented deeper than the block it sits in; PyYAML, and so
//! CVLab-Kit and Hydra users, accept a closing `]` (or an item) at the block's own column:
//!
//! ```yaml
//! ablation_name: [
//!   "a",  # c
//!   "b"
//! ]
//! ```
//!
//! When the strict parser refuses a file for its indentation, the loader tries again once with
//! every line that starts inside a flow collection indented one column past the line that
//! opened it ([`indent_flow_lines`]); a file that is still refused gets the first refusal.

/// `text` with each line that starts inside a flow collection indented at least one column
/// past the line that opened the outermost one; `None` when no line needed it. Quotes and
/// comments are followed so that brackets inside them do not count.
pub(crate) fn indent_flow_lines(text: &str) -> Option<String> {
    let mut out = String::with_capacity(text.len() + 64);
    let mut depth = 0usize;
    // The indentation of the line holding the outermost open bracket.
    let mut opened_at = 0usize;
    let mut changed = false;
    let mut quote: Option<char> = None;
    for line in text.split_inclusive('\n') {
        let indent = line.len() - line.trim_start_matches(' ').len();
        let content = line.trim_start_matches(' ');
        let starts_inside = depth > 0 && quote.is_none();
        if starts_inside && indent <= opened_at && !content.trim().is_empty() {
            out.extend(std::iter::repeat_n(' ', opened_at + 1 - indent));
            changed = true;
        }
        out.push_str(line);
        let mut previous = ' ';
        let mut chars = content.chars().peekable();
        while let Some(c) = chars.next() {
            match quote {
                Some('"') if c == '\\' => {
                    chars.next();
                }
                Some(q) if c == q => {
                    // '' inside single quotes is an escaped quote.
                    if q == '\'' && chars.peek() == Some(&'\'') {
                        chars.next();
                    } else {
                        quote = None;
                    }
                }
                Some(_) => {}
                None => match c {
                    '#' if previous == ' ' || previous == '\t' => break,
                    '"' | '\'' if depth > 0 || previous == ' ' || previous == ':' => quote = Some(c),
                    '[' | '{' => {
                        if depth == 0 {
                            opened_at = indent;
                        }
                        depth += 1;
                    }
                    ']' | '}' => depth = depth.saturating_sub(1),
                    _ => {}
                },
            }
            previous = c;
        }
        // A flow collection does not span a plain block: a quote left open at the end of a
        // line outside brackets is a plain scalar's, not a string's.
        if depth == 0 {
            quote = None;
        }
    }
    changed.then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closing_brackets_at_the_blocks_column_are_indented_past_their_opening_line() {
        let cvlab = "ablation_name: [\n  \"a\",  # c\n  \"b\"\n]\nlr: 0.1\n";
        assert_eq!(indent_flow_lines(cvlab).unwrap(), "ablation_name: [\n  \"a\",  # c\n  \"b\"\n ]\nlr: 0.1\n");
        let nested = "model:\n  sizes: [\n    1,\n    2,\n  ]\n  other: {\n  a: 1\n  }\n";
        assert_eq!(
            indent_flow_lines(nested).unwrap(),
            "model:\n  sizes: [\n    1,\n    2,\n   ]\n  other: {\n   a: 1\n   }\n"
        );
        // Brackets in quotes and comments do not count; a well-indented file is left alone.
        assert_eq!(indent_flow_lines("a: \"[\"\nb: 1 # [\nc: [1,\n  2]\n"), None);
        assert_eq!(indent_flow_lines("a: 'it''s ['\nb: 1\n"), None);
    }
}
