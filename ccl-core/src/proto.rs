//! `NCCL_PROTO` for device communicators: which protocols an operation may use, and the
//! choice per operation. Pure (the variable's value is passed in), unit-tested.
//!
//! Syntax (NVIDIA's): a comma-separated, case-insensitive list of `LL`, `LL128`, `Simple`;
//! a leading `^` means "every protocol except those listed". Unset (or empty) = all.
//! Unknown names, empty list entries and a bare `^` are errors naming the variable.
//!
//! What runs: `Simple` and `LL` (see docs/device-backend.md, "Protocols"). `LL128` is
//! accepted but not implemented, so it is never chosen; a set without `Simple` and `LL`
//! (e.g. `NCCL_PROTO=LL128`) is an init error. The host backend runs Simple only
//! (`comm.rs` warns when the set excludes it).

use crate::error::{CclError, Result};

/// The variable.
pub const ENV_PROTO: &ccl_params::Param = &ccl_params::NCCL_PROTO;

/// Operations whose per-rank size (bytes of each rank's send buffer) is at most this use
/// LL when it is allowed (and Simple otherwise): LL's latency is lower, its bandwidth
/// half (8 payload bytes per 16-byte line) and its chunks at most [`LL_MAX_CHUNK`] bytes.
pub const LL_THRESHOLD_BYTES: usize = 64 << 10;

/// Most payload bytes of one LL message: the kernel stages a step's input and output in
/// two static shared-memory buffers of this size.
pub const LL_MAX_CHUNK: usize = 16 << 10;

/// A protocol the device kernels run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Proto {
    /// Data in the FIFO slot, then a fence, then the `tail` counter.
    Simple,
    /// 16-byte lines of {data, flag, data, flag}: the receiver polls the flags.
    Ll,
}

impl Proto {
    /// The ABI value (`CCL_PROTO_*`).
    pub fn abi(self) -> u32 {
        match self {
            Proto::Simple => kernels::ffi::CCL_PROTO_SIMPLE,
            Proto::Ll => kernels::ffi::CCL_PROTO_LL,
        }
    }

    /// The name `NCCL_PROTO` uses.
    pub fn name(self) -> &'static str {
        match self {
            Proto::Simple => "Simple",
            Proto::Ll => "LL",
        }
    }
}

/// The protocols `NCCL_PROTO` allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ProtoSet {
    /// `LL` allowed.
    pub ll: bool,
    /// `LL128` allowed (never chosen: not implemented).
    pub ll128: bool,
    /// `Simple` allowed.
    pub simple: bool,
}

impl Default for ProtoSet {
    fn default() -> Self {
        ProtoSet::ALL
    }
}

/// What an operation is, for the protocol choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpShape {
    /// A collective (AlltoAll / Gather / Scatter included) whose ranks each send `bytes`
    /// bytes: the same on every rank, so every rank makes the same choice.
    Coll {
        /// Bytes of each rank's send buffer.
        bytes: usize,
    },
    /// A group of Send/Recv calls: the two ends of a connection may see groups of very
    /// different sizes, and the protocol is per kernel, so the choice must not depend on
    /// the size (both ends must agree): Simple when allowed, else LL.
    P2pGroup,
}

impl ProtoSet {
    /// Every protocol.
    pub const ALL: ProtoSet = ProtoSet {
        ll: true,
        ll128: true,
        simple: true,
    };

    /// Whether `p` may be used.
    pub fn allows(&self, p: Proto) -> bool {
        match p {
            Proto::Simple => self.simple,
            Proto::Ll => self.ll,
        }
    }

    /// Errors unless an implemented protocol is allowed (device communicators' init).
    pub fn check_runnable(self) -> Result<ProtoSet> {
        if self.simple || self.ll {
            return Ok(self);
        }
        Err(CclError::arg(format!(
            "{ENV_PROTO} allows no protocol the device backend implements (Simple, LL; \
             LL128 is not implemented)"
        )))
    }

