//! Every export of NVIDIA's `libnccl.so.2` 2.30.7, as `ncclX` and `pncclX`.
//!
//! Each body runs inside [`boundary::call`] (panic boundary, error code, last-error
//! message). All `unsafe` of the crate that touches caller memory is in this module and in
//! [`crate::mem`].

#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::Arc;

use ccl_core::bootstrap::UniqueId;
use ccl_core::{CclError, Comm, CommConfig, DataType, Result, ScalarArg};
use ccl_optype::CollKind;

use crate::boundary::{self, call, call_value, unsupported, NcclResult};
use crate::config::{self, NcclConfig, CONFIG_HEADER, CONFIG_SIZE};
use crate::handles::{self, CommHandle};
use crate::mem;

/// `cudaStream_t` (ignored by the host backend).
pub type CudaStream = *mut c_void;
/// `ncclWindow_t`.
pub type Window = *mut c_void;
/// `ncclParamHandle_t`.
pub type ParamHandle = *mut c_void;
/// `ncclDataType_t`.
pub type NcclDataType = c_int;
/// `ncclRedOp_t`.
pub type NcclRedOp = c_int;

/// `ncclNumOps`: first value of ops created at run time.
pub const NCCL_NUM_OPS: c_int = 5;
/// Most ranks `ncclCommInitAll` creates in one process (each is a thread on this backend).
pub const MAX_INIT_ALL: c_int = 4096;
/// `NCCL_SPLIT_NOCOLOR`.
pub const NCCL_SPLIT_NOCOLOR: c_int = -1;

/// `ncclTeam_t` of NCCL's device API (`{nRanks, rank, stride}`), passed by value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Team {
    pub n_ranks: c_int,
    pub rank: c_int,
    pub stride: c_int,
}

/// `ncclWaitSignalDesc_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct WaitSignalDesc {
    pub op_cnt: c_int,
    pub peer: c_int,
    pub sig_idx: c_int,
    pub ctx: c_int,
}

/// Defines `ncclX` and its profiling alias `pncclX` with one body.
macro_rules! export {
    ($(#[doc = $doc:literal])* fn $name:ident / $pname:ident ( $($arg:ident : $ty:ty),* $(,)? ) -> $ret:ty $body:block) => {
        $(#[doc = $doc])*
        ///
        /// # Safety
        /// Pointer arguments must be null or valid for the reads and writes NCCL documents
        /// for this function; handles must come from this library.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret $body

        #[doc = concat!("Profiling alias of [`", stringify!($name), "`].")]
        ///
        /// # Safety
        /// As for the `nccl` name.
        #[no_mangle]
        pub unsafe extern "C" fn $pname($($arg: $ty),*) -> $ret {
            // SAFETY: the caller upholds the same contract as for the aliased function.
            unsafe { $name($($arg),*) }
        }
    };
}

/// Writes `v` to a caller's out-pointer, or fails naming the argument when it is null.
///
/// # Safety
/// A non-null `p` must be valid for writing a `T` (the C caller's contract).
unsafe fn put<T>(p: *mut T, v: T, what: &str) -> Result<()> {
    if p.is_null() {
        return Err(CclError::arg(format!("{what} is NULL")));
    }
    // SAFETY: non-null, and valid for writes as NCCL's API requires of the C caller (the
    // export's `# Safety`); `write_unaligned` makes no alignment assumption.
    unsafe { p.write_unaligned(v) };
    Ok(())
}

/// Reads a caller's C string (lossily), `None` for null.
///
/// # Safety
/// A non-null `p` must point to a NUL-terminated string.
unsafe fn c_str(p: *const c_char) -> Option<String> {
    if p.is_null() {
        None
    } else {
        // SAFETY: non-null and NUL-terminated, as NCCL's API requires of the C caller (the
        // export's `# Safety`).
        Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }
}

/// `NCCL_COMM_BLOCKING`.
fn env_blocking() -> Result<Option<bool>> {
    config::parse_env_blocking(ccl_core::env::var(&ccl_params::NCCL_COMM_BLOCKING)?.as_deref())
}

/// Reads a caller's `ncclConfig_t` by its size/magic/version. `None` (null pointer) gives
/// the default configuration. `with_env`: apply `NCCL_COMM_BLOCKING` when blocking is unset
/// (init; not split, where unset fields inherit from the parent).
///
/// # Safety
/// A non-null `cfg` must point to at least `min(cfg->size, sizeof(ncclConfig_t))` readable
/// bytes, and its `commName`/`netName` must be null or NUL-terminated strings.
unsafe fn read_config(cfg: *const NcclConfig, with_env: bool) -> Result<CommConfig> {
    let env = if with_env { env_blocking()? } else { None };
    if cfg.is_null() {
        return Ok(CommConfig {
            blocking: env,
            ..CommConfig::default()
        });
    }
    let mut header = [0u8; CONFIG_HEADER];
    // SAFETY: every ncclConfig_t version starts with the 16-byte header; the caller's
    // struct is readable for it. Byte copy: no alignment assumption.
    unsafe { std::ptr::copy_nonoverlapping(cfg.cast::<u8>(), header.as_mut_ptr(), CONFIG_HEADER) };
    let (size, _, _) = config::read_header(&header)?;
    let n = size.min(CONFIG_SIZE);
    let mut image = vec![0u8; n];
    // SAFETY: the caller's struct has `size` readable bytes (its own sizeof) and n <= size.
    unsafe { std::ptr::copy_nonoverlapping(cfg.cast::<u8>(), image.as_mut_ptr(), n) };
    let raw = config::parse_image(&image)?;
    // SAFETY: commName is null or a NUL-terminated string (NCCL's API requires it of the C
    // caller: the export's `# Safety`).
    let name = unsafe { c_str(raw.comm_name as *const c_char) };
    if raw.net_name != 0 {
        // SAFETY: netName is null or a NUL-terminated string (NCCL's API requires it of the C
        // caller: the export's `# Safety`).
        let net = unsafe { c_str(raw.net_name as *const c_char) };
        tracing::info!(target: "nccl::ENV", "ncclConfig_t.netName {:?} ignored by the host backend", net);
    }
    config::to_comm_config(&raw, name, env)
}

/// A config value for logs: the number, or `default`.
fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "default".to_string(), |v| v.to_string())
}

