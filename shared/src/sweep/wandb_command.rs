//! The command of a W&B sweep, as W&B's agent builds it.
//!
//! The agent (wandb `agents/pyagent`, `sdk/launch/sweeps/utils.py`) takes `command:` as a list,
//! `str()`s each item, replaces an item that is exactly `${macro}` by that macro's list of
//! arguments, replaces `${envvar:NAME}` anywhere in an item by the variable's value (the name
//! itself when unset), and runs the list as an argv with no shell. Its macros:
//!
//! | macro | arguments |
//! |---|---|
//! | `${env}` | `/usr/bin/env` |
//! | `${interpreter}` | `python` |
//! | `${program}` | the `program` key |
//! | `${args}` | `--name=value` per top-level parameter |
//! | `${args_no_hyphens}` | `name=value` |
//! | `${args_no_equals}` | `--name`, `value` (two arguments) |
//! | `${args_no_boolean_flags}` | `--name=value`, but `--name` for `True` and nothing for `False` |
//! | `${args_json}` | one argument: `json.dumps` of the parameters |
//! | `${args_json_file}` | the path of a file holding that JSON (here `$APP_CONFIG`) |
//!
//! `value` is Python's `str()` of the value (`True`, `128`, `1e-05`, `['a', 'b']`, a nested
//! parameter as a dict). The default command is `${env} ${interpreter} ${program} ${args}`.
//!
//! We run commands with `sh -c`, so a list becomes a command string in which every argument
//! is one quoted shell word: `sh` then runs exactly that argv, and an item such as
//! `hydra.run.dir=runs/${now:%Y%m%d}`, `&` or `*.py` reaches the program literally, as with
//! W&B. `${envvar:NAME}` becomes `"${NAME-NAME}"`, expanded by that shell on the worker when
//! the job starts. A macro W&B does not know is refused here (the agent silently drops it).
//!
//! A `command:` string (not W&B syntax: its agent iterates a string's characters) keeps our
//! shell meaning: macros expand inside it, each argument written for the quotes around the
//! macro, and `${UPPER_CASE}` is left to the shell as a variable.

use serde_norway::Value;

use super::error::{invalid, SweepError};
use super::read::{self, describe};
use super::render::python;
use super::render::shell::{check_nul, env_ref, quoted, Quote, QuoteState};
use super::render::template::{JsonShape, Piece, Template};
use super::render::Style;

/// The macros of the W&B agent, for messages.
const MACROS: [&str; 10] = [
    "env",
    "interpreter",
    "program",
    "args",
    "args_no_hyphens",
    "args_no_equals",
    "args_no_boolean_flags",
    "args_json",
    "args_json_file",
    "envvar:NAME",
];

pub(crate) struct Macros<'a> {
    pub program: Option<&'a str>,
    pub shape: &'a JsonShape,
}

/// The command template: `command` (a list or a string) or the default list.
pub(crate) fn command_template(command: Option<&Value>, macros: &Macros<'_>) -> Result<Template, SweepError> {
    if let Some(program) = macros.program {
        check_nul(program).map_err(|message| invalid("program", message))?;
    }
    match command {
        None if macros.program.is_none() => Err(invalid("program", "a W&B sweep needs `program` or `command`")),
        None => {
            let default =
                ["${env}", "${interpreter}", "${program}", "${args}"].map(|item| Value::String(item.to_owned()));
            macros.argv(&default, "command")
        }
        Some(Value::Sequence(items)) => macros.argv(items, "command"),
        Some(Value::String(text)) => macros.shell_string(text),
        Some(other) => {
            Err(invalid("command", format!("expected a list of arguments (or a string), found {}", describe(other))))
        }
    }
}

