//! Values in `sh -c` commands: where in the command a value lands (outside quotes, inside
//! `"..."` or inside `'...'`), and how it must be written there to stay one literal piece of
//! text.
//!
//! A value is always written for the quote context of its placeholder, so it reaches the
//! program exactly as it is and never runs as shell syntax:
//!
//! - outside quotes, a value made only of characters the shell takes literally (letters,
//!   digits and `_-+.,:/=@%^`) goes in as it is, so `--lr {lr}` reads `--lr 0.001`; anything
//!   else (space, quotes, `$`, `;`, glob characters `*?[]`, an empty string...) is quoted
//!   with `shlex::try_quote`, so a list reads `--hidden '[128,64]'`;
//! - inside double quotes, `\`, `"`, `$` and the backtick get a backslash;
//! - inside single quotes, each `'` becomes `'\''` (close, escaped quote, reopen).
//!
//! [`QuoteState`] follows the template's own quoting to know the context: backslash
//! escapes, `'...'`, `"..."`, and `$(...)` and backticks, inside which quoting starts afresh
//! (`"$(awk '{print {x}}')"` puts `{x}` inside single quotes).

/// The quoting in force at a point of a command.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Quote {
    #[default]
    None,
    Double,
    Single,
}

/// `text` as one shell word: unchanged when it is safe, quoted otherwise.
pub(crate) fn shell_word(text: &str) -> Result<String, String> {
    let safe = |c: char| c.is_ascii_alphanumeric() || "_-+.,:/=@%^".contains(c);
    if !text.is_empty() && text.chars().all(safe) {
        return Ok(text.to_owned());
    }
    shlex::try_quote(text).map(|quoted| quoted.into_owned()).map_err(|_| NUL_MESSAGE.to_owned())
}

const NUL_MESSAGE: &str = "a value containing a NUL byte cannot be passed to a command";

/// Refuses text that no command line can carry.
pub(crate) fn check_nul(text: &str) -> Result<(), String> {
    if text.contains('\0') {
        return Err(NUL_MESSAGE.to_owned());
    }
    Ok(())
}

/// Appends `text` written for `quote`. NUL bytes, which no command can carry and which
/// parsing has refused in values, are dropped.
pub(crate) fn push_quoted(text: &str, quote: Quote, out: &mut String) {
    match quote {
        Quote::None => out.push_str(&shell_word(&text.replace('\0', "")).unwrap_or_default()),
        Quote::Double => {
            for c in text.chars().filter(|c| *c != '\0') {
                if matches!(c, '\\' | '"' | '$' | '`') {
                    out.push('\\');
                }
                out.push(c);
            }
        }
        Quote::Single => {
            for c in text.chars().filter(|c| *c != '\0') {
                match c {
                    '\'' => out.push_str("'\\''"),
                    c => out.push(c),
                }
            }
        }
    }
}

/// `text` written for `quote`.
pub(crate) fn quoted(text: &str, quote: Quote) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    push_quoted(text, quote, &mut out);
    out
}

/// The value of environment variable `name` as one word in `quote`: `"$NAME"` outside
/// quotes, `${NAME}` inside double quotes, and `'"$NAME"'` (leave, expand, reenter) inside
/// single quotes.
pub(crate) fn env_ref(name: &str, quote: Quote) -> String {
    match quote {
        Quote::None => format!("\"${name}\""),
        Quote::Double => format!("${{{name}}}"),
        Quote::Single => format!("'\"${name}\"'"),
    }
}

/// Follows the quoting of a command template as its literal text is fed in, piece by
/// piece; values inserted between pieces are written for the context and change nothing.
#[derive(Debug, Clone, Default)]
pub(crate) struct QuoteState {
    /// The contexts around each open `$(` or backtick.
    outer: Vec<Level>,
    current: Level,
}

