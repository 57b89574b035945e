//! Strict parsing of environment variables: a malformed value is an error that names the
//! variable, never a silent default. Pure helpers take the raw value so they can be tested
//! without touching the process environment.

use crate::error::{CclError, Result};

/// Reads `name`; `Ok(None)` when unset or empty.
pub fn var(name: &str) -> Result<Option<String>> {
    match std::env::var(name) {
        Ok(v) if v.trim().is_empty() => Ok(None),
        Ok(v) => Ok(Some(v.trim().to_string())),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => {
            Err(CclError::arg(format!("{name} is not valid UTF-8")))
        }
    }
}

/// Parses an unsigned integer with an optional K/M/G (1024-based) suffix.
pub fn parse_u64(name: &str, raw: &str) -> Result<u64> {
    let s = raw.trim();
    let (digits, mult) = match s.char_indices().last() {
        Some((i, 'K' | 'k')) => (&s[..i], 1u64 << 10),
        Some((i, 'M' | 'm')) => (&s[..i], 1u64 << 20),
        Some((i, 'G' | 'g')) => (&s[..i], 1u64 << 30),
        _ => (s, 1),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|v| v.checked_mul(mult))
        .ok_or_else(|| CclError::arg(format!("{name}={raw:?} is not a non-negative integer")))
}

/// Reads an unsigned integer variable, `default` when unset.
pub fn u64_or(name: &str, default: u64) -> Result<u64> {
    match var(name)? {
        None => Ok(default),
        Some(v) => parse_u64(name, &v),
    }
}

/// Reads a boolean variable (`0`/`1`), `default` when unset.
pub fn bool_or(name: &str, default: bool) -> Result<bool> {
    match var(name)?.as_deref() {
        None => Ok(default),
        Some("0") => Ok(false),
        Some("1") => Ok(true),
        Some(v) => Err(CclError::arg(format!("{name}={v:?} must be 0 or 1"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_suffixes_and_rejects_junk() {
        assert_eq!(parse_u64("X", "17").unwrap(), 17);
        assert_eq!(parse_u64("X", "4K").unwrap(), 4096);
        assert_eq!(parse_u64("X", "2m").unwrap(), 2 << 20);
        assert_eq!(parse_u64("X", "1G").unwrap(), 1 << 30);
        for bad in ["", "-1", "abc", "1.5", "K", "99999999999999999999G"] {
            let e = parse_u64("NCCL_BUFFSIZE", bad).unwrap_err();
            assert!(e.to_string().contains("NCCL_BUFFSIZE"), "{e}");
        }
    }
}
