//! The W&B sweep form: `method: grid | random`, `parameters`, `program` / `command` with
//! `${args}`-style macros, `run_cap`, and our `seed`.

use serde_norway::{Mapping, Value};

use super::common::parse_settings;
use super::error::{invalid, SweepError};
use super::plan::{check_count, count_jobs, Plan, Source, Templates};
use super::random::{Distribution, Sampler};
use super::read;
use super::render::Style;
use super::shell::{check_nul, env_ref, quoted, Quote, QuoteState};
use super::template::{JsonShape, Piece, Template};
use super::wandb_spec::{parse_parameters, ParamSpec};
use super::yaml::{get, key_text, Loader};
use super::{ExpandOptions, Sweep, SweepForm};

const KEYS: [&str; 13] = [
    "method",
    "parameters",
    "metric",
    "program",
    "command",
    "run_cap",
    "name",
    "description",
    "seed",
    "resources",
    "priority",
    "retries",
    "timeout",
];
/// W&B keys about its own service, meaningless here but harmless.
const IGNORED: [&str; 3] = ["entity", "project", "early_terminate"];

pub(crate) fn parse(root: &Mapping, loader: &Loader, options: &ExpandOptions) -> Result<Sweep, SweepError> {
    read::check_keys(root, "", &KEYS, &IGNORED, "a W&B sweep")?;
    let random = match get(root, "method").map(|method| (method.as_str(), method)) {
        Some((Some("grid"), _)) => false,
        Some((Some("random"), _)) => true,
        Some((Some("bayes"), _)) => return Err(invalid("method", "bayes search is not supported; use grid or random")),
        Some((_, other)) => {
            return Err(invalid("method", format!("expected grid or random, found `{}`", key_text(other))))
        }
        None => return Err(invalid("method", "a W&B sweep needs `method: grid` or `method: random`")),
    };
    let settings = parse_settings(root)?;
    let Some(parameters) = get(root, "parameters") else {
        return Err(invalid("parameters", "a W&B sweep needs `parameters`"));
    };
    let specs = parse_parameters(parameters, "parameters", loader)?;
    let run_cap = get(root, "run_cap").map(|cap| read::positive(cap, "run_cap")).transpose()?;
    let seed = match get(root, "seed") {
        // Negative seeds are as good as any: keep their bits.
        Some(seed) => {
            read::integer_in::<i128>(seed, "seed", i64::MIN.into(), u64::MAX.into(), "a 64-bit integer")? as u64
        }
        None => 0,
    };

    let mut leaves = Vec::new();
    let shape = flatten(&specs, "parameters", &mut leaves);
    let source = if random {
        let Some(run_cap) = run_cap else {
            return Err(invalid("run_cap", "random search needs run_cap (the number of runs)"));
        };
        check_count(u128::from(run_cap), None, options.max_jobs)?;
        Source::Random(Sampler { seed, leaves: leaves.into_iter().map(|(_, leaf)| leaf.clone()).collect() })
    } else {
        let mut axes = Vec::with_capacity(leaves.len());
        for (path, leaf) in &leaves {
            let Some(values) = leaf.grid_values() else {
                let name = path.rsplit('.').next().unwrap_or(path);
                let message =
                    format!("grid search needs `values` or `value`; `{name}` has distribution {}", leaf.name());
                return Err(invalid(path.as_str(), message));
            };
            axes.push(values.to_vec());
        }
        Source::Grid(axes)
    };
    let count = match &source {
        Source::Grid(axes) => count_jobs(axes.iter().map(Vec::len), run_cap, options.max_jobs)?,
        Source::Random(_) => run_cap.unwrap_or_default(),
    };
    let command = command_template(root, &shape)?;
    let templates = Templates { params: shape.template(), command, config: None };
    Ok(Sweep::new(SweepForm::Wandb, settings, Plan { count, source, templates }))
}

/// Numbers the leaves in document order (they become template slots) and returns the
/// params object's shape, nested parameters kept nested.
fn flatten<'a>(
    specs: &'a [(String, ParamSpec)],
    path: &str,
    leaves: &mut Vec<(String, &'a Distribution)>,
) -> JsonShape {
    let entries = specs.iter().map(|(name, spec)| {
        let spec_path = format!("{path}.{name}");
        let shape = match spec {
            ParamSpec::Leaf(distribution) => {
                leaves.push((spec_path, distribution));
                JsonShape::Slot(leaves.len() - 1)
            }
            ParamSpec::Nested(inner) => flatten(inner, &format!("{spec_path}.parameters"), leaves),
        };
        (name.clone(), shape)
    });
    JsonShape::Object(entries.collect())
}

