//! The exported functions called directly from Rust: argument checking, error codes,
//! last-error text, configuration reading, unsupported functions. None of these needs a
//! working communicator.

use std::ffi::{c_void, CStr};
use std::ptr::{null, null_mut};

use ccl_core::bootstrap::UniqueId;
use nccl::api::*;
use nccl::config::{nccl_version, NcclConfig, NCCL_API_MAGIC};

fn last_error() -> String {
    // SAFETY: ncclGetLastError returns a NUL-terminated string valid until the next call.
    unsafe { CStr::from_ptr(ncclGetLastError(null_mut())) }
        .to_string_lossy()
        .into_owned()
}

const INVALID_ARGUMENT: i32 = 4;
const INVALID_USAGE: i32 = 5;

#[test]
fn version_and_error_strings() {
    let mut v = 0;
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { ncclGetVersion(&mut v) }, 0);
    assert_eq!(v, 23007);
    // SAFETY: the profiling alias has the same contract.
    assert_eq!(unsafe { pncclGetVersion(&mut v) }, 0);
    // SAFETY: null is handled.
    assert_eq!(unsafe { ncclGetVersion(null_mut()) }, INVALID_ARGUMENT);
    assert!(last_error().contains("version is NULL"), "{}", last_error());
    let s = |c| {
        // SAFETY: ncclGetErrorString returns static NUL-terminated strings.
        let p = unsafe { ncclGetErrorString(c) };
        // SAFETY: p is a static NUL-terminated string (ncclGetErrorString's result).
        unsafe { CStr::from_ptr(p) }.to_str().unwrap()
    };
    assert_eq!(s(0), "no error");
    assert_eq!(
        s(3),
        "internal error - please report this issue to the NCCL developers"
    );
    assert_eq!(s(7), "NCCL operation in progress");
    assert_eq!(s(9), "unknown result code");
}

#[test]
fn null_and_stale_handles_are_errors() {
    let mut n = 0;
    // SAFETY: null/junk handles are checked before use.
    unsafe {
        assert_eq!(ncclCommCount(null_mut(), &mut n), INVALID_ARGUMENT);
        assert!(last_error().contains("comm is NULL"));
        let junk = 0xdead_b000usize as *mut c_void;
        assert_eq!(ncclCommUserRank(junk, &mut n), INVALID_ARGUMENT);
        assert!(last_error().contains("not a live communicator"));
        assert_eq!(ncclCommFinalize(junk), INVALID_ARGUMENT);
        assert_eq!(ncclCommDestroy(junk), INVALID_ARGUMENT);
        assert_eq!(ncclCommAbort(junk), INVALID_ARGUMENT);
        // NULL destroy/abort succeed, as in NCCL.
        assert_eq!(ncclCommDestroy(null_mut()), 0);
        assert_eq!(ncclCommAbort(null_mut()), 0);
        let mut buf = [0f32; 4];
        let p = buf.as_mut_ptr().cast::<c_void>();
        assert_eq!(
            ncclAllReduce(p, p, 4, 7, 0, junk, null_mut()),
            INVALID_ARGUMENT
        );
        assert_eq!(
            ncclBcast(p, 4, 7, 0, null_mut(), null_mut()),
            INVALID_ARGUMENT
        );
        assert_eq!(
            ncclRedOpDestroy(0, null_mut()),
            INVALID_ARGUMENT,
            "null comm checked first"
        );
    }
}

#[test]
fn init_argument_checks() {
    let id = UniqueId([0; 128]);
    let mut comm: *mut c_void = std::ptr::dangling_mut::<c_void>();
    // SAFETY: valid out-pointer or null.
    unsafe {
        assert_eq!(ncclCommInitRank(null_mut(), 2, id, 0), INVALID_ARGUMENT);
        assert_eq!(ncclCommInitRank(&mut comm, 0, id, 0), INVALID_ARGUMENT);
        assert!(comm.is_null(), "*comm is cleared on failure");
        assert_eq!(ncclCommInitRank(&mut comm, 4, id, 4), INVALID_ARGUMENT);
        assert!(
            last_error().contains("rank 4 is out of range"),
            "{}",
            last_error()
        );
        assert_eq!(ncclCommInitAll(&mut comm, -1, null()), INVALID_ARGUMENT);
        assert_eq!(
            ncclCommInitAll(&mut comm, i32::MAX, null()),
            INVALID_ARGUMENT
        );
        assert!(
            last_error().contains("one thread per rank"),
            "{}",
            last_error()
        );
        let bad_dev = [0, -5];
        let mut two = [null_mut::<c_void>(); 2];
        assert_eq!(
            ncclCommInitAll(two.as_mut_ptr(), 2, bad_dev.as_ptr()),
            INVALID_ARGUMENT
        );
        assert_eq!(
            ncclCommInitRankScalable(&mut comm, 2, 0, 0, null_mut(), null_mut()),
            INVALID_ARGUMENT
        );
    }
}

/// Byte image of a caller's config built by an older header: `size` bytes, then junk.
fn old_config(version: u32, size: usize, magic: u32, blocking: i32) -> Vec<u64> {
    let mut words = vec![0x5a5a_5a5a_5a5a_5a5au64; 16];
    // SAFETY: viewing the u64 buffer as bytes (128 bytes, properly aligned for the struct).
    let b = unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), 128) };
    b[0..8].copy_from_slice(&(size as u64).to_ne_bytes());
    b[8..12].copy_from_slice(&magic.to_ne_bytes());
    b[12..16].copy_from_slice(&version.to_ne_bytes());
    b[16..20].copy_from_slice(&blocking.to_ne_bytes());
    words
}

