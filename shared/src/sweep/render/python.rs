//! Values as Python prints them, which is what the W&B agent passes to a program: it builds
//! `--name=value` with an f-string (Python's `str()`), `${args_json}` with `json.dumps()`.
//!
//! `str()`: `True`/`False`, `None`, integers as digits, floats as `repr()` (shortest round-trip
//! digits; exponent form below 1e-4 and from 1e16 on: `1e-05`, `1.5e+16`, else a decimal point:
//! `128.0`), strings as they are at the top and `repr()`-quoted inside lists and dicts
//! (`['a', 'b']`), a `!!python/tuple` as a tuple. `json.dumps()`: `", "` and `": "` separators,
//! non-ASCII escaped (`ensure_ascii`), floats as `repr()`.

use serde_norway::Value;

use super::json::key_string;

/// Python's `str(value)`.
pub(crate) fn to_str(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        Value::Tagged(tagged) if !is_tuple(value) => to_str(&tagged.value),
        _ => {
            let mut out = String::new();
            repr(value, &mut out);
            out
        }
    }
}

/// Python's `repr(value)`.
pub(crate) fn to_repr(value: &Value) -> String {
    let mut out = String::new();
    repr(value, &mut out);
    out
}

fn is_tuple(value: &Value) -> bool {
    matches!(value, Value::Tagged(tagged) if tagged.tag == "!!python/tuple")
}

/// Python's `repr(value)`.
fn repr(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("None"),
        Value::Bool(flag) => out.push_str(if *flag { "True" } else { "False" }),
        Value::Number(number) => match (number.as_i64(), number.as_u64()) {
            (Some(whole), _) => out.push_str(&whole.to_string()),
            (_, Some(whole)) => out.push_str(&whole.to_string()),
            _ => out.push_str(&float_repr(number.as_f64().unwrap_or(f64::NAN))),
        },
        Value::String(text) => string_repr(text, out),
        Value::Sequence(items) => {
            out.push('[');
            join(items.iter(), out, repr);
            out.push(']');
        }
        Value::Mapping(map) => {
            out.push('{');
            join(map.iter(), out, |(key, item), out| {
                repr(key, out);
                out.push_str(": ");
                repr(item, out);
            });
            out.push('}');
        }
        Value::Tagged(tagged) => match (&tagged.value, is_tuple(value)) {
            (Value::Sequence(items), true) => {
                out.push('(');
                join(items.iter(), out, repr);
                out.push_str(if items.len() == 1 { ",)" } else { ")" });
            }
            (inner, _) => repr(inner, out),
        },
    }
}

fn join<T>(items: impl Iterator<Item = T>, out: &mut String, mut write: impl FnMut(T, &mut String)) {
    for (position, item) in items.enumerate() {
        if position > 0 {
            out.push_str(", ");
        }
        write(item, out);
    }
}

/// Python's `repr(float)`: the shortest digits that round-trip, laid out as Python lays them.
pub(crate) fn float_repr(number: f64) -> String {
    if number.is_nan() {
        return "nan".to_owned();
    }
    if number.is_infinite() {
        return if number > 0.0 { "inf" } else { "-inf" }.to_owned();
    }
    // `{:e}` gives the shortest round-trip digits: `-1.25e-5`, `1e16`.
    let scientific = format!("{number:e}");
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    if (-4..16).contains(&exponent) {
        let point = exponent + 1;
        let (whole, fraction) = if point <= 0 {
            ("0".to_owned(), format!("{}{digits}", "0".repeat((-point) as usize)))
        } else if point as usize >= digits.len() {
            (format!("{digits}{}", "0".repeat(point as usize - digits.len())), String::new())
        } else {
            (digits[..point as usize].to_owned(), digits[point as usize..].to_owned())
        };
        let fraction = if fraction.is_empty() { "0".to_owned() } else { fraction };
        format!("{sign}{whole}.{fraction}")
    } else {
        let mantissa = if digits.len() > 1 { format!("{}.{}", &digits[..1], &digits[1..]) } else { digits };
        let exponent_sign = if exponent < 0 { '-' } else { '+' };
        format!("{sign}{mantissa}e{exponent_sign}{:02}", exponent.abs())
    }
}