    /// The protocol of an operation: LL when allowed and the operation is small
    /// ([`LL_THRESHOLD_BYTES`]), else Simple when allowed, else LL. Send/Recv groups:
    /// Simple when allowed, else LL (see [`OpShape::P2pGroup`]). Call on a set that passed
    /// [`Self::check_runnable`] (otherwise Simple).
    pub fn choose(&self, op: OpShape) -> Proto {
        let small = match op {
            OpShape::Coll { bytes } => bytes <= LL_THRESHOLD_BYTES,
            OpShape::P2pGroup => false,
        };
        if self.ll && (small || !self.simple) {
            Proto::Ll
        } else {
            Proto::Simple
        }
    }

    /// A short description for logs ("LL,Simple").
    pub fn describe(&self) -> String {
        let mut v = Vec::new();
        if self.ll {
            v.push("LL");
        }
        if self.ll128 {
            v.push("LL128");
        }
        if self.simple {
            v.push("Simple");
        }
        v.join(",")
    }
}

/// Parses a value of `NCCL_PROTO` (`None` or blank = all protocols).
pub fn parse(raw: Option<&str>) -> Result<ProtoSet> {
    let Some(raw) = raw.map(str::trim).filter(|s| !s.is_empty()) else {
        return Ok(ProtoSet::ALL);
    };
    let (negate, list) = match raw.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, raw),
    };
    let mut named = ProtoSet {
        ll: false,
        ll128: false,
        simple: false,
    };
    if list.trim().is_empty() {
        return Err(CclError::arg(format!(
            "{ENV_PROTO}={raw:?}: empty protocol list (expected LL, LL128, Simple, comma-separated, \
             optionally after ^)"
        )));
    }
    for tok in list.split(',') {
        match tok.trim().to_ascii_lowercase().as_str() {
            "ll" => named.ll = true,
            "ll128" => named.ll128 = true,
            "simple" => named.simple = true,
            other => {
                return Err(CclError::arg(format!(
                    "{ENV_PROTO}={raw:?}: unknown protocol {other:?} (expected LL, LL128, Simple, \
                     comma-separated, optionally after ^)"
                )))
            }
        }
    }
    Ok(if negate {
        ProtoSet {
            ll: !named.ll,
            ll128: !named.ll128,
            simple: !named.simple,
        }
    } else {
        named
    })
}

/// Reads `NCCL_PROTO` for a device communicator: parsed strictly, LL128 warned about once
/// per process when the variable allows it, an unrunnable set an error.
pub fn from_env() -> Result<ProtoSet> {
    let raw = crate::env::var(ENV_PROTO)?;
    let set = parse(raw.as_deref())?.check_runnable()?;
    if raw.is_some() && set.ll128 {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            tracing::warn!(target: "nccl::ENV",
                "{ENV_PROTO}={}: LL128 is not implemented by the device backend; using {}",
                raw.as_deref().unwrap_or(""),
                ProtoSet { ll128: false, ..set }.describe());
        });
    }
    Ok(set)
}

