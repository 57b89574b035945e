//! `ncclCommProperties_t` of NCCL's device API (`nccl_device/core.h`): layout and the
//! answer of this backend. Pure: builds a byte image.

use ccl_core::{CclError, Result};

use crate::config::NCCL_API_MAGIC;

/// `sizeof(ncclCommProperties_t)` in 2.30 (LP64).
pub const PROPS_SIZE: usize = 56;

/// Byte offsets of `ncclCommProperties_t` fields (checked against NVIDIA's header by the
/// ABI tests).
pub mod off {
    pub const RANK: usize = 16;
    pub const N_RANKS: usize = 20;
    pub const CUDA_DEV: usize = 24;
    pub const NVML_DEV: usize = 28;
    pub const DEVICE_API_SUPPORT: usize = 32;
    pub const MULTIMEM_SUPPORT: usize = 33;
    pub const GIN_TYPE: usize = 36;
    pub const N_LSA_TEAMS: usize = 40;
    pub const HOST_RMA_SUPPORT: usize = 44;
    pub const RAILED_GIN_TYPE: usize = 48;
}

/// What this backend reports about a communicator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Props {
    pub rank: i32,
    pub nranks: i32,
    pub cuda_dev: i32,
}

/// Fills the caller's struct image: `header` is its first 16 bytes (size, magic, version);
/// returns the bytes to write at offset 16 (as many as the caller's `size` covers, up to
/// [`PROPS_SIZE`]). The host backend has no device API: every capability is false/none,
/// each rank is its own LSA team (so there are `nranks` of them).
pub fn properties_image(header: &[u8; 16], p: Props) -> Result<Vec<u8>> {
    let size = u64::from_ne_bytes(header[0..8].try_into().unwrap_or([0; 8]));
    let magic = u32::from_ne_bytes(header[8..12].try_into().unwrap_or([0; 4]));
    if magic != NCCL_API_MAGIC {
        return Err(CclError::arg(format!(
            "ncclCommProperties_t has magic {magic:#x}, expected {NCCL_API_MAGIC:#x}: \
             initialise it with NCCL_COMM_PROPERTIES_INITIALIZER"
        )));
    }
    if size < 16 {
        return Err(CclError::arg(format!(
            "ncclCommProperties_t size {size} is smaller than its 16-byte header"
        )));
    }
    let n = usize::try_from(size).unwrap_or(usize::MAX).min(PROPS_SIZE);
    let mut img = [0u8; PROPS_SIZE];
    let mut put = |at: usize, v: i32| img[at..at + 4].copy_from_slice(&v.to_ne_bytes());
    put(off::RANK, p.rank);
    put(off::N_RANKS, p.nranks);
    put(off::CUDA_DEV, p.cuda_dev);
    put(off::NVML_DEV, p.cuda_dev);
    put(off::GIN_TYPE, 0); // NCCL_GIN_TYPE_NONE
    put(off::N_LSA_TEAMS, p.nranks);
    put(off::RAILED_GIN_TYPE, 0);
    img[off::DEVICE_API_SUPPORT] = 0;
    img[off::MULTIMEM_SUPPORT] = 0;
    img[off::HOST_RMA_SUPPORT] = 0;
    Ok(img[16..n].to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(size: u64, magic: u32) -> [u8; 16] {
        let mut h = [0u8; 16];
        h[0..8].copy_from_slice(&size.to_ne_bytes());
        h[8..12].copy_from_slice(&magic.to_ne_bytes());
        h[12..16].copy_from_slice(&23007u32.to_ne_bytes());
        h
    }

    #[test]
    fn image_respects_size_and_magic() {
        let p = Props {
            rank: 3,
            nranks: 8,
            cuda_dev: 1,
        };
        let full = properties_image(&header(56, NCCL_API_MAGIC), p).unwrap();
        assert_eq!(full.len(), 40);
        let at = |o: usize| i32::from_ne_bytes(full[o - 16..o - 12].try_into().unwrap());
        assert_eq!(at(off::RANK), 3);
        assert_eq!(at(off::N_RANKS), 8);
        assert_eq!(at(off::CUDA_DEV), 1);
        assert_eq!(at(off::NVML_DEV), 1);
        assert_eq!(at(off::N_LSA_TEAMS), 8);
        assert_eq!(full[off::DEVICE_API_SUPPORT - 16], 0);
        // An older, smaller struct gets only its own bytes; a bigger one only ours.
        assert_eq!(
            properties_image(&header(33, NCCL_API_MAGIC), p)
                .unwrap()
                .len(),
            17
        );
        assert_eq!(
            properties_image(&header(999, NCCL_API_MAGIC), p)
                .unwrap()
                .len(),
            40
        );
        assert!(properties_image(&header(56, 7), p).is_err());
        assert!(properties_image(&header(8, NCCL_API_MAGIC), p).is_err());
    }
}
