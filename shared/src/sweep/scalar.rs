//! Plain YAML scalars resolved as serde_norway resolves them (YAML 1.2 core schema), so the
//! streaming loader reads every value the same as before.

use serde_norway::Value;

/// A plain scalar as serde_norway reads it: null, boolean, integer (decimal, `0x`, `0o`, `0b`),
/// float (`.inf`, `.nan`, and what Rust parses, finite), else a string. Leading zeros make a
/// string (`007`), as in YAML 1.2. `None` for an integer beyond 64 bits.
pub(crate) fn resolve_plain(text: &str) -> Option<Value> {
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Some(Value::Null),
        "true" | "True" | "TRUE" => return Some(Value::Bool(true)),
        "false" | "False" | "FALSE" => return Some(Value::Bool(false)),
        _ => {}
    }
    if let Some(integer) = parse_integer(text) {
        return match (u64::try_from(integer), i64::try_from(integer)) {
            (Ok(unsigned), _) => Some(Value::Number(unsigned.into())),
            (_, Ok(signed)) => Some(Value::Number(signed.into())),
            _ => None,
        };
    }
    if !leading_zero_digits(text) {
        if let Some(float) = parse_float(text) {
            return Some(Value::Number(float.into()));
        }
    }
    Some(Value::String(text.to_owned()))
}

/// An integer literal of any size that fits `i128`; huge decimal literals still count as
/// integers (so they are refused rather than read as floats).
fn parse_integer(text: &str) -> Option<i128> {
    let (negative, unsigned) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let (radix, digits) = if let Some(rest) = unsigned.strip_prefix("0x") {
        (16, rest)
    } else if let Some(rest) = unsigned.strip_prefix("0o") {
        (8, rest)
    } else if let Some(rest) = unsigned.strip_prefix("0b") {
        (2, rest)
    } else {
        if leading_zero_digits(text) {
            return None;
        }
        (10, unsigned)
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    // Past i128 it is still an integer: saturate so the caller refuses it as too large.
    let magnitude = i128::from_str_radix(digits, radix).unwrap_or(i128::MAX);
    Some(if negative { -magnitude } else { magnitude })
}

fn parse_float(text: &str) -> Option<f64> {
    let unsigned = match text.strip_prefix('+') {
        Some(rest) if rest.starts_with(['+', '-']) => return None,
        Some(rest) => rest,
        None => text,
    };
    match unsigned {
        ".inf" | ".Inf" | ".INF" => return Some(f64::INFINITY),
        "-.inf" | "-.Inf" | "-.INF" => return Some(f64::NEG_INFINITY),
        ".nan" | ".NaN" | ".NAN" if unsigned.len() == text.len() => return Some(f64::NAN),
        _ => {}
    }
    unsigned.parse::<f64>().ok().filter(|float| float.is_finite())
}

/// `0` followed by digits only (with an optional sign): a string in YAML 1.2.
fn leading_zero_digits(text: &str) -> bool {
    let digits = text.strip_prefix(['-', '+']).unwrap_or(text);
    digits.len() > 1 && digits.starts_with('0') && digits[1..].bytes().all(|byte| byte.is_ascii_digit())
}