/// Payload bytes of one LL message in a FIFO slot of `slot_bytes` (each 8 payload bytes
/// take a 16-byte line): half the slot, at most [`LL_MAX_CHUNK`], a multiple of 8; at
/// least 8 (a slot has at least 64 bytes, `NCCL_BUFFSIZE` checks).
pub fn ll_chunk_bytes(slot_bytes: usize) -> usize {
    ((slot_bytes / 2).min(LL_MAX_CHUNK) / 8 * 8).max(8)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ll: bool, ll128: bool, simple: bool) -> ProtoSet {
        ProtoSet { ll, ll128, simple }
    }

    #[test]
    fn parses_lists_negation_and_case() {
        assert_eq!(parse(None).unwrap(), ProtoSet::ALL);
        assert_eq!(parse(Some("  ")).unwrap(), ProtoSet::ALL);
        assert_eq!(parse(Some("LL")).unwrap(), set(true, false, false));
        assert_eq!(parse(Some("simple")).unwrap(), set(false, false, true));
        assert_eq!(parse(Some("SIMPLE,ll")).unwrap(), set(true, false, true));
        assert_eq!(parse(Some("ll128")).unwrap(), set(false, true, false));
        assert_eq!(
            parse(Some(" LL , Simple ")).unwrap(),
            set(true, false, true)
        );
        assert_eq!(parse(Some("LL,LL")).unwrap(), set(true, false, false));
        assert_eq!(parse(Some("^LL")).unwrap(), set(false, true, true));
        assert_eq!(parse(Some("^ll128")).unwrap(), set(true, false, true));
        assert_eq!(
            parse(Some("^Simple,LL128")).unwrap(),
            set(true, false, false)
        );
        assert_eq!(
            parse(Some("^LL,LL128,Simple")).unwrap(),
            set(false, false, false)
        );
    }

    #[test]
    fn junk_is_an_error_naming_the_variable() {
        for bad in [
            "LL64",
            "Ring",
            "^",
            "^ ",
            ",",
            "LL,",
            ",LL",
            "LL,,Simple",
            "^^LL",
            "LL;Simple",
            "Simple LL",
            "ll 128",
            "\u{e9}",
        ] {
            let e = parse(Some(bad)).unwrap_err();
            assert!(
                matches!(e, CclError::InvalidArgument(_)) && e.to_string().contains(ENV_PROTO.name),
                "{bad:?}: {e}"
            );
        }
    }

    #[test]
    fn a_set_without_simple_or_ll_cannot_run() {
        for bad in ["LL128", "^LL,Simple", "^LL,LL128,Simple"] {
            let e = parse(Some(bad)).unwrap().check_runnable().unwrap_err();
            assert!(e.to_string().contains(ENV_PROTO.name), "{bad}: {e}");
            assert!(e.to_string().contains("LL128 is not implemented"), "{e}");
        }
        for ok in ["LL", "Simple", "LL128,LL", "^LL", "^Simple"] {
            assert!(parse(Some(ok)).unwrap().check_runnable().is_ok(), "{ok}");
        }
    }

    #[test]
    fn choice_per_operation() {
        let small = OpShape::Coll {
            bytes: LL_THRESHOLD_BYTES,
        };
        let large = OpShape::Coll {
            bytes: LL_THRESHOLD_BYTES + 1,
        };
        let zero = OpShape::Coll { bytes: 0 };
        let all = ProtoSet::ALL;
        assert_eq!(all.choose(small), Proto::Ll);
        assert_eq!(all.choose(zero), Proto::Ll);
        assert_eq!(all.choose(large), Proto::Simple);
        assert_eq!(all.choose(OpShape::P2pGroup), Proto::Simple);
        let ll = set(true, false, false);
        for op in [small, large, zero, OpShape::P2pGroup] {
            assert_eq!(ll.choose(op), Proto::Ll, "{op:?}");
        }
        let simple = set(false, true, true);
        for op in [small, large, zero, OpShape::P2pGroup] {
            assert_eq!(simple.choose(op), Proto::Simple, "{op:?}");
        }
        // LL128 never: a set of LL128 + LL is LL only.
        assert_eq!(set(true, true, false).choose(large), Proto::Ll);
    }

    #[test]
    fn ll_chunks_fit_half_a_slot_and_the_staging_buffers() {
        assert_eq!(ll_chunk_bytes(64), 32);
        assert_eq!(ll_chunk_bytes(8192), 4096);
        assert_eq!(ll_chunk_bytes(1 << 17), LL_MAX_CHUNK);
        assert_eq!(ll_chunk_bytes(100), 48);
        assert_eq!(ll_chunk_bytes(8), 8);
        assert_eq!(LL_MAX_CHUNK, kernels::ffi::CCL_LL_MAX_CHUNK);
        for s in (64..70_000).step_by(7) {
            let c = ll_chunk_bytes(s);
            assert!(
                c.is_multiple_of(8) && 2 * c <= s && c <= LL_MAX_CHUNK,
                "{s} {c}"
            );
            // The kernel's rule (CCL_LL_CHUNK, checked against the C macro by kernels' ABI test).
            assert_eq!(c as u64, kernels::ffi::ll_chunk(s as u64), "{s}");
        }
    }

    #[test]
    fn abi_values_and_names() {
        assert_eq!(Proto::Simple.abi(), kernels::ffi::CCL_PROTO_SIMPLE);
        assert_eq!(Proto::Ll.abi(), kernels::ffi::CCL_PROTO_LL);
        assert_eq!(Proto::Ll.name(), "LL");
        assert_eq!(ProtoSet::ALL.describe(), "LL,LL128,Simple");
    }
}