/// The command: `command` (a string or a list joined with spaces) with its macros expanded,
/// or `${env} ${interpreter} ${program} ${args}`. Expansions are written for the quotes
/// around their macro, like native placeholders.
fn command_template(root: &Mapping, shape: &JsonShape) -> Result<Template, SweepError> {
    let program = get(root, "program").map(|program| read::string(program, "program")).transpose()?;
    if let Some(program) = &program {
        check_nul(program).map_err(|message| invalid("program", message))?;
    }
    let macros = Macros { program: program.as_deref(), shape };
    let mut shell = QuoteState::default();
    match get(root, "command") {
        None if program.is_none() => Err(invalid("program", "a W&B sweep needs `program` or `command`")),
        None => {
            let has_args = matches!(shape, JsonShape::Object(entries) if !entries.is_empty());
            let command =
                if has_args { "${env} ${interpreter} ${program} ${args}" } else { "${env} ${interpreter} ${program}" };
            macros.expand(command, &mut shell)
        }
        Some(Value::String(text)) => macros.expand(text, &mut shell),
        Some(Value::Sequence(items)) => {
            let mut template = Template::default();
            for (position, item) in items.iter().enumerate() {
                let text = read::string(item, &format!("command.{position}"))?;
                if position > 0 {
                    template.push_text(" ");
                    shell.feed(" ");
                }
                template.append(macros.expand(&text, &mut shell)?);
            }
            Ok(template)
        }
        Some(other) => Err(invalid(
            "command",
            format!("expected a string or a list of strings, found {}", super::yaml::describe(other)),
        )),
    }
}

struct Macros<'a> {
    program: Option<&'a str>,
    shape: &'a JsonShape,
}

impl Macros<'_> {
    /// Replaces the W&B macros; any other `${NAME}` is a shell variable and stays. `shell`
    /// follows the quoting from one list item to the next.
    fn expand(&self, text: &str, shell: &mut QuoteState) -> Result<Template, SweepError> {
        let mut template = Template::default();
        let mut rest = text;
        while let Some(start) = rest.find("${") {
            let before = &rest[..start];
            template.push_text(before);
            shell.feed(before);
            let after = &rest[start + 2..];
            let name = after.find('}').map(|end| &after[..end]);
            match name.and_then(|name| self.expansion(name, shell.quote()).transpose()) {
                Some(expansion) => {
                    template.append(expansion?);
                    shell.after_value();
                    rest = &after[name.map_or(0, str::len) + 1..];
                }
                None => {
                    template.push_text("${");
                    shell.feed("${");
                    rest = after;
                }
            }
        }
        template.push_text(rest);
        shell.feed(rest);
        Ok(template)
    }

    fn expansion(&self, name: &str, quote: Quote) -> Result<Option<Template>, SweepError> {
        Ok(Some(match name {
            "env" => Template::text("/usr/bin/env"),
            "interpreter" => Template::text("python"),
            "program" => match self.program {
                Some(program) => Template::text(&quoted(program, quote)),
                None => return Err(invalid("command", "`${program}` is used but `program` is not set")),
            },
            "args" => self.args("--", quote),
            "args_no_hyphens" => self.args("", quote),
            "args_json" => {
                let mut template = Template::default();
                template.push(Piece::Quoted(self.shape.template().into_pieces(), quote));
                template
            }
            "args_json_file" => Template::text(&env_ref("APP_CONFIG", quote)),
            _ => return Ok(None),
        }))
    }

    /// `--name=value` for each top-level parameter, each token one piece of text in `quote`.
    fn args(&self, hyphens: &str, quote: Quote) -> Template {
        let mut template = Template::default();
        let JsonShape::Object(entries) = self.shape else { return template };
        for (position, (name, shape)) in entries.iter().enumerate() {
            if position > 0 {
                template.push_text(" ");
            }
            let mut token = vec![Piece::Text(format!("{hyphens}{name}="))];
            match shape {
                JsonShape::Slot(slot) => token.push(Piece::Slot(*slot, Style::Raw)),
                nested => token.extend(nested.template().into_pieces()),
            }
            template.push(Piece::Quoted(token, quote));
        }
        template
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::render::Rendered;

    fn command(yaml: &str, values: &[&str]) -> Result<String, SweepError> {
        let loader = Loader::for_text(yaml);
        let root = loader.load(yaml).unwrap();
        let root = root.as_mapping().unwrap();
        let specs = parse_parameters(root.get("parameters").unwrap(), "parameters", &loader)?;
        let shape = flatten(&specs, "parameters", &mut Vec::new());
        let values: Vec<Rendered> =
            values.iter().map(|text| Rendered::new(&loader.load(text).unwrap(), &loader).unwrap()).collect();
        let refs: Vec<&Rendered> = values.iter().collect();
        let mut out = String::new();
        command_template(root, &shape)?.render(&refs, 0, &mut out);
        Ok(out)
    }

    #[test]
    fn default_command_runs_the_program_with_args() {
        let yaml = "program: my train.py\nparameters: {a: {value: 1}, b: {values: ['x y']}}";
        assert_eq!(command(yaml, &["1", "'x y'"]), Ok("/usr/bin/env python 'my train.py' --a=1 '--b=x y'".into()));
        assert_eq!(command("program: t.py\nparameters: {}", &[]), Ok("/usr/bin/env python t.py".into()));
    }

    #[test]
    fn only_known_macros_expand() {
        let yaml = "command: 'x=${HOME} ${args_no_hyphens} ${nope'\nparameters: {a: {value: 1}}";
        assert_eq!(command(yaml, &["1"]), Ok("x=${HOME} a=1 ${nope".into()));
        let error = command("command: [a, 1]\nparameters: {}", &[]).unwrap_err();
        assert!(matches!(error, SweepError::Invalid { ref path, .. } if path == "command.1"), "{error:?}");
        let error = command("parameters: {}", &[]).unwrap_err();
        assert!(matches!(error, SweepError::Invalid { ref path, .. } if path == "program"), "{error:?}");
    }
}
