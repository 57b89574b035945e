//! `ncclConfig_t`: layout, versioned reading and conversion to [`CommConfig`]. Pure: works
//! on byte images so every historical layout can be tested without C.

use ccl_core::{CclError, CommConfig, Result};

/// `NCCL_API_MAGIC`.
pub const NCCL_API_MAGIC: u32 = 0xcafe_beef;
/// `NCCL_CONFIG_UNDEF_INT`.
pub const UNDEF_INT: i32 = i32::MIN;
/// `NCCL_VERSION_CODE` of the API we implement.
pub const NCCL_VERSION_CODE: u32 = 23007;
/// `sizeof(ncclConfig_t)` of the 2.30 header (LP64).
pub const CONFIG_SIZE: usize = 96;
/// Bytes of the fixed header every version has (`size`, `magic`, `version`).
pub const CONFIG_HEADER: usize = 16;

/// `NCCL_VERSION(x, y, z)`.
pub const fn nccl_version(x: u32, y: u32, z: u32) -> u32 {
    if x <= 2 && y <= 8 {
        x * 1000 + y * 100 + z
    } else {
        x * 10000 + y * 100 + z
    }
}

/// `ncclConfig_t` of NCCL 2.30 (LP64 layout; field order fixed by the ABI).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NcclConfig {
    pub size: usize,
    pub magic: u32,
    pub version: u32,
    pub blocking: i32,
    pub cga_cluster_size: i32,
    pub min_ctas: i32,
    pub max_ctas: i32,
    pub net_name: *const std::ffi::c_char,
    pub split_share: i32,
    pub traffic_class: i32,
    pub comm_name: *const std::ffi::c_char,
    pub collnet_enable: i32,
    pub cta_policy: i32,
    pub shrink_share: i32,
    pub nvls_ctas: i32,
    pub n_channels_per_net_peer: i32,
    pub nvlink_centric_sched: i32,
    pub graph_usage_mode: i32,
    pub num_rma_ctx: i32,
    pub max_p2p_peers: i32,
    pub graph_stream_ordering: i32,
}

const _: () = assert!(std::mem::size_of::<NcclConfig>() == CONFIG_SIZE);

impl NcclConfig {
    /// `NCCL_CONFIG_INITIALIZER`.
    pub fn initializer() -> Self {
        NcclConfig {
            size: CONFIG_SIZE,
            magic: NCCL_API_MAGIC,
            version: NCCL_VERSION_CODE,
            blocking: UNDEF_INT,
            cga_cluster_size: UNDEF_INT,
            min_ctas: UNDEF_INT,
            max_ctas: UNDEF_INT,
            net_name: std::ptr::null(),
            split_share: UNDEF_INT,
            traffic_class: UNDEF_INT,
            comm_name: std::ptr::null(),
            collnet_enable: UNDEF_INT,
            cta_policy: UNDEF_INT,
            shrink_share: UNDEF_INT,
            nvls_ctas: UNDEF_INT,
            n_channels_per_net_peer: UNDEF_INT,
            nvlink_centric_sched: UNDEF_INT,
            graph_usage_mode: UNDEF_INT,
            num_rma_ctx: UNDEF_INT,
            max_p2p_peers: UNDEF_INT,
            graph_stream_ordering: UNDEF_INT,
        }
    }
}

