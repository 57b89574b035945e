//! The channel and buffer settings of a communicator, from `ncclConfig_t` and the
//! environment (`Tuning::resolve` is pure; `from_env` reads the process environment).

use super::*;

/// Looks a declared environment variable up (`Ok(None)` when unset or empty).
type EnvGet<'a> = &'a dyn Fn(&env::Param) -> Result<Option<String>>;

fn env_u64(get: EnvGet<'_>, p: &env::Param) -> Result<Option<u64>> {
    get(p)?.map(|v| env::parse_u64(p, &v)).transpose()
}

impl Tuning {
    /// Reads the process environment and the config (environment wins).
    pub(super) fn from_env(cfg: &CommConfig) -> Result<Tuning> {
        Self::resolve(cfg, &env::var)
    }

    /// Pure resolution of the channel/buffer settings from `cfg` and the variables `get`
    /// returns: `NCCL_MIN_CTAS` (else `NCCL_MIN_NCHANNELS`, else `cfg.min_ctas`, else 1),
    /// `NCCL_MAX_CTAS` (else `NCCL_MAX_NCHANNELS`, else `cfg.max_ctas`, else 4), both
    /// clamped to 1..=32 with min <= max; `NCCL_BUFFSIZE` (512 B..=1 GiB, default 1 MiB);
    /// `CCLD_PEER_CHECK_MS` (>= 1, default 200).
    pub(super) fn resolve(cfg: &CommConfig, get: EnvGet<'_>) -> Result<Tuning> {
        let pick = |ctas: &env::Param, nch: &env::Param, c: Option<u32>| -> Result<Option<u64>> {
            Ok(match env_u64(get, ctas)? {
                Some(v) => Some(v),
                None => env_u64(get, nch)?.or(c.map(u64::from)),
            })
        };
        let min = pick(
            &ccl_params::NCCL_MIN_CTAS,
            &ccl_params::NCCL_MIN_NCHANNELS,
            cfg.min_ctas,
        )?
        .unwrap_or(1);
        let max = pick(
            &ccl_params::NCCL_MAX_CTAS,
            &ccl_params::NCCL_MAX_NCHANNELS,
            cfg.max_ctas,
        )?
        .unwrap_or(DEFAULT_MAX_CHANNELS as u64);
        let max = (max.clamp(1, MAX_CHANNELS as u64)) as usize;
        let min = (min.clamp(1, MAX_CHANNELS as u64) as usize).min(max);
        // Bounds (512 B = 8 slots of one cache line, .. 1 GiB) checked by the declaration.
        let buffsize = env_u64(get, &ccl_params::NCCL_BUFFSIZE)?.unwrap_or(DEFAULT_BUFFSIZE as u64);
        let buffsize = buffsize as usize;
        let layout = FifoLayout::for_buffer(buffsize, FIFO_SLOTS)
            .map_err(|e| crate::error::with_context(e, "NCCL_BUFFSIZE"))?;
        // At least 1 (the declaration's bound).
        let peer_check_ms =
            env_u64(get, &ccl_params::CCLD_PEER_CHECK_MS)?.unwrap_or(DEFAULT_PEER_CHECK_MS);
        Ok(Tuning {
            min_channels: min,
            max_channels: max,
            buffsize,
            nslots: FIFO_SLOTS,
            slot_bytes: layout.slot_bytes,
            peer_check: Duration::from_millis(peer_check_ms),
        })
    }

    /// Channels of p2p links.
    pub(crate) fn p2p_channels(&self) -> usize {
        self.max_channels.min(P2P_MAX_CHANNELS)
    }

    pub(super) fn layout(&self) -> FifoLayout {
        FifoLayout {
            nslots: self.nslots,
            slot_bytes: self.slot_bytes,
        }
    }
}