impl Macros<'_> {
    /// A list command: every item one argument (or a macro's arguments), written so that
    /// `sh -c` runs exactly that argv.
    fn argv(&self, items: &[Value], path: &str) -> Result<Template, SweepError> {
        let mut template = Template::default();
        for (position, item) in items.iter().enumerate() {
            let item_path = format!("{path}.{position}");
            // The agent runs `str(item)`: 1 -> "1", true -> "True".
            let text = match item {
                Value::String(text) => text.clone(),
                other => python::to_str(other),
            };
            check_nul(&text).map_err(|message| invalid(&item_path, message))?;
            match text.strip_prefix("${").and_then(|rest| rest.strip_suffix('}')) {
                Some(name) if !name.starts_with("envvar:") => {
                    let expansion = self.expansion(name, Quote::None, &item_path)?;
                    if !expansion.is_empty() {
                        space(&mut template);
                        template.append(expansion);
                    }
                }
                _ => {
                    space(&mut template);
                    template.append(literal_word(&text, &item_path)?);
                }
            }
        }
        Ok(template)
    }

    /// A string command: macros expanded for their quote context, the rest shell syntax.
    fn shell_string(&self, text: &str) -> Result<Template, SweepError> {
        check_nul(text).map_err(|message| invalid("command", message))?;
        let mut shell = QuoteState::default();
        let mut template = Template::default();
        let mut rest = text;
        while let Some(start) = rest.find("${") {
            let before = &rest[..start];
            template.push_text(before);
            shell.feed(before);
            let after = &rest[start + 2..];
            let name = after.find('}').map(|end| &after[..end]);
            let expansion = match name {
                Some(name) if is_shell_variable(name) => None,
                // Text in single quotes is literal to the shell (Hydra's `'${now:%Y}'`):
                // only the agent's own macros expand there.
                Some(name) if shell.quote() == Quote::Single && !is_macro(name) => None,
                Some(name) => match name.strip_prefix("envvar:") {
                    Some(variable) => Some(Template::text(&env_or_name(variable, shell.quote(), "command")?)),
                    None => Some(self.expansion(name, shell.quote(), "command")?),
                },
                None => None,
            };
            match (expansion, name) {
                (Some(expansion), Some(name)) => {
                    template.append(expansion);
                    shell.after_value();
                    rest = &after[name.len() + 1..];
                }
                _ => {
                    template.push_text("${");
                    shell.feed("${");
                    rest = after;
                }
            }
        }
        template.push_text(rest);
        Ok(template)
    }

    /// The arguments of macro `name`, each one word for `quote`.
    fn expansion(&self, name: &str, quote: Quote, path: &str) -> Result<Template, SweepError> {
        Ok(match name {
            "env" => Template::text("/usr/bin/env"),
            "interpreter" => Template::text("python"),
            "program" => match self.program {
                Some(program) => Template::text(&quoted(program, quote)),
                None => return Err(invalid(path, "`${program}` is used but `program` is not set")),
            },
            "args" => self.args(quote, |name| format!("--{name}="), Joined::Equals),
            "args_no_hyphens" => self.args(quote, |name| format!("{name}="), Joined::Equals),
            "args_no_equals" => self.args(quote, |name| format!("--{name}"), Joined::Separate),
            "args_no_boolean_flags" => self.args(quote, |name| format!("--{name}"), Joined::Flag),
            "args_json" => {
                let mut template = Template::default();
                template.push(Piece::Quoted(self.shape.python_template().into_pieces(), quote));
                template
            }
            "args_json_file" => Template::text(&env_ref("APP_CONFIG", quote)),
            other => {
                let known = MACROS.join(", ");
                return Err(invalid(path, format!("unknown macro `${{{other}}}`; the W&B agent knows {known}")));
            }
        })
    }

    /// One or two words per top-level parameter.
    fn args(&self, quote: Quote, prefix: impl Fn(&str) -> String, joined: Joined) -> Template {
        let mut template = Template::default();
        let JsonShape::Object(entries) = self.shape else { return template };
        for (name, shape) in entries {
            let value = match shape {
                JsonShape::Slot(slot) => vec![Piece::Slot(*slot, Style::Python)],
                nested => nested.python_repr_template().into_pieces(),
            };
            space(&mut template);
            match (joined, shape) {
                (Joined::Flag, JsonShape::Slot(slot)) => {
                    template.push(Piece::Flag { slot: *slot, text: prefix(name), quote });
                }
                (Joined::Separate, _) => {
                    template.push(Piece::Quoted(vec![Piece::Text(prefix(name))], quote));
                    template.push_text(" ");
                    template.push(Piece::Quoted(value, quote));
                }
                (Joined::Flag, _) => {
                    let mut word = vec![Piece::Text(format!("{}=", prefix(name)))];
                    word.extend(value);
                    template.push(Piece::Quoted(word, quote));
                }
                (Joined::Equals, _) => {
                    let mut word = vec![Piece::Text(prefix(name))];
                    word.extend(value);
                    template.push(Piece::Quoted(word, quote));
                }
            }
        }
        template
    }
}