/// Byte offsets of the fields (LP64), used to read byte images.
pub mod off {
    pub const SIZE: usize = 0;
    pub const MAGIC: usize = 8;
    pub const VERSION: usize = 12;
    pub const BLOCKING: usize = 16;
    pub const CGA_CLUSTER_SIZE: usize = 20;
    pub const MIN_CTAS: usize = 24;
    pub const MAX_CTAS: usize = 28;
    pub const NET_NAME: usize = 32;
    pub const SPLIT_SHARE: usize = 40;
    pub const TRAFFIC_CLASS: usize = 44;
    pub const COMM_NAME: usize = 48;
    pub const COLLNET_ENABLE: usize = 56;
    pub const CTA_POLICY: usize = 60;
    pub const SHRINK_SHARE: usize = 64;
    pub const NVLS_CTAS: usize = 68;
    pub const N_CHANNELS_PER_NET_PEER: usize = 72;
    pub const NVLINK_CENTRIC_SCHED: usize = 76;
    pub const GRAPH_USAGE_MODE: usize = 80;
    pub const NUM_RMA_CTX: usize = 84;
    pub const MAX_P2P_PEERS: usize = 88;
    pub const GRAPH_STREAM_ORDERING: usize = 92;
}

/// Every field after the header: (offset, is pointer, first NCCL version that has it).
/// Versions follow NVIDIA's own defaulting of older structures.
pub const FIELDS: [(usize, bool, u32); 18] = [
    (off::BLOCKING, false, nccl_version(2, 14, 0)),
    (off::CGA_CLUSTER_SIZE, false, nccl_version(2, 17, 0)),
    (off::MIN_CTAS, false, nccl_version(2, 17, 0)),
    (off::MAX_CTAS, false, nccl_version(2, 17, 0)),
    (off::NET_NAME, true, nccl_version(2, 17, 0)),
    // splitShare and commName have no version gate in NCCL: only the size decides.
    (off::SPLIT_SHARE, false, 0),
    (off::TRAFFIC_CLASS, false, nccl_version(2, 25, 0)),
    (off::COMM_NAME, true, 0),
    (off::COLLNET_ENABLE, false, nccl_version(2, 27, 0)),
    (off::CTA_POLICY, false, nccl_version(2, 27, 0)),
    (off::SHRINK_SHARE, false, nccl_version(2, 27, 0)),
    (off::NVLS_CTAS, false, nccl_version(2, 27, 0)),
    (off::N_CHANNELS_PER_NET_PEER, false, nccl_version(2, 28, 0)),
    (off::NVLINK_CENTRIC_SCHED, false, nccl_version(2, 28, 0)),
    (off::GRAPH_USAGE_MODE, false, nccl_version(2, 29, 0)),
    (off::NUM_RMA_CTX, false, nccl_version(2, 29, 0)),
    (off::MAX_P2P_PEERS, false, nccl_version(2, 30, 0)),
    (off::GRAPH_STREAM_ORDERING, false, nccl_version(2, 30, 5)),
];

/// The caller's configuration after versioned reading: every field of the 2.30 layout,
/// `UNDEF_INT` / 0 (null) where the caller's struct did not have it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawConfig {
    pub version: u32,
    pub blocking: i32,
    pub cga_cluster_size: i32,
    pub min_ctas: i32,
    pub max_ctas: i32,
    pub net_name: usize,
    pub split_share: i32,
    pub traffic_class: i32,
    pub comm_name: usize,
    pub collnet_enable: i32,
    pub cta_policy: i32,
    pub shrink_share: i32,
    pub nvls_ctas: i32,
    pub n_channels_per_net_peer: i32,
    pub nvlink_centric_sched: i32,
    pub graph_usage_mode: i32,
    pub num_rma_ctx: i32,
    pub max_p2p_peers: i32,
    pub graph_stream_ordering: i32,
}

/// Reads the 16-byte header: (size, magic, version). Checks the magic and the size.
pub fn read_header(header: &[u8; CONFIG_HEADER]) -> Result<(usize, u32, u32)> {
    let size = u64::from_ne_bytes(sub8(header, off::SIZE));
    let magic = u32::from_ne_bytes(sub4(header, off::MAGIC));
    let version = u32::from_ne_bytes(sub4(header, off::VERSION));
    if magic != NCCL_API_MAGIC {
        return Err(CclError::arg(format!(
            "ncclConfig_t has magic {magic:#x}, expected {NCCL_API_MAGIC:#x}: initialise it with \
             NCCL_CONFIG_INITIALIZER"
        )));
    }
    let size = usize::try_from(size).unwrap_or(usize::MAX);
    if size < CONFIG_HEADER {
        return Err(CclError::arg(format!(
            "ncclConfig_t size {size} is smaller than its {CONFIG_HEADER}-byte header"
        )));
    }
    Ok((size, magic, version))
}