/// Python's `repr(str)`: single quotes unless the text has `'` and no `"`; backslash escapes
/// for the quote, `\\`, `\n`, `\r`, `\t` and characters Python does not print.
fn string_repr(text: &str, out: &mut String) {
    let quote = if text.contains('\'') && !text.contains('"') { '"' } else { '\'' };
    out.push(quote);
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if !is_printable(c) => out.push_str(&escape(c)),
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// Python's `str.isprintable` for the characters that matter in practice: controls, and the
/// separators and invisible formatting characters other than the plain space.
fn is_printable(c: char) -> bool {
    let code = c as u32;
    !(c.is_control()
        || matches!(code, 0xA0 | 0xAD | 0x1680 | 0x2000..=0x200F | 0x2028..=0x202F | 0x205F..=0x2064 | 0x3000 | 0xFEFF))
}

fn escape(c: char) -> String {
    match c as u32 {
        code @ 0..=0xFF => format!("\\x{code:02x}"),
        code @ 0x100..=0xFFFF => format!("\\u{code:04x}"),
        code => format!("\\U{code:08x}"),
    }
}

/// Python's `json.dumps(value)` with its defaults.
pub(crate) fn json_dumps(value: &Value) -> String {
    let mut out = String::new();
    dumps(value, &mut out);
    out
}

fn dumps(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(flag) => out.push_str(if *flag { "true" } else { "false" }),
        Value::Number(number) => match (number.as_i64(), number.as_u64()) {
            (Some(whole), _) => out.push_str(&whole.to_string()),
            (_, Some(whole)) => out.push_str(&whole.to_string()),
            (_, _) => {
                let float = number.as_f64().unwrap_or(f64::NAN);
                // json.dumps writes NaN and Infinity (parsing refuses them in values).
                match float_repr(float).as_str() {
                    "nan" => out.push_str("NaN"),
                    "inf" => out.push_str("Infinity"),
                    "-inf" => out.push_str("-Infinity"),
                    text => out.push_str(text),
                }
            }
        },
        Value::String(text) => ascii_json_string(text, out),
        Value::Sequence(items) => {
            out.push('[');
            join(items.iter(), out, dumps);
            out.push(']');
        }
        Value::Mapping(map) => {
            out.push('{');
            join(map.iter(), out, |(key, item), out| {
                ascii_json_string(&key_string(key).unwrap_or_default(), out);
                out.push_str(": ");
                dumps(item, out);
            });
            out.push('}');
        }
        Value::Tagged(tagged) => dumps(&tagged.value, out),
    }
}

fn ascii_json_string(text: &str, out: &mut String) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || !c.is_ascii() => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Expected texts are what CPython 3 prints for `repr(x)`.
    #[test]
    fn floats_print_as_python_repr() {
        let cases = [
            (0.001, "0.001"),
            (1e-5, "1e-05"),
            (1.5e-5, "1.5e-05"),
            (0.0001, "0.0001"),
            (128.0, "128.0"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (9999999999999998.0, "9999999999999998.0"),
            (-0.0, "-0.0"),
            (0.1 + 0.2, "0.30000000000000004"),
            (123.456, "123.456"),
            (1e100, "1e+100"),
            (-2.5e-300, "-2.5e-300"),
            (5e-324, "5e-324"),
        ];
        for (number, expected) in cases {
            assert_eq!(float_repr(number), expected, "{number:e}");
        }
    }

    #[test]
    fn strings_inside_containers_use_python_quotes() {
        let mut out = String::new();
        for text in ["a", "it's", "say \"hi\"", "both ' and \"", "tab\there", "\u{7f}", "é", "\u{2028}"] {
            string_repr(text, &mut out);
            out.push(' ');
        }
        assert_eq!(out, r#"'a' "it's" 'say "hi"' 'both \' and "' 'tab\there' '\x7f' 'é' '\u2028' "#);
    }

    #[test]
    fn json_dumps_escapes_like_python() {
        let value: Value = serde_norway::from_str("{a: [1, 2.0, é, 'x\"y'], b: null, c: 😀}").unwrap();
        assert_eq!(json_dumps(&value), r#"{"a": [1, 2.0, "\u00e9", "x\"y"], "b": null, "c": "\ud83d\ude00"}"#);
    }
}