fn check_rank_args(nranks: c_int, rank: c_int) -> Result<()> {
    if nranks < 1 {
        return Err(CclError::arg(format!("nranks {nranks} must be at least 1")));
    }
    if rank < 0 || rank >= nranks {
        return Err(CclError::arg(format!(
            "rank {rank} is out of range for nranks {nranks}"
        )));
    }
    Ok(())
}

/// Shared body of the rank-init functions.
///
/// # Safety
/// `out` null or writable; `cfg` as for [`read_config`].
unsafe fn init_rank(
    out: *mut CommHandle,
    nranks: c_int,
    id: UniqueId,
    rank: c_int,
    cfg: *const NcclConfig,
) -> Result<()> {
    // SAFETY: `out` is null or writable (this function's `# Safety`).
    unsafe { put(out, std::ptr::null_mut(), "comm")? };
    // SAFETY: `cfg` is null or a config as `read_config` requires (this function's
    // `# Safety`).
    let cfg = unsafe { read_config(cfg, true)? };
    check_rank_args(nranks, rank)?;
    ccl_core::debug::show_version();
    tracing::info!(
        target: "nccl::INIT",
        rank,
        "ncclCommInitRank nranks {nranks} rank {rank} blocking {} minCTAs {} maxCTAs {} splitShare {} commName {:?}",
        opt(cfg.blocking.map(i32::from)),
        opt(cfg.min_ctas),
        opt(cfg.max_ctas),
        opt(cfg.split_share.map(i32::from)),
        cfg.comm_name.as_deref().unwrap_or("")
    );
    let nonblocking = cfg.blocking == Some(false);
    // Inside ncclGroupStart/End the init completes at the outermost ncclGroupEnd.
    let comm = ccl_core::init_rank(nranks, id, rank, cfg)?;
    let h = handles::register(comm.clone());
    // SAFETY: `out` is writable (this function's `# Safety`; `put` above found it non-null).
    unsafe { put(out, h, "comm")? };
    if nonblocking {
        return comm.async_error();
    }
    Ok(())
}

