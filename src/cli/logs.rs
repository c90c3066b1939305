//! `app logs JOB [-f] [--json]`: a job's log, followed live with `-f`. Written anywhere but a
//! terminal (a file, a pipe), the job's colour and cursor codes are removed, so the text greps
//! and diffs cleanly; `--raw` keeps the bytes as the job wrote them.

use super::UrlArg;
use anyhow::Context;
use clap::Args;
use serde_json::json;
use shared::api::LogQuery;
use std::io::{IsTerminal, Write};

#[derive(Debug, Args)]
pub struct LogsArgs {
    /// The job id.
    pub job: shared::api::JobId,
    /// Keep printing as the job writes, until its attempt ends.
    #[arg(short, long)]
    pub follow: bool,
    /// Which attempt (default: the latest).
    #[arg(long)]
    pub attempt: Option<u32>,
    /// Keep ANSI escape codes (colours, cursor moves) even when not writing to a terminal.
    #[arg(long)]
    pub raw: bool,
    /// Print JSON: {"job", "attempt", "text", "finished"}; with -f, one such line per chunk.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub url: UrlArg,
}

pub async fn run(args: LogsArgs) -> anyhow::Result<()> {
    let client = super::client(&args.url)?;
    let mut query = LogQuery { attempt: args.attempt, offset: 0, wait_ms: if args.follow { 20_000 } else { 0 } };
    let stdout = std::io::stdout();
    let plain = !args.raw && (args.json || !stdout.is_terminal());
    let mut out = stdout.lock();
    let mut whole = String::new();
    let mut stripper = AnsiStripper::default();
    loop {
        let chunk =
            client.log(args.job, &query).await.with_context(|| format!("reading the log of job {}", args.job))?;
        query.attempt = Some(chunk.attempt);
        query.offset = chunk.next_offset;
        // Without -f, read to the end of what is stored (it comes in pages); with -f, until
        // the attempt has ended and everything it wrote has been printed.
        let drained = chunk.text.is_empty();
        let done = drained && (!args.follow || chunk.finished);
        let text = match (plain, done) {
            (false, _) => chunk.text,
            (true, false) => stripper.push(&chunk.text),
            (true, true) => stripper.finish(),
        };
        match (args.json, args.follow) {
            (false, _) => {
                out.write_all(text.as_bytes())?;
                out.flush()?;
            }
            (true, true) if !text.is_empty() || done => {
                let line = json!({"job": args.job, "attempt": chunk.attempt, "text": text, "finished": chunk.finished});
                writeln!(out, "{line}")?;
                out.flush()?;
            }
            (true, true) => {}
            (true, false) => whole.push_str(&text),
        }
        if done {
            if args.json && !args.follow {
                let finished = chunk.finished;
                let line = json!({"job": args.job, "attempt": chunk.attempt, "text": whole, "finished": finished});
                writeln!(out, "{line}")?;
            }
            return Ok(());
        }
    }
}

/// Removes ANSI escape codes from text that arrives in pieces: an escape cut off at the end of
/// one piece is kept back and finished with the next.
#[derive(Debug, Default)]
struct AnsiStripper {
    carry: String,
}

/// An escape is at most this long; a longer tail after an ESC is text, not a cut-off code.
const LONGEST_ESCAPE: usize = 32;

impl AnsiStripper {
    fn push(&mut self, text: &str) -> String {
        let mut joined = std::mem::take(&mut self.carry);
        joined.push_str(text);
        if let Some(start) = joined.rfind('\x1b') {
            let tail = &joined[start + 1..];
            // Every escape code ends in a letter (or `=`, `<`, `>`); none yet means cut off.
            let ended = tail.chars().any(|c| c.is_ascii_alphabetic() || matches!(c, '=' | '<' | '>'));
            if !ended && tail.len() < LONGEST_ESCAPE {
                self.carry = joined.split_off(start);
            }
        }
        console::strip_ansi_codes(&joined).into_owned()
    }

    /// What was kept back, once no more text will come.
    fn finish(&mut self) -> String {
        let rest = std::mem::take(&mut self.carry);
        console::strip_ansi_codes(&rest).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::AnsiStripper;

    #[test]
    fn colour_codes_are_removed_even_when_cut_between_pieces() {
        let text = "\x1b[1;31merror\x1b[0m: loss is nan\n\x1b[32mok\x1b[0m\n";
        for cut in 0..=text.len() {
            let mut stripper = AnsiStripper::default();
            let mut plain = stripper.push(&text[..cut]);
            plain.push_str(&stripper.push(&text[cut..]));
            plain.push_str(&stripper.finish());
            assert_eq!(plain, "error: loss is nan\nok\n", "cut at {cut}");
        }
    }

    #[test]
    fn text_without_escapes_passes_through_and_a_lone_escape_is_not_held_back_forever() {
        let mut stripper = AnsiStripper::default();
        assert_eq!(stripper.push("epoch 1/3 loss=0.5\n"), "epoch 1/3 loss=0.5\n");
        assert_eq!(stripper.push("tail \x1b"), "tail ");
        let after = stripper.push(&"x".repeat(40));
        assert_eq!(after, format!("\x1b{}", "x".repeat(40)), "an ESC followed by plain text is not an escape code");
    }
}
