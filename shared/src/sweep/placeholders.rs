//! Native `{name}` placeholders in a command: split into literal text and value slots, each
//! value written for the quotes around its placeholder (see [`super::render::shell`]).

use super::error::{invalid, SweepError};
use super::render::shell::{env_ref, Quote, QuoteState};
use super::render::template::{Piece, Template};
use super::render::Style;

/// `{config}` in a command outside quotes: the worker sets `APP_CONFIG` to the resolved
/// config file.
pub(crate) const CONFIG_REF: &str = "\"$APP_CONFIG\"";

/// Splits a command at its placeholders. `{config}`, `{sweep}` and `{index}` are special
/// and win over a parameter of the same name; `{name}` is a parameter when `resolve` knows
/// it, and its value is written for the quotes around the placeholder (see
/// [`super::shell`]). Other braces stay as written: `${NAME}` (a shell variable, never a
/// placeholder), `{}`, `{a,b}`, JSON, and anything inside single quotes such as
/// `awk '{print $1}'`. But a `{word}` that looks like a placeholder and names no parameter
/// is refused at `command`: it is a typo far more often than a literal. `names` are the
/// parameters, for that message.
pub(crate) fn command_template(
    command: &str,
    names: &[&str],
    resolve: impl Fn(&str) -> Option<usize>,
) -> Result<Template, SweepError> {
    let mut template = Template::default();
    let mut shell = QuoteState::default();
    let mut rest = command;
    while let Some(open) = rest.find('{') {
        let before = &rest[..open];
        template.push_text(before);
        shell.feed(before);
        let quote = shell.quote();
        let after = &rest[open + 1..];
        let close = after.find(['{', '}']).filter(|&close| after.as_bytes()[close] == b'}');
        let name = close.map(|close| &after[..close]);
        let piece = match name {
            _ if before.ends_with('$') => None,
            Some("config") => Some(Piece::Text(env_ref("APP_CONFIG", quote))),
            Some("sweep") => Some(Piece::Text(env_ref("APP_SWEEP", quote))),
            Some("index") => Some(Piece::Index),
            Some(name) => match resolve(name) {
                Some(slot) => Some(Piece::Slot(slot, Style::Shell(quote))),
                None if quote != Quote::Single && looks_like_placeholder(name) => {
                    return Err(unknown_placeholder(name, names))
                }
                None => None,
            },
            None => None,
        };
        match (piece, close) {
            (Some(piece), Some(close)) => {
                template.push(piece);
                shell.after_value();
                rest = &after[close + 1..];
            }
            _ => {
                template.push_text("{");
                shell.feed("{");
                rest = after;
            }
        }
    }
    template.push_text(rest);
    Ok(template)
}

/// Letters, digits, `_` and `.`, starting with a letter: what a parameter name looks like.
fn looks_like_placeholder(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(char::is_alphabetic) && chars.all(|c| c.is_alphanumeric() || c == '_' || c == '.')
}

fn unknown_placeholder(name: &str, names: &[&str]) -> SweepError {
    const SHOWN: usize = 20;
    let known = if names.is_empty() {
        "this sweep has no parameters".to_owned()
    } else {
        let mut list = names.iter().take(SHOWN).copied().collect::<Vec<_>>().join(", ");
        if names.len() > SHOWN {
            list.push_str(&format!(", ... ({} in all)", names.len()));
        }
        format!("parameters are: {list}")
    };
    let message = format!(
        "unknown placeholder `{{{name}}}`; {known} (and {{config}}, {{index}}, {{sweep}}); \
         braces inside single quotes are left as they are"
    );
    invalid("command", message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::render::template::tests::{render, values};

    const NAMES: [&str; 3] = ["lr", "hidden", "config"];

    fn template(command: &str) -> Result<Template, SweepError> {
        command_template(command, &NAMES, |name| NAMES.iter().position(|known| *known == name))
    }

    #[test]
    fn placeholders_are_replaced_and_other_braces_kept() {
        let template = template(
            "run --lr {lr} --h {hidden} -c {config} -i {index} -s {sweep} '{nope}' ${lr} ${HOME} awk '{print $1}' {{lr}} {",
        )
        .unwrap();
        let out = render(&template, &values(&["0.001", "[128, 64]", "x"]), 7);
        assert_eq!(
            out,
            "run --lr 0.001 --h '[128,64]' -c \"$APP_CONFIG\" -i 7 -s \"$APP_SWEEP\" '{nope}' ${lr} ${HOME} awk '{print $1}' {0.001} {"
        );
    }

    #[test]
    fn placeholders_are_written_for_their_quotes() {
        let template = template("a {hidden} \"{hidden} {config}\" '{hidden} {config}' \"$(b '{lr}')\"").unwrap();
        let out = render(&template, &values(&["'it''s'", "'x \"$y\"'", "x"]), 0);
        assert_eq!(
            out,
            "a 'x \"$y\"' \"x \\\"\\$y\\\" ${APP_CONFIG}\" 'x \"$y\" '\"$APP_CONFIG\"'' \"$(b 'it'\\''s')\""
        );
    }

    #[test]
    fn unknown_placeholders_are_refused_outside_single_quotes() {
        for command in ["run {lrr}", "run \"{lrr}\"", "run \"$(x '{lr}' {opt.lr})\"", "{Lr2}"] {
            let error = template(command).unwrap_err();
            assert!(matches!(error, SweepError::Invalid { ref path, .. } if path == "command"), "{command}");
            assert!(error.to_string().contains("parameters are: lr, hidden, config"), "{error}");
        }
        for command in ["run '{lrr}'", "run ${lrr}", "{1x} {_x} {x-y} {a b} {} {\"a\": 1}", "\"$(x '{lrr}')\""] {
            assert!(template(command).is_ok(), "{command}");
        }
        let many: Vec<String> = (0..25).map(|n| format!("p{n}")).collect();
        let names: Vec<&str> = many.iter().map(String::as_str).collect();
        let error = command_template("{q}", &names, |_| None).unwrap_err().to_string();
        assert!(error.contains("p19, ... (25 in all)"), "{error}");
        let error = command_template("{q}", &[], |_| None).unwrap_err().to_string();
        assert!(error.contains("this sweep has no parameters"), "{error}");
    }
}