/// Shared body of the collectives and p2p calls.
#[allow(clippy::too_many_arguments)]
fn collective(
    kind: CollKind,
    comm: CommHandle,
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: usize,
    dtype: NcclDataType,
    op: NcclRedOp,
    root: c_int,
    stream: CudaStream,
) -> Result<()> {
    // A call that fails inside a group fails the group (`ccl_core::enqueue` does the same
    // for its own checks).
    let c = handles::get(comm).inspect_err(ccl_core::fail_in_group)?;
    // ccl-core validates the rest (data type, operator, root or peer, buffers), after the
    // communicator's state, in NCCL's order (`ncclEnqueueCheck`: the communicator is
    // ready before its arguments are checked).
    // ccl-core logs the NCCL-style INFO line of each operation (with its opCount); this is
    // the raw call as received, for NCCL_DEBUG=TRACE NCCL_DEBUG_SUBSYS=CALL.
    tracing::debug!(
        target: "nccl::CALL",
        rank = c.rank(),
        "{}: sendbuff {:p} recvbuff {:p} count {} datatype {} op {} root {} comm {:p} [nranks={}] stream {:p}",
        kind.name(), sendbuf, recvbuf, count, dtype, op, root, comm, c.nranks(), stream
    );
    ccl_core::enqueue(
        &c,
        ccl_core::CollArgs {
            kind,
            sendbuf: sendbuf as usize,
            recvbuf: recvbuf as usize,
            count,
            dtype,
            op,
            root,
            stream: stream as usize,
        },
    )
}

// ---------------------------------------------------------------------------------------
// Library

export! {
    /// Allocates memory usable as NCCL buffers: device memory of the current device when
    /// the device backend is in use, page-aligned zeroed host memory otherwise.
    fn ncclMemAlloc / pncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> NcclResult {
        call("ncclMemAlloc", || {
            if ptr.is_null() {
                return Err(CclError::arg("ptr is NULL"));
            }
            let p = mem::alloc(size)?.ptr;
            // SAFETY: `ptr` is non-null and writable (NCCL's API requires it of the C caller:
            // the export's `# Safety`).
            unsafe { put(ptr, p as *mut c_void, "ptr") }
        })
    }
}

export! {
    /// Frees memory from `ncclMemAlloc`.
    fn ncclMemFree / pncclMemFree(ptr: *mut c_void) -> NcclResult {
        call("ncclMemFree", || mem::free(ptr as usize))
    }
}

export! {
    /// Writes `NCCL_VERSION_CODE` (23007).
    fn ncclGetVersion / pncclGetVersion(version: *mut c_int) -> NcclResult {
        call("ncclGetVersion", || {
            // SAFETY: `version` is null or points to writable memory for one value, as nccl.h
            // requires of the C caller; `put` rejects null and writes unaligned.
            unsafe { put(version, config::NCCL_VERSION_CODE as c_int, "version") }
        })
    }
}

export! {
    /// Creates the id of a new communicator (starts the bootstrap root in this process).
    fn ncclGetUniqueId / pncclGetUniqueId(unique_id: *mut UniqueId) -> NcclResult {
        call("ncclGetUniqueId", || {
            if unique_id.is_null() {
                return Err(CclError::arg("uniqueId is NULL"));
            }
            let id = ccl_core::bootstrap::get_unique_id()?;
            // SAFETY: `unique_id` is null or points to writable memory for one value, as nccl.h
            // requires of the C caller; `put` rejects null and writes unaligned.
            unsafe { put(unique_id, id, "uniqueId") }
        })
    }
}

export! {
    /// NCCL's fixed description of a result code.
    fn ncclGetErrorString / pncclGetErrorString(result: NcclResult) -> *const c_char {
        boundary::error_string(result).as_ptr()
    }
}

export! {
    /// Message of the last failing call on this thread (or of `comm` when this thread has
    /// none); empty string when there is none.
    fn ncclGetLastError / pncclGetLastError(comm: CommHandle) -> *const c_char {
        let fallback = std::panic::catch_unwind(|| {
            if comm.is_null() {
                None
            } else {
                handles::get(comm).ok().and_then(|c| c.last_error())
            }
        })
        .unwrap_or(None);
        boundary::last_error_ptr(fallback)
    }
}

// ---------------------------------------------------------------------------------------
// Communicator creation

export! {
    /// Creates rank `rank` of an `nranks` communicator with a configuration.
    fn ncclCommInitRankConfig / pncclCommInitRankConfig(
        comm: *mut CommHandle,
        nranks: c_int,
        comm_id: UniqueId,
        rank: c_int,
        config: *mut NcclConfig,
    ) -> NcclResult {
        // SAFETY: `comm` is null or writable and `config` null or a valid ncclConfig_t, as
        // nccl.h requires of the C caller (what `init_rank` needs).
        call("ncclCommInitRankConfig", || unsafe { init_rank(comm, nranks, comm_id, rank, config) })
    }
}