fn sub4(b: &[u8], at: usize) -> [u8; 4] {
    let mut o = [0u8; 4];
    o.copy_from_slice(&b[at..at + 4]);
    o
}

fn sub8(b: &[u8], at: usize) -> [u8; 8] {
    let mut o = [0u8; 8];
    o.copy_from_slice(&b[at..at + 8]);
    o
}

/// Versioned reading of a configuration image: `image` holds the first
/// `min(size, CONFIG_SIZE)` bytes of the caller's struct (its length is that count).
/// Fields beyond the image, or newer than the caller's `version`, read as unset.
pub fn parse_image(image: &[u8]) -> Result<RawConfig> {
    if image.len() < CONFIG_HEADER {
        return Err(CclError::arg(format!(
            "ncclConfig_t image of {} bytes is smaller than its header",
            image.len()
        )));
    }
    let mut header = [0u8; CONFIG_HEADER];
    header.copy_from_slice(&image[..CONFIG_HEADER]);
    let (_, _, version) = read_header(&header)?;
    let int = |at: usize| -> i32 {
        let first = FIELDS.iter().find(|f| f.0 == at).map_or(u32::MAX, |f| f.2);
        if at + 4 <= image.len() && version >= first {
            i32::from_ne_bytes(sub4(image, at))
        } else {
            UNDEF_INT
        }
    };
    let ptr = |at: usize| -> usize {
        let first = FIELDS.iter().find(|f| f.0 == at).map_or(u32::MAX, |f| f.2);
        if at + 8 <= image.len() && version >= first {
            // usize is 64 bits on the LP64 targets this layout describes.
            u64::from_ne_bytes(sub8(image, at)) as usize
        } else {
            0
        }
    };
    Ok(RawConfig {
        version,
        blocking: int(off::BLOCKING),
        cga_cluster_size: int(off::CGA_CLUSTER_SIZE),
        min_ctas: int(off::MIN_CTAS),
        max_ctas: int(off::MAX_CTAS),
        net_name: ptr(off::NET_NAME),
        split_share: int(off::SPLIT_SHARE),
        traffic_class: int(off::TRAFFIC_CLASS),
        comm_name: ptr(off::COMM_NAME),
        collnet_enable: int(off::COLLNET_ENABLE),
        cta_policy: int(off::CTA_POLICY),
        shrink_share: int(off::SHRINK_SHARE),
        nvls_ctas: int(off::NVLS_CTAS),
        n_channels_per_net_peer: int(off::N_CHANNELS_PER_NET_PEER),
        nvlink_centric_sched: int(off::NVLINK_CENTRIC_SCHED),
        graph_usage_mode: int(off::GRAPH_USAGE_MODE),
        num_rma_ctx: int(off::NUM_RMA_CTX),
        max_p2p_peers: int(off::MAX_P2P_PEERS),
        graph_stream_ordering: int(off::GRAPH_STREAM_ORDERING),
    })
}

fn flag(name: &str, v: i32) -> Result<Option<bool>> {
    match v {
        UNDEF_INT => Ok(None),
        0 => Ok(Some(false)),
        1 => Ok(Some(true)),
        _ => Err(CclError::arg(format!(
            "ncclConfig_t.{name} = {v} must be 0 or 1"
        ))),
    }
}

fn positive(name: &str, v: i32) -> Result<Option<u32>> {
    match v {
        UNDEF_INT => Ok(None),
        v if v > 0 => Ok(Some(v as u32)),
        _ => Err(CclError::arg(format!(
            "ncclConfig_t.{name} = {v} must be positive"
        ))),
    }
}

