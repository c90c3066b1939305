//! Byte sizes as people write them: `8GiB`, `24G`, `512MiB`, `1.5GB`, `1000000`.

/// Parses a byte size. Binary units (`KiB`, `MiB`, `GiB`, `TiB`, and the short `K`, `M`, `G`,
/// `T`) are powers of 1024; decimal units (`KB`, `MB`, `GB`, `TB`) powers of 1000; a bare number
/// is bytes. Sizes above `i64::MAX` bytes are refused, so that every size also fits the
/// signed integers databases store.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let not_a_size = || format!("`{text}` is not a size (expected e.g. 8GiB, 512MiB, 1000000)");
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        other => {
            return Err(format!("unknown size unit `{other}` in `{text}` (use KiB, MiB, GiB, TiB, KB, MB, GB, TB)"))
        }
    };
    let too_large = || format!("size `{text}` is too large (at most {} bytes)", i64::MAX);
    const LIMIT: u64 = i64::MAX as u64;
    // Whole numbers exactly (a float cannot hold every integer near i64::MAX).
    if !number.is_empty() && number.bytes().all(|byte| byte.is_ascii_digit()) {
        let whole: u128 = number.parse().map_err(|_| too_large())?;
        return match whole.checked_mul(u128::from(multiplier)) {
            Some(bytes) if bytes <= u128::from(LIMIT) => Ok(bytes as u64),
            _ => Err(too_large()),
        };
    }
    let number: f64 = number.parse().map_err(|_| not_a_size())?;
    let bytes = (number * multiplier as f64).round();
    // 2^63 is the first float above i64::MAX; the floats below it are all at most i64::MAX.
    if !bytes.is_finite() || bytes >= 9_223_372_036_854_775_808.0 {
        return Err(too_large());
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_binary_decimal_and_bare_sizes() {
        assert_eq!(parse_bytes("8GiB"), Ok(8 << 30));
        assert_eq!(parse_bytes("24G"), Ok(24 << 30));
        assert_eq!(parse_bytes("1.5GB"), Ok(1_500_000_000));
        assert_eq!(parse_bytes("512 MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("1000"), Ok(1000));
    }

    #[test]
    fn refuses_garbage_with_the_text_in_the_message() {
        let error = parse_bytes("8 parsecs").unwrap_err();
        assert!(error.contains("parsecs"), "{error}");
        assert!(parse_bytes("GiB").is_err());
        assert!(parse_bytes("").is_err());
        assert!(parse_bytes(".").is_err());
    }

    #[test]
    fn refuses_sizes_above_i64_max() {
        assert_eq!(parse_bytes("9223372036854775807"), Ok(i64::MAX as u64));
        assert_eq!(parse_bytes("8388607TiB"), Ok(8_388_607 << 40));
        for huge in ["9223372036854775808", "18446744073709551615", "8388608TiB", "9300000TB", "9.3e18", "1e400"] {
            let error = parse_bytes(huge).unwrap_err();
            assert!(error.contains("too large") || error.contains("unknown size unit"), "{huge}: {error}");
        }
        assert!(parse_bytes("9223372036854775808.0").unwrap_err().contains("too large"));
        assert!(parse_bytes("99999999999999999999999999999999999999999999").unwrap_err().contains("too large"));
    }
}