export! {
    /// Creates rank `rank` of an `nranks` communicator.
    fn ncclCommInitRank / pncclCommInitRank(
        comm: *mut CommHandle,
        nranks: c_int,
        comm_id: UniqueId,
        rank: c_int,
    ) -> NcclResult {
        // SAFETY: `comm` is null or writable, as nccl.h requires of the C caller; no config.
        call("ncclCommInitRank", || unsafe { init_rank(comm, nranks, comm_id, rank, std::ptr::null()) })
    }
}

export! {
    /// Creates all `ndev` ranks of a communicator in this process.
    fn ncclCommInitAll / pncclCommInitAll(comm: *mut CommHandle, ndev: c_int, devlist: *const c_int) -> NcclResult {
        call("ncclCommInitAll", || {
            if comm.is_null() {
                return Err(CclError::arg("comm is NULL"));
            }
            if !(1..=MAX_INIT_ALL).contains(&ndev) {
                return Err(CclError::arg(format!(
                    "ndev {ndev} must be between 1 and {MAX_INIT_ALL} (one thread per rank)"
                )));
            }
            let n = ndev as usize;
            let devs = if devlist.is_null() {
                None
            } else {
                // SAFETY: a non-null devlist holds ndev ints (NCCL's API requires it of the C
                // caller: the export's `# Safety`).
                Some(unsafe { std::slice::from_raw_parts(devlist, n) }.to_vec())
            };
            if let Some(d) = &devs {
                if let Some(bad) = d.iter().find(|v| **v < 0) {
                    return Err(CclError::arg(format!("devlist contains invalid device {bad}")));
                }
            }
            ccl_core::debug::show_version();
            let comms = Comm::init_all(ndev, devs)?;
            if comms.len() != n {
                return Err(CclError::Internal(format!(
                    "init_all returned {} communicators for ndev {ndev}",
                    comms.len()
                )));
            }
            for (i, c) in comms.into_iter().enumerate() {
                let h = handles::register(c);
                // SAFETY: comm points to ndev writable handles (NCCL's API requires it of the C
                // caller: the export's `# Safety`).
                unsafe { comm.add(i).write_unaligned(h) };
            }
            Ok(())
        })
    }
}

export! {
    /// Like `ncclCommInitRankConfig` with several ids. This library bootstraps through the
    /// first id (every rank holds the same list, so all agree); the others stay unused.
    fn ncclCommInitRankScalable / pncclCommInitRankScalable(
        newcomm: *mut CommHandle,
        nranks: c_int,
        myrank: c_int,
        n_id: c_int,
        comm_ids: *mut UniqueId,
        config: *mut NcclConfig,
    ) -> NcclResult {
        call("ncclCommInitRankScalable", || {
            if n_id < 1 {
                return Err(CclError::arg(format!("nId {n_id} must be at least 1")));
            }
            if comm_ids.is_null() {
                return Err(CclError::arg("commIds is NULL"));
            }
            // SAFETY: comm_ids holds nId >= 1 ids (NCCL's API requires it of the C caller: the
            // export's `# Safety`); read unaligned copy.
            let id = unsafe { comm_ids.read_unaligned() };
            // SAFETY: `newcomm` is null or writable and `config` null or a valid
            // ncclConfig_t, as nccl.h requires of the C caller.
            unsafe { init_rank(newcomm, nranks, id, myrank, config) }
        })
    }
}

// ---------------------------------------------------------------------------------------
// Communicator lifetime

/// Removes `comm` from the handle table and runs `end` (destroy or abort) on it; NULL is
/// accepted and does nothing, as in NCCL. The table's reference is dropped afterwards.
fn release(comm: CommHandle, end: impl FnOnce(&Comm) -> Result<()>) -> Result<()> {
    if comm.is_null() {
        return Ok(());
    }
    let c = handles::remove(comm)?;
    end(&c)
}

export! {
    /// Completes outstanding operations of `comm`.
    fn ncclCommFinalize / pncclCommFinalize(comm: CommHandle) -> NcclResult {
        call("ncclCommFinalize", || handles::get(comm)?.finalize())
    }
}

export! {
    /// Frees `comm`. NULL is accepted and does nothing (as in NCCL).
    fn ncclCommDestroy / pncclCommDestroy(comm: CommHandle) -> NcclResult {
        call("ncclCommDestroy", || {
            release(comm, |c| c.destroy())
        })
    }
}

export! {
    /// Aborts `comm`'s operations and frees it. NULL is accepted and does nothing.
    fn ncclCommAbort / pncclCommAbort(comm: CommHandle) -> NcclResult {
        call("ncclCommAbort", || {
            release(comm, |c| c.abort())
        })
    }
}