#[derive(Debug, Clone, Copy)]
enum Joined {
    Equals,
    Separate,
    Flag,
}

fn space(template: &mut Template) {
    if !template.is_empty() {
        template.push_text(" ");
    }
}

/// One literal argument as one shell word, `${envvar:NAME}` expanded by the shell.
fn literal_word(text: &str, path: &str) -> Result<Template, SweepError> {
    let mut word = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("${envvar:") {
        let after = &rest[start + "${envvar:".len()..];
        let Some(end) = after.find('}') else { break };
        let literal = &rest[..start];
        if !literal.is_empty() {
            word.push_str(&quoted(literal, Quote::None));
        }
        word.push_str(&env_or_name(&after[..end], Quote::None, path)?);
        rest = &after[end + 1..];
    }
    if !rest.is_empty() || word.is_empty() {
        word.push_str(&quoted(rest, Quote::None));
    }
    Ok(Template::text(&word))
}

/// `${envvar:NAME}`: the variable's value on the worker, or the name when it is unset (the
/// agent's `os.environ.get(NAME, NAME)`).
fn env_or_name(name: &str, quote: Quote, path: &str) -> Result<String, SweepError> {
    let mut chars = name.chars();
    let valid = chars.next().is_some_and(|first| first.is_ascii_alphabetic() || first == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        return Err(invalid(path, format!("`${{envvar:{name}}}` needs a variable name (letters, digits and _)")));
    }
    Ok(match quote {
        Quote::None => format!("\"${{{name}-{name}}}\""),
        Quote::Double => format!("${{{name}-{name}}}"),
        Quote::Single => format!("'\"${{{name}-{name}}}\"'"),
    })
}

fn is_macro(name: &str) -> bool {
    name.starts_with("envvar:") || MACROS.contains(&name)
}

/// `${HOME}`, `${CUDA_VISIBLE_DEVICES}`: upper-case names are the shell's in a string command.
fn is_shell_variable(name: &str) -> bool {
    !name.is_empty()
        && name.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit())
}