#[derive(Debug, Clone, Copy, Default)]
struct Level {
    quote: Quote,
    kind: Kind,
    /// Open plain `(` (subshells, `$((`) inside this level.
    parens: usize,
    /// The previous character was an unescaped backslash.
    escaped: bool,
    /// The previous character was an unescaped `$`.
    dollar: bool,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Kind {
    #[default]
    Top,
    /// Inside `$(...)`.
    Paren,
    /// Inside `` `...` ``.
    Backtick,
}

impl QuoteState {
    /// The quoting at the end of the text fed so far.
    pub(crate) fn quote(&self) -> Quote {
        self.current.quote
    }

    /// Notes that a value was inserted: a pending `\` or `$` applied to it, not to what
    /// follows.
    pub(crate) fn after_value(&mut self) {
        self.current.escaped = false;
        self.current.dollar = false;
    }

    pub(crate) fn feed(&mut self, text: &str) {
        for c in text.chars() {
            self.step(c);
        }
    }

    fn step(&mut self, c: char) {
        let level = &mut self.current;
        if std::mem::take(&mut level.escaped) {
            level.dollar = false;
            return;
        }
        let dollar = std::mem::take(&mut level.dollar);
        match (level.quote, c) {
            (Quote::Single, '\'') => level.quote = Quote::None,
            (Quote::Single, _) => {}
            (_, '\\') => level.escaped = true,
            (Quote::None, '\'') => level.quote = Quote::Single,
            (Quote::None, '"') => level.quote = Quote::Double,
            (Quote::Double, '"') => level.quote = Quote::None,
            (_, '$') => level.dollar = true,
            (_, '(') if dollar => self.open(Kind::Paren),
            (Quote::None, '(') => level.parens += 1,
            (Quote::None, ')') if level.parens > 0 => level.parens -= 1,
            (Quote::None, ')') if level.kind == Kind::Paren => self.close(),
            (Quote::None, '`') if level.kind == Kind::Backtick => self.close(),
            (_, '`') => self.open(Kind::Backtick),
            _ => {}
        }
    }

    fn open(&mut self, kind: Kind) {
        self.outer.push(self.current);
        self.current = Level { kind, ..Level::default() };
    }

    fn close(&mut self) {
        self.current = self.outer.pop().unwrap_or_default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The quote context at each `@` of `template` (the `@`s are fed as plain text).
    fn contexts(template: &str) -> Vec<Quote> {
        let mut state = QuoteState::default();
        let mut found = Vec::new();
        for piece in template.split_inclusive('@') {
            state.feed(piece.trim_end_matches('@'));
            if piece.ends_with('@') {
                found.push(state.quote());
                state.after_value();
            }
        }
        found
    }

    #[test]
    fn follows_quotes_escapes_and_substitutions() {
        use Quote::{Double as D, None as N, Single as S};
        assert_eq!(contexts("a @ '@' \"@\" @"), [N, S, D, N]);
        assert_eq!(contexts(r#"a\'@ "\"@" '\'@"#), [N, D, N]);
        assert_eq!(contexts(r#""$(awk '{print @}') @" @"#), [S, D, N]);
        assert_eq!(contexts(r#""$(echo "@" (x) @) @" $((1 + @)) @"#), [D, N, D, N, N]);
        assert_eq!(contexts("\"`echo '@'` @\" `@` @"), [S, D, N, N]);
        assert_eq!(contexts("echo \"it's @\" '\"@'"), [D, S]);
    }

    #[test]
    fn values_are_written_for_their_context() {
        let value = "a'b\"c$d`e\\f g*";
        assert_eq!(quoted(value, Quote::Double), "a'b\\\"c\\$d\\`e\\\\f g*");
        assert_eq!(quoted(value, Quote::Single), "a'\\''b\"c$d`e\\f g*");
        assert_eq!(quoted(value, Quote::None), "\"a'b\\\"c\"'$d`e'\"\\\\f g*\"");
        assert_eq!(quoted("[128,64]", Quote::None), "'[128,64]'");
        assert_eq!(quoted("-1.5e-05", Quote::None), "-1.5e-05");
        assert_eq!(env_ref("APP_CONFIG", Quote::Double), "${APP_CONFIG}");
    }
}