export! {
    /// Not supported yet.
    fn ncclCommRevoke / pncclCommRevoke(comm: CommHandle, _revoke_flags: c_int) -> NcclResult {
        call("ncclCommRevoke", || {
            handles::get(comm)?;
            Err(unsupported("ncclCommRevoke"))
        })
    }
}

export! {
    /// Splits `comm` by color/key. `NCCL_SPLIT_NOCOLOR` gives a NULL `newcomm`. A NULL
    /// config (or unset fields) inherits the parent's settings.
    fn ncclCommSplit / pncclCommSplit(
        comm: CommHandle,
        color: c_int,
        key: c_int,
        newcomm: *mut CommHandle,
        config: *mut NcclConfig,
    ) -> NcclResult {
        call("ncclCommSplit", || {
            // SAFETY: `newcomm` is null or points to writable memory for one value, as nccl.h
            // requires of the C caller; `put` rejects null and writes unaligned.
            unsafe { put(newcomm, std::ptr::null_mut(), "newcomm")? };
            let c = handles::get(comm)?;
            if color < 0 && color != NCCL_SPLIT_NOCOLOR {
                return Err(CclError::arg(format!(
                    "color {color} must be non-negative or NCCL_SPLIT_NOCOLOR"
                )));
            }
            // SAFETY: `config` is null or a valid ncclConfig_t, as nccl.h requires of the C
            // caller, with `commName`/`netName` null or NUL-terminated (what `read_config` needs).
            let cfg = unsafe { read_config(config, false)? };
            let nonblocking = cfg.blocking == Some(false);
            match c.split(color, key, cfg)? {
                None => Ok(()),
                Some(child) => {
                    let h = handles::register(child.clone());
                    // SAFETY: checked non-null above.
                    unsafe { put(newcomm, h, "newcomm")? };
                    if nonblocking {
                        child.async_error()
                    } else {
                        Ok(())
                    }
                }
            }
        })
    }
}

export! {
    /// Not supported yet.
    fn ncclCommShrink / pncclCommShrink(
        comm: CommHandle,
        _exclude_ranks_list: *mut c_int,
        _exclude_ranks_count: c_int,
        newcomm: *mut CommHandle,
        _config: *mut NcclConfig,
        _shrink_flags: c_int,
    ) -> NcclResult {
        call("ncclCommShrink", || {
            if !newcomm.is_null() {
                // SAFETY: `newcomm` is null or points to writable memory for one value, as nccl.h
                // requires of the C caller; `put` rejects null and writes unaligned.
                unsafe { put(newcomm, std::ptr::null_mut(), "newcomm")? };
            }
            handles::get(comm)?;
            Err(unsupported("ncclCommShrink"))
        })
    }
}

export! {
    /// The unique id `comm` was created from.
    fn ncclCommGetUniqueId / pncclCommGetUniqueId(comm: CommHandle, unique_id: *mut UniqueId) -> NcclResult {
        call("ncclCommGetUniqueId", || {
            let c = handles::get(comm)?;
            if unique_id.is_null() {
                return Err(CclError::arg("uniqueId is NULL"));
            }
            let id = c.unique_id()?;
            // SAFETY: `unique_id` is null or points to writable memory for one value, as nccl.h
            // requires of the C caller; `put` rejects null and writes unaligned.
            unsafe { put(unique_id, id, "uniqueId") }
        })
    }
}

export! {
    /// Not supported yet.
    fn ncclCommGrow / pncclCommGrow(
        _comm: CommHandle,
        _n_ranks: c_int,
        _unique_id: *const UniqueId,
        _rank: c_int,
        newcomm: *mut CommHandle,
        _config: *mut NcclConfig,
    ) -> NcclResult {
        call("ncclCommGrow", || {
            if !newcomm.is_null() {
                // SAFETY: `newcomm` is null or points to writable memory for one value, as nccl.h
                // requires of the C caller; `put` rejects null and writes unaligned.
                unsafe { put(newcomm, std::ptr::null_mut(), "newcomm")? };
            }
            Err(unsupported("ncclCommGrow"))
        })
    }
}

export! {
    /// Not supported yet.
    fn ncclCommSuspend / pncclCommSuspend(comm: CommHandle, _flags: c_int) -> NcclResult {
        call("ncclCommSuspend", || {
            handles::get(comm)?;
            Err(unsupported("ncclCommSuspend"))
        })
    }
}