/// Reads `program`.
pub(crate) fn program(root: &serde_norway::Mapping) -> Result<Option<String>, SweepError> {
    read::get(root, "program").map(|program| read::string(program, "program")).transpose()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::render::Rendered;

    fn shape() -> JsonShape {
        JsonShape::Object(vec![
            ("lr".into(), JsonShape::Slot(0)),
            ("amp".into(), JsonShape::Slot(1)),
            ("opt".into(), JsonShape::Object(vec![("name".into(), JsonShape::Slot(2))])),
        ])
    }

    /// The command for `command` with values lr=1e-5, amp=`amp`, opt.name='a b'.
    fn command(command: &str, amp: bool) -> Result<String, SweepError> {
        let shape = shape();
        let macros = Macros { program: Some("train.py"), shape: &shape };
        let value: Option<Value> = serde_norway::from_str(command).unwrap();
        let template = command_template(value.as_ref(), &macros)?;
        let values = [
            Rendered::float(1e-5),
            Rendered::new(&Value::Bool(amp)).unwrap(),
            Rendered::new(&Value::from("a b")).unwrap(),
        ];
        let mut out = String::new();
        template.render(&values.iter().collect::<Vec<_>>(), 0, &mut out);
        Ok(out)
    }

    /// The argv `sh` makes of a command (what the program receives).
    fn argv(command: &str) -> Vec<String> {
        let script = format!("for a in {command}; do printf '%s\\n' \"$a\"; done");
        let output = std::process::Command::new("sh").arg("-c").arg(script).output().unwrap();
        String::from_utf8(output.stdout).unwrap().lines().map(str::to_owned).collect()
    }

    #[test]
    fn default_command_passes_python_str_values() {
        let out = command("null", true).unwrap();
        assert_eq!(
            argv(&out),
            ["/usr/bin/env", "python", "train.py", "--lr=1e-05", "--amp=True", "--opt={'name': 'a b'}"]
        );
    }

    #[test]
    fn every_macro_renders_as_the_agent_does() {
        let cases: [(&str, bool, &[&str]); 7] = [
            ("['${args_no_hyphens}']", false, &["lr=1e-05", "amp=False", "opt={'name': 'a b'}"]),
            ("['${args_no_equals}']", true, &["--lr", "1e-05", "--amp", "True", "--opt", "{'name': 'a b'}"]),
            ("['${args_no_boolean_flags}']", true, &["--lr=1e-05", "--amp", "--opt={'name': 'a b'}"]),
            ("['${args_no_boolean_flags}']", false, &["--lr=1e-05", "--opt={'name': 'a b'}"]),
            ("['${args_json}']", true, &[r#"{"lr": 1e-05, "amp": true, "opt": {"name": "a b"}}"#]),
            ("['${env}', '${interpreter}', '${program}']", true, &["/usr/bin/env", "python", "train.py"]),
            ("[python, 1, 0.5, true, '-b']", true, &["python", "1", "0.5", "True", "-b"]),
        ];
        for (command_text, amp, expected) in cases {
            assert_eq!(argv(&command(command_text, amp).unwrap()), expected, "{command_text}");
        }
        assert_eq!(command("['${args_json_file}']", true).unwrap(), "\"$APP_CONFIG\"");
    }

    #[test]
    fn list_items_reach_the_program_literally() {
        let out =
            command("[run, 'hydra.run.dir=runs/${now:%Y%m%d}', '&', '*.py', 'a;b', '$HOME', \"it's\"]", true).unwrap();
        assert_eq!(argv(&out), ["run", "hydra.run.dir=runs/${now:%Y%m%d}", "&", "*.py", "a;b", "$HOME", "it's"]);
    }

    #[test]
    fn envvar_is_the_workers_value_or_its_name() {
        let out = command("['--data=${envvar:DATA_DIR}/x', '${envvar:UNSET_FOR_TEST}']", true).unwrap();
        let with = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("for a in {out}; do printf '%s\\n' \"$a\"; done"))
            .env("DATA_DIR", "/d a")
            .env_remove("UNSET_FOR_TEST")
            .output()
            .unwrap();
        assert_eq!(String::from_utf8(with.stdout).unwrap(), "--data=/d a/x\nUNSET_FOR_TEST\n");
    }

    #[test]
    fn unknown_macros_are_refused_with_the_list() {
        let error = command("[python, '${argz}']", true).unwrap_err();
        assert!(matches!(error, SweepError::Invalid { ref path, .. } if path == "command.1"), "{error:?}");
        assert!(error.to_string().contains("args_no_boolean_flags"), "{error}");
        assert!(command("'run ${whatever} x'", true).is_err());
        assert!(command("'run ${envvar:a-b}'", true).is_err());
        // In a string, upper-case names and single quotes belong to the shell.
        let out = command("'echo ${HOME} ''${now:%Y}'' ${args_no_hyphens}'", false).unwrap();
        assert_eq!(out, "echo ${HOME} '${now:%Y}' lr=1e-05 amp=False \"opt={'name': 'a b'}\"");
    }
}
