//! CCL-D probe data structures shared by every backend: the Trace ID that labels one round
//! of a communicator, the per-rank probing frame with per-channel SendCount/RecvCount, and
//! the operation type set recorded for every operation. The diagnostic thread that samples
//! frames and streams records to the analyzer will live here too.
//!
//! This crate must not depend on `ccl-core`: the runtime depends on it, not the reverse.

pub mod frame;
pub mod optype;

pub use frame::{
    ext_bytes, ChannelCounts, ChannelWaits, Frame, FrameBlock, FrameHeader, FrameHeaderSnapshot,
    ProbingFrame, TraceId, EXT_WORDS_PER_CHANNEL, FRAME_BLOCKS, FRAME_HEADER_BYTES, PAPER_CHANNELS,
};
pub use optype::{Algo, CollKind, OpLog, OpSnapshot, OpState, OpTypeSet, Proto};

/// True when the environment turns probing off (`CCLD_DISABLE=1`).
///
/// Any value other than `0`, `1` or empty is rejected so that a typo is not silently read
/// as "enabled".
pub fn disabled_from_env() -> Result<bool, String> {
    match std::env::var("CCLD_DISABLE") {
        Err(_) => Ok(false),
        Ok(v) => match v.trim() {
            "" | "0" => Ok(false),
            "1" => Ok(true),
            other => Err(format!("CCLD_DISABLE must be 0 or 1, got {other:?}")),
        },
    }
}