/// Converts and validates. `comm_name` is the already-read `commName` string;
/// `env_blocking` is `NCCL_COMM_BLOCKING`, used when the struct leaves `blocking` unset.
pub fn to_comm_config(
    raw: &RawConfig,
    comm_name: Option<String>,
    env_blocking: Option<bool>,
) -> Result<CommConfig> {
    let blocking = flag("blocking", raw.blocking)?.or(env_blocking);
    let min_ctas = positive("minCTAs", raw.min_ctas)?;
    let max_ctas = positive("maxCTAs", raw.max_ctas)?;
    if let (Some(lo), Some(hi)) = (min_ctas, max_ctas) {
        if lo > hi {
            return Err(CclError::arg(format!(
                "ncclConfig_t.minCTAs = {lo} is larger than maxCTAs = {hi}"
            )));
        }
    }
    let split_share = flag("splitShare", raw.split_share)?;
    Ok(CommConfig {
        blocking,
        min_ctas,
        max_ctas,
        comm_name,
        split_share,
    })
}

/// Parses `NCCL_COMM_BLOCKING` (0 or 1).
pub fn parse_env_blocking(raw: Option<&str>) -> Result<Option<bool>> {
    match raw.map(str::trim).filter(|s| !s.is_empty()) {
        None => Ok(None),
        Some("0") => Ok(Some(false)),
        Some("1") => Ok(Some(true)),
        Some(v) => Err(CclError::arg(format!(
            "NCCL_COMM_BLOCKING={v:?} must be 0 or 1"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Historical layouts: (version, sizeof(ncclConfig_t) on LP64, last field offset + size).
    const HISTORY: [(u32, usize); 10] = [
        (nccl_version(2, 14, 0), 24),
        (nccl_version(2, 17, 0), 40),
        (nccl_version(2, 18, 0), 48),
        (nccl_version(2, 24, 0), 48),
        (nccl_version(2, 25, 0), 56),
        (nccl_version(2, 27, 0), 72),
        (nccl_version(2, 28, 0), 80),
        (nccl_version(2, 29, 0), 88),
        (nccl_version(2, 30, 0), 96),
        (nccl_version(2, 30, 5), 96),
    ];

    /// A caller's struct image: header, every known field set to a distinct value, then
    /// truncated to `size`.
    fn image(version: u32, size: usize, magic: u32) -> Vec<u8> {
        let mut b = vec![0u8; CONFIG_SIZE];
        b[0..8].copy_from_slice(&(size as u64).to_ne_bytes());
        b[8..12].copy_from_slice(&magic.to_ne_bytes());
        b[12..16].copy_from_slice(&version.to_ne_bytes());
        for (i, (at, is_ptr, _)) in FIELDS.iter().enumerate() {
            if *is_ptr {
                b[*at..*at + 8].copy_from_slice(&(0x1000u64 + i as u64).to_ne_bytes());
            } else {
                // 1 for flags, other small positive values elsewhere.
                let v: i32 = if *at == off::BLOCKING || *at == off::SPLIT_SHARE {
                    1
                } else {
                    100 + i as i32
                };
                b[*at..*at + 4].copy_from_slice(&v.to_ne_bytes());
            }
        }
        b.truncate(size);
        b
    }

    fn field_present(cfg: &RawConfig, at: usize) -> bool {
        match at {
            off::BLOCKING => cfg.blocking != UNDEF_INT,
            off::CGA_CLUSTER_SIZE => cfg.cga_cluster_size != UNDEF_INT,
            off::MIN_CTAS => cfg.min_ctas != UNDEF_INT,
            off::MAX_CTAS => cfg.max_ctas != UNDEF_INT,
            off::NET_NAME => cfg.net_name != 0,
            off::SPLIT_SHARE => cfg.split_share != UNDEF_INT,
            off::TRAFFIC_CLASS => cfg.traffic_class != UNDEF_INT,
            off::COMM_NAME => cfg.comm_name != 0,
            off::COLLNET_ENABLE => cfg.collnet_enable != UNDEF_INT,
            off::CTA_POLICY => cfg.cta_policy != UNDEF_INT,
            off::SHRINK_SHARE => cfg.shrink_share != UNDEF_INT,
            off::NVLS_CTAS => cfg.nvls_ctas != UNDEF_INT,
            off::N_CHANNELS_PER_NET_PEER => cfg.n_channels_per_net_peer != UNDEF_INT,
            off::NVLINK_CENTRIC_SCHED => cfg.nvlink_centric_sched != UNDEF_INT,
            off::GRAPH_USAGE_MODE => cfg.graph_usage_mode != UNDEF_INT,
            off::NUM_RMA_CTX => cfg.num_rma_ctx != UNDEF_INT,
            off::MAX_P2P_PEERS => cfg.max_p2p_peers != UNDEF_INT,
            off::GRAPH_STREAM_ORDERING => cfg.graph_stream_ordering != UNDEF_INT,
            _ => unreachable!(),
        }
    }

    #[test]
    fn layout_matches_offsets() {
        let c = NcclConfig::initializer();
        let base = &c as *const _ as usize;
        assert_eq!(&c.magic as *const _ as usize - base, off::MAGIC);
        assert_eq!(&c.blocking as *const _ as usize - base, off::BLOCKING);
        assert_eq!(&c.net_name as *const _ as usize - base, off::NET_NAME);
        assert_eq!(&c.split_share as *const _ as usize - base, off::SPLIT_SHARE);
        assert_eq!(&c.comm_name as *const _ as usize - base, off::COMM_NAME);
        assert_eq!(
            &c.collnet_enable as *const _ as usize - base,
            off::COLLNET_ENABLE
        );
        assert_eq!(
            &c.n_channels_per_net_peer as *const _ as usize - base,
            off::N_CHANNELS_PER_NET_PEER
        );
        assert_eq!(
            &c.max_p2p_peers as *const _ as usize - base,
            off::MAX_P2P_PEERS
        );
        assert_eq!(
            &c.graph_stream_ordering as *const _ as usize - base,
            off::GRAPH_STREAM_ORDERING
        );
    }

    #[test]
    fn every_historical_layout() {
        for (version, size) in HISTORY {
            let img = image(version, size, NCCL_API_MAGIC);
            let cfg = parse_image(&img).unwrap();
            assert_eq!(cfg.version, version);
            for (at, is_ptr, first) in FIELDS {
                let width = if is_ptr { 8 } else { 4 };
                let expect = at + width <= size && version >= first;
                assert_eq!(
                    field_present(&cfg, at),
                    expect,
                    "version {version} size {size} field at {at}"
                );
            }
        }
        // Exact values of a 2.30.5 struct.
        let cfg = parse_image(&image(23005, 96, NCCL_API_MAGIC)).unwrap();
        assert_eq!(cfg.blocking, 1);
        assert_eq!(cfg.split_share, 1);
        assert_eq!(cfg.net_name, 0x1004);
        assert_eq!(cfg.comm_name, 0x1007);
        assert_eq!(cfg.graph_stream_ordering, 117);
    }

    #[test]
    fn version_gates_fields_even_when_size_covers_them() {
        // A 2.29 caller that (wrongly) passes the full size: its maxP2pPeers slot is junk.
        let cfg = parse_image(&image(nccl_version(2, 29, 0), 96, NCCL_API_MAGIC)).unwrap();
        assert_eq!(cfg.max_p2p_peers, UNDEF_INT);
        assert_eq!(cfg.graph_stream_ordering, UNDEF_INT);
        assert_ne!(cfg.num_rma_ctx, UNDEF_INT);
        // A pre-2.14 "config" (version 2.13) has not even blocking.
        let cfg = parse_image(&image(nccl_version(2, 13, 0), 96, NCCL_API_MAGIC)).unwrap();
        assert_eq!(cfg.blocking, UNDEF_INT);
    }

    #[test]
    fn wrong_magic_and_bad_size() {
        let e = parse_image(&image(23007, 96, 0xdead_beef)).unwrap_err();
        assert_eq!(e.code() as i32, 4);
        assert!(e.to_string().contains("magic"), "{e}");
        let e = parse_image(&image(23007, 8, NCCL_API_MAGIC)).unwrap_err();
        assert_eq!(e.code() as i32, 4);
        let mut h = [0u8; CONFIG_HEADER];
        h[8..12].copy_from_slice(&NCCL_API_MAGIC.to_ne_bytes());
        h[0..8].copy_from_slice(&4u64.to_ne_bytes());
        assert!(read_header(&h).is_err());
        h[0..8].copy_from_slice(&200u64.to_ne_bytes());
        assert_eq!(read_header(&h).unwrap().0, 200);
    }

    #[test]
    fn initializer_image_is_all_unset() {
        let c = NcclConfig::initializer();
        // SAFETY: NcclConfig is repr(C), fully initialised, and has no padding bytes
        // (96 bytes of fields); reading it as bytes is sound.
        let bytes = unsafe {
            std::slice::from_raw_parts(&c as *const NcclConfig as *const u8, CONFIG_SIZE)
        };
        let raw = parse_image(bytes).unwrap();
        let cc = to_comm_config(&raw, None, None).unwrap();
        assert_eq!(cc, CommConfig::default());
        let cc = to_comm_config(&raw, None, Some(false)).unwrap();
        assert_eq!(cc.blocking, Some(false));
    }

    #[test]
    fn conversion_and_validation() {
        let mut raw = parse_image(&image(23007, 96, NCCL_API_MAGIC)).unwrap();
        let cc = to_comm_config(&raw, Some("job".into()), Some(false)).unwrap();
        // The struct wins over the environment.
        assert_eq!(cc.blocking, Some(true));
        assert_eq!(cc.min_ctas, Some(102));
        assert_eq!(cc.max_ctas, Some(103));
        assert_eq!(cc.split_share, Some(true));
        assert_eq!(cc.comm_name.as_deref(), Some("job"));

        raw.blocking = 2;
        let e = to_comm_config(&raw, None, None).unwrap_err();
        assert!(e.to_string().contains("blocking"), "{e}");
        raw.blocking = 0;
        raw.min_ctas = 0;
        assert!(to_comm_config(&raw, None, None)
            .unwrap_err()
            .to_string()
            .contains("minCTAs"));
        raw.min_ctas = 8;
        raw.max_ctas = 4;
        assert!(to_comm_config(&raw, None, None).is_err());
        raw.max_ctas = UNDEF_INT;
        raw.split_share = -3;
        assert!(to_comm_config(&raw, None, None).is_err());
        raw.split_share = 0;
        let cc = to_comm_config(&raw, None, None).unwrap();
        assert_eq!(cc.blocking, Some(false));
        assert_eq!(cc.min_ctas, Some(8));
        assert_eq!(cc.max_ctas, None);
        assert_eq!(cc.split_share, Some(false));
    }

    #[test]
    fn env_blocking() {
        assert_eq!(parse_env_blocking(None).unwrap(), None);
        assert_eq!(parse_env_blocking(Some("")).unwrap(), None);
        assert_eq!(parse_env_blocking(Some("0")).unwrap(), Some(false));
        assert_eq!(parse_env_blocking(Some(" 1 ")).unwrap(), Some(true));
        let e = parse_env_blocking(Some("yes")).unwrap_err();
        assert!(e.to_string().contains("NCCL_COMM_BLOCKING"));
    }

    #[test]
    fn version_macro() {
        assert_eq!(nccl_version(2, 30, 7), 23007);
        assert_eq!(nccl_version(2, 8, 4), 2804);
        assert_eq!(nccl_version(2, 9, 6), 20906);
    }
}