export! {
    /// Not supported yet.
    fn ncclCommResume / pncclCommResume(comm: CommHandle) -> NcclResult {
        call("ncclCommResume", || {
            handles::get(comm)?;
            Err(unsupported("ncclCommResume"))
        })
    }
}

export! {
    /// Not supported yet.
    fn ncclCommMemStats / pncclCommMemStats(comm: CommHandle, _stat: c_int, _value: *mut u64) -> NcclResult {
        call("ncclCommMemStats", || {
            handles::get(comm)?;
            Err(unsupported("ncclCommMemStats"))
        })
    }
}

export! {
    /// Re-reads `NCCL_DEBUG`, `NCCL_DEBUG_SUBSYS` and `NCCL_DEBUG_FILE`.
    fn ncclResetDebugInit / pncclResetDebugInit() -> () {
        let _ = std::panic::catch_unwind(ccl_core::debug::reload);
    }
}

/// NCCL's internal name of `ncclResetDebugInit` (exported by NVIDIA's library too).
///
/// # Safety
/// No arguments; always safe to call.
#[no_mangle]
pub unsafe extern "C" fn ncclResetDebugInitInternal() {
    let _ = std::panic::catch_unwind(ccl_core::debug::reload);
}

// ---------------------------------------------------------------------------------------
// Queries

export! {
    /// Writes `ncclSuccess`, `ncclInProgress` or the error that broke `comm`.
    fn ncclCommGetAsyncError / pncclCommGetAsyncError(comm: CommHandle, async_error: *mut NcclResult) -> NcclResult {
        call("ncclCommGetAsyncError", || {
            let c = handles::get(comm)?;
            let code = match c.async_error() {
                Ok(()) => 0,
                Err(e) => e.code() as NcclResult,
            };
            // SAFETY: `async_error` is null or points to writable memory for one value, as nccl.h
            // requires of the C caller; `put` rejects null and writes unaligned.
            unsafe { put(async_error, code, "asyncError") }
        })
    }
}

export! {
    /// Number of ranks of `comm`.
    fn ncclCommCount / pncclCommCount(comm: CommHandle, count: *mut c_int) -> NcclResult {
        call("ncclCommCount", || {
            let c = handles::get(comm)?;
            // SAFETY: `count` is null or points to writable memory for one value, as nccl.h
            // requires of the C caller; `put` rejects null and writes unaligned.
            unsafe { put(count, c.nranks(), "count") }
        })
    }
}

export! {
    /// Device of `comm` (host backend: the device given at init, else 0).
    fn ncclCommCuDevice / pncclCommCuDevice(comm: CommHandle, device: *mut c_int) -> NcclResult {
        call("ncclCommCuDevice", || {
            let c = handles::get(comm)?;
            // SAFETY: `device` is null or points to writable memory for one value, as nccl.h
            // requires of the C caller; `put` rejects null and writes unaligned.
            unsafe { put(device, c.cuda_device(), "device") }
        })
    }
}

export! {
    /// Rank of this process/thread in `comm`.
    fn ncclCommUserRank / pncclCommUserRank(comm: CommHandle, rank: *mut c_int) -> NcclResult {
        call("ncclCommUserRank", || {
            let c = handles::get(comm)?;
            // SAFETY: `rank` is null or points to writable memory for one value, as nccl.h
            // requires of the C caller; `put` rejects null and writes unaligned.
            unsafe { put(rank, c.rank(), "rank") }
        })
    }
}

// ---------------------------------------------------------------------------------------
// Registration

export! {
    /// Registers a user buffer; writes an opaque non-NULL handle.
    fn ncclCommRegister / pncclCommRegister(comm: CommHandle, buff: *mut c_void, size: usize, handle: *mut *mut c_void) -> NcclResult {
        call("ncclCommRegister", || {
            let c = handles::get(comm)?;
            if handle.is_null() {
                return Err(CclError::arg("handle is NULL"));
            }
            if buff.is_null() && size > 0 {
                return Err(CclError::arg("buff is NULL"));
            }
            let h = c.register(buff as usize, size)?;
            // SAFETY: `handle` is null or points to writable memory for one value, as nccl.h
            // requires of the C caller; `put` rejects null and writes unaligned.
            unsafe { put(handle, h as *mut c_void, "handle") }
        })
    }
}

export! {
    /// Deregisters a handle from `ncclCommRegister`.
    fn ncclCommDeregister / pncclCommDeregister(comm: CommHandle, handle: *mut c_void) -> NcclResult {
        call("ncclCommDeregister", || {
            let c = handles::get(comm)?;
            if handle.is_null() {
                return Err(CclError::arg("handle is NULL"));
            }
            c.deregister(handle as usize)
        })
    }
}

