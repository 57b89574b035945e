//! Bootstrap: unique ids, the root listener, and the rank-to-rank control network
//! (allgather, tagged point-to-point messages, barrier) used during init and split.
//!
//! INTERFACE STUB: the bootstrap work replaces the bodies below.

use crate::error::{CclError, Result};

/// Bytes in an `ncclUniqueId`.
pub const UNIQUE_ID_BYTES: usize = 128;

/// `ncclUniqueId`: opaque 128 bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId(pub [u8; UNIQUE_ID_BYTES]);

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UniqueId({:02x?}..)", &self.0[..16])
    }
}

/// `ncclGetUniqueId`: starts a root listener in this process and returns its id.
pub fn get_unique_id() -> Result<UniqueId> {
    Err(CclError::usage("ncclGetUniqueId is not implemented yet"))
}
