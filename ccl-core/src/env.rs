//! Reading the declared environment variables (`ccl_params`): a malformed value is an
//! `InvalidArgument` error that names the variable, never a silent default. Every reader
//! passes a declared [`Param`], so an undeclared variable cannot be read.

pub use ccl_params::Param;

use crate::error::{CclError, Result};

fn arg(e: ccl_params::ParamError) -> CclError {
    CclError::arg(e.0)
}

/// Reads `p`; `Ok(None)` when unset or empty.
pub fn var(p: &Param) -> Result<Option<String>> {
    p.raw().map_err(arg)
}

/// Parses `raw` as the integer variable `p` (its bounds; a K/M/G suffix where declared).
pub fn parse_u64(p: &Param, raw: &str) -> Result<u64> {
    p.parse_int(raw).map_err(arg)
}

/// Reads the integer variable `p`, `default` when unset.
pub fn u64_or(p: &Param, default: u64) -> Result<u64> {
    Ok(p.int().map_err(arg)?.unwrap_or(default))
}

/// Reads the flag `p` (`0`/`1`), `default` when unset.
pub fn bool_or(p: &Param, default: bool) -> Result<bool> {
    Ok(p.flag().map_err(arg)?.unwrap_or(default))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_suffixes_and_rejects_junk() {
        let p = &ccl_params::CCLD_SPIN_US;
        assert_eq!(parse_u64(p, "17").unwrap(), 17);
        assert_eq!(parse_u64(p, "4K").unwrap(), 4096);
        assert_eq!(parse_u64(p, "2m").unwrap(), 2 << 20);
        assert_eq!(parse_u64(p, "1G").unwrap(), 1 << 30);
        for bad in ["", "-1", "abc", "1.5", "K", "99999999999999999999G", "256"] {
            let e = parse_u64(&ccl_params::NCCL_BUFFSIZE, bad).unwrap_err();
            assert!(e.to_string().contains("NCCL_BUFFSIZE"), "{e}");
        }
    }
}