export! {
    /// Not supported yet (symmetric memory windows).
    fn ncclCommWindowRegister / pncclCommWindowRegister(
        comm: CommHandle,
        _buff: *mut c_void,
        _size: usize,
        win: *mut Window,
        _win_flags: c_int,
    ) -> NcclResult {
        call("ncclCommWindowRegister", || {
            if !win.is_null() {
                // SAFETY: `win` is null or points to writable memory for one value, as nccl.h
                // requires of the C caller; `put` rejects null and writes unaligned.
                unsafe { put(win, std::ptr::null_mut(), "win")? };
            }
            handles::get(comm)?;
            Err(unsupported("ncclCommWindowRegister"))
        })
    }
}

export! {
    /// Not supported yet.
    fn ncclCommWindowDeregister / pncclCommWindowDeregister(comm: CommHandle, _win: Window) -> NcclResult {
        call("ncclCommWindowDeregister", || {
            handles::get(comm)?;
            Err(unsupported("ncclCommWindowDeregister"))
        })
    }
}

export! {
    /// Not supported yet.
    fn ncclWinGetUserPtr / pncclWinGetUserPtr(comm: CommHandle, _win: Window, _out_user_ptr: *mut *mut c_void) -> NcclResult {
        call("ncclWinGetUserPtr", || {
            handles::get(comm)?;
            Err(unsupported("ncclWinGetUserPtr"))
        })
    }
}

// ---------------------------------------------------------------------------------------
// Reduction operations

export! {
    /// Creates a PreMulSum operation (`residence` 0: scalar read at each operation; 1: copied now).
    fn ncclRedOpCreatePreMulSum / pncclRedOpCreatePreMulSum(
        op: *mut NcclRedOp,
        scalar: *mut c_void,
        datatype: NcclDataType,
        residence: c_int,
        comm: CommHandle,
    ) -> NcclResult {
        call("ncclRedOpCreatePreMulSum", || {
            let c = handles::get(comm)?;
            if op.is_null() {
                return Err(CclError::arg("op is NULL"));
            }
            if scalar.is_null() {
                return Err(CclError::arg("scalar is NULL"));
            }
            let dt = DataType::from_raw(datatype)?;
            let arg = match residence {
                0 => ScalarArg::Device(scalar as usize),
                1 => {
                    // SAFETY: a host-immediate scalar holds one element of `dt`.
                    let bytes = unsafe { std::slice::from_raw_parts(scalar as *const u8, dt.size()) };
                    ScalarArg::HostImmediate(bytes.to_vec())
                }
                r => return Err(CclError::arg(format!("invalid scalar residence {r}"))),
            };
            let v = c.create_premulsum(arg, dt)?;
            // SAFETY: `op` is null or points to writable memory for one value, as nccl.h
            // requires of the C caller; `put` rejects null and writes unaligned.
            unsafe { put(op, v, "op") }
        })
    }
}

export! {
    /// Destroys an operation from `ncclRedOpCreatePreMulSum`.
    fn ncclRedOpDestroy / pncclRedOpDestroy(op: NcclRedOp, comm: CommHandle) -> NcclResult {
        call("ncclRedOpDestroy", || {
            let c = handles::get(comm)?;
            if op < NCCL_NUM_OPS {
                return Err(CclError::arg(format!(
                    "op {op} is a built-in operation and cannot be destroyed"
                )));
            }
            c.destroy_redop(op)
        })
    }
}

// ---------------------------------------------------------------------------------------
// Collectives

export! {
    /// Reduce to `root`.
    fn ncclReduce / pncclReduce(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: NcclDataType,
        op: NcclRedOp,
        root: c_int,
        comm: CommHandle,
        stream: CudaStream,
    ) -> NcclResult {
        call("ncclReduce", || collective(CollKind::Reduce, comm, sendbuff, recvbuff, count, datatype, op, root, stream))
    }
}

export! {
    /// In-place broadcast from `root` (deprecated in NCCL).
    fn ncclBcast / pncclBcast(
        buff: *mut c_void,
        count: usize,
        datatype: NcclDataType,
        root: c_int,
        comm: CommHandle,
        stream: CudaStream,
    ) -> NcclResult {
        call("ncclBcast", || collective(CollKind::Broadcast, comm, buff, buff, count, datatype, 0, root, stream))
    }
}