#[test]
fn config_is_read_by_size_magic_and_version() {
    let id = UniqueId([0; 128]);
    let mut comm = null_mut();
    // Wrong magic.
    let mut cfg = NcclConfig::initializer();
    cfg.magic = 0x1234;
    // SAFETY: valid config and out-pointer.
    let r = unsafe { ncclCommInitRankConfig(&mut comm, 1, id, 0, &mut cfg) };
    assert_eq!(r, INVALID_ARGUMENT);
    assert!(last_error().contains("magic"), "{}", last_error());
    // Invalid blocking value in a 2.14-sized struct: the field is read...
    let mut img = old_config(nccl_version(2, 14, 0), 24, NCCL_API_MAGIC, 9);
    // SAFETY: the image holds 24 valid bytes (more are readable, as junk).
    let r = unsafe { ncclCommInitRankConfig(&mut comm, 1, id, 0, img.as_mut_ptr().cast()) };
    assert_eq!(r, INVALID_ARGUMENT);
    assert!(last_error().contains("blocking = 9"), "{}", last_error());
    // ...but not in a struct whose version predates the field (junk ignored): the call gets
    // past config parsing to the next check (nranks 0, so nothing touches the network).
    let mut img = old_config(nccl_version(2, 13, 0), 24, NCCL_API_MAGIC, 9);
    // SAFETY: the image holds 24 valid bytes (more are readable, as junk).
    let r = unsafe { ncclCommInitRankConfig(&mut comm, 0, id, 0, img.as_mut_ptr().cast()) };
    assert_eq!(r, INVALID_ARGUMENT);
    assert!(last_error().contains("nranks 0"), "{}", last_error());
    // A size smaller than the header.
    let mut img = old_config(23007, 8, NCCL_API_MAGIC, 0);
    let mut comm = null_mut();
    // SAFETY: the image holds its 8 header bytes (more are readable, as junk).
    let r = unsafe { ncclCommInitRankConfig(&mut comm, 1, id, 0, img.as_mut_ptr().cast()) };
    assert_eq!(r, INVALID_ARGUMENT);
}

#[test]
fn unsupported_functions_say_so() {
    let id = UniqueId([0; 128]);
    let mut out = null_mut();
    // SAFETY: arguments are ignored or checked.
    unsafe {
        assert_eq!(ncclGroupSimulateEnd(null_mut()), INVALID_USAGE);
        assert!(last_error().contains("ncclGroupSimulateEnd is not supported by this library yet"));
        assert_eq!(
            ncclCommGrow(null_mut(), 2, &id, 0, &mut out, null_mut()),
            INVALID_USAGE
        );
        assert!(last_error().contains("ncclCommGrow is not supported by this library yet"));
        assert_eq!(ncclParamGetI32(null_mut(), null_mut()), INVALID_USAGE);
        assert!(last_error().contains("ncclParamGetI32 is not supported"));
        assert_eq!(
            pncclDevCommCreate(null_mut(), null(), null_mut()),
            INVALID_USAGE
        );
        assert!(last_error().contains("ncclDevCommCreate is not supported"));
        ncclParamDumpAll();
        assert!(last_error().contains("ncclParamDumpAll is not supported"));
        // Unsupported functions that take a communicator check it first.
        assert_eq!(ncclCommRevoke(null_mut(), 0), INVALID_ARGUMENT);
        assert_eq!(ncclCommSuspend(null_mut(), 0), INVALID_ARGUMENT);
    }
}

#[test]
fn device_api_helpers() {
    // SAFETY: pure functions / checked handles.
    unsafe {
        assert_eq!(ncclLLA2ACalcSlots(32, 16), 64);
        assert_eq!(ncclLLA2ACalcSlots(10, 1), 10);
        assert_eq!(ncclLLA2ACalcSlots(10, 0), 0);
        assert_eq!(ncclLLA2ACalcSlots(-1, 4), -1);
        assert_eq!(ncclLLA2ACalcSlots(i32::MAX, 64), -1);
        assert_eq!(ncclTeamWorld(null_mut()), Team::default());
        assert!(last_error().contains("ncclTeamWorld"));
        assert_eq!(ncclTeamRankToWorld(null_mut(), Team::default(), 0), -1);
        let mut props = [0u64; 7];
        assert_eq!(
            ncclCommQueryProperties(null_mut(), props.as_mut_ptr().cast()),
            INVALID_ARGUMENT
        );
    }
}

#[test]
fn mem_alloc_and_free() {
    let mut p = null_mut();
    // SAFETY: valid out-pointer; memory used within its size.
    unsafe {
        assert_eq!(ncclMemAlloc(&mut p, 100), 0);
        assert!(!p.is_null() && (p as usize).is_multiple_of(4096));
        std::ptr::write_bytes(p.cast::<u8>(), 1, 100);
        assert_eq!(ncclMemFree(p), 0);
        assert_eq!(ncclMemFree(p), INVALID_ARGUMENT);
        assert!(last_error().contains("not returned by ncclMemAlloc"));
        assert_eq!(ncclMemFree(null_mut()), 0);
        assert_eq!(ncclMemAlloc(null_mut(), 100), INVALID_ARGUMENT);
    }
}

#[test]
fn last_error_is_per_thread() {
    // SAFETY: null is handled.
    assert_eq!(unsafe { ncclGetVersion(null_mut()) }, INVALID_ARGUMENT);
    let here = last_error();
    assert!(here.contains("version is NULL"));
    let there = std::thread::spawn(last_error).join().unwrap();
    assert_eq!(there, "", "another thread sees no error");
}