export! {
    /// Broadcast from `root`.
    fn ncclBroadcast / pncclBroadcast(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: NcclDataType,
        root: c_int,
        comm: CommHandle,
        stream: CudaStream,
    ) -> NcclResult {
        call("ncclBroadcast", || collective(CollKind::Broadcast, comm, sendbuff, recvbuff, count, datatype, 0, root, stream))
    }
}

export! {
    /// All-reduce.
    fn ncclAllReduce / pncclAllReduce(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: NcclDataType,
        op: NcclRedOp,
        comm: CommHandle,
        stream: CudaStream,
    ) -> NcclResult {
        call("ncclAllReduce", || collective(CollKind::AllReduce, comm, sendbuff, recvbuff, count, datatype, op, -1, stream))
    }
}

export! {
    /// Reduce-scatter (`recvcount` elements per rank).
    fn ncclReduceScatter / pncclReduceScatter(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        recvcount: usize,
        datatype: NcclDataType,
        op: NcclRedOp,
        comm: CommHandle,
        stream: CudaStream,
    ) -> NcclResult {
        call("ncclReduceScatter", || collective(CollKind::ReduceScatter, comm, sendbuff, recvbuff, recvcount, datatype, op, -1, stream))
    }
}

export! {
    /// All-gather (`sendcount` elements per rank).
    fn ncclAllGather / pncclAllGather(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        sendcount: usize,
        datatype: NcclDataType,
        comm: CommHandle,
        stream: CudaStream,
    ) -> NcclResult {
        call("ncclAllGather", || collective(CollKind::AllGather, comm, sendbuff, recvbuff, sendcount, datatype, 0, -1, stream))
    }
}

export! {
    /// All-to-all (`count` elements per peer).
    fn ncclAlltoAll / pncclAlltoAll(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: NcclDataType,
        comm: CommHandle,
        stream: CudaStream,
    ) -> NcclResult {
        call("ncclAlltoAll", || collective(CollKind::AlltoAll, comm, sendbuff, recvbuff, count, datatype, 0, -1, stream))
    }
}

export! {
    /// Gather to `root` (`count` elements per rank).
    fn ncclGather / pncclGather(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: NcclDataType,
        root: c_int,
        comm: CommHandle,
        stream: CudaStream,
    ) -> NcclResult {
        call("ncclGather", || collective(CollKind::Gather, comm, sendbuff, recvbuff, count, datatype, 0, root, stream))
    }
}

export! {
    /// Scatter from `root` (`count` elements per rank).
    fn ncclScatter / pncclScatter(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: NcclDataType,
        root: c_int,
        comm: CommHandle,
        stream: CudaStream,
    ) -> NcclResult {
        call("ncclScatter", || collective(CollKind::Scatter, comm, sendbuff, recvbuff, count, datatype, 0, root, stream))
    }
}

export! {
    /// Sends `count` elements to `peer`.
    fn ncclSend / pncclSend(
        sendbuff: *const c_void,
        count: usize,
        datatype: NcclDataType,
        peer: c_int,
        comm: CommHandle,
        stream: CudaStream,
    ) -> NcclResult {
        call("ncclSend", || collective(CollKind::Send, comm, sendbuff, std::ptr::null_mut(), count, datatype, 0, peer, stream))
    }
}

export! {
    /// Receives `count` elements from `peer`.
    fn ncclRecv / pncclRecv(
        recvbuff: *mut c_void,
        count: usize,
        datatype: NcclDataType,
        peer: c_int,
        comm: CommHandle,
        stream: CudaStream,
    ) -> NcclResult {
        call("ncclRecv", || collective(CollKind::Recv, comm, std::ptr::null(), recvbuff, count, datatype, 0, peer, stream))
    }
}

// ---------------------------------------------------------------------------------------
// Groups

export! {
    /// Starts (or nests) a group.
    fn ncclGroupStart / pncclGroupStart() -> NcclResult {
        call("ncclGroupStart", ccl_core::group_start)
    }
}

export! {
    /// Ends a group; the outermost end runs everything queued.
    fn ncclGroupEnd / pncclGroupEnd() -> NcclResult {
        call("ncclGroupEnd", ccl_core::group_end)
    }
}

export! {
    /// Not supported yet.
    fn ncclGroupSimulateEnd / pncclGroupSimulateEnd(_sim_info: *mut c_void) -> NcclResult {
        call("ncclGroupSimulateEnd", || Err(unsupported("ncclGroupSimulateEnd")))
    }
}

// After `export!`: the module uses it (textual scope).
mod extras;

pub use extras::*;
