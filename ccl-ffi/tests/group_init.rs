//! `ncclCommInitRank` inside `ncclGroupStart/End` (issue 15, blocker 5): one thread creates
//! every rank of a communicator in one group, as NVIDIA's nccl-tests do with `-g 4` (or
//! `-t` with one device), then runs a grouped AllReduce on all of them. Before the fix the
//! first grouped init blocked in the bootstrap, waiting for ranks the same thread had not
//! created yet. Host backend, ranks as threads of this process; the whole scenario runs
//! under a time limit so that a regression fails instead of hanging.

use std::ffi::{c_void, CStr};
use std::ptr::null_mut;
use std::sync::mpsc;
use std::time::Duration;

use ccl_core::bootstrap::UniqueId;
use nccl::api::*;

const NRANKS: usize = 4;
const FLOAT32: i32 = 7;
const SUM: i32 = 0;

fn last_error() -> String {
    // SAFETY: ncclGetLastError returns a NUL-terminated string valid until the next call.
    unsafe { CStr::from_ptr(ncclGetLastError(null_mut())) }
        .to_string_lossy()
        .into_owned()
}

/// Runs `f` on its own thread and fails the test if it takes longer than `limit`.
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("did not finish within {limit:?} (grouped init hangs?)"))
}

fn init_grouped(id: UniqueId) -> Vec<usize> {
    let mut comms = [null_mut::<c_void>(); NRANKS];
    // SAFETY: valid out-pointers; the group is closed below.
    unsafe {
        assert_eq!(ncclGroupStart(), 0);
        for (r, c) in comms.iter_mut().enumerate() {
            assert_eq!(
                ncclCommInitRank(c, NRANKS as i32, id, r as i32),
                0,
                "grouped init of rank {r}: {}",
                last_error()
            );
            assert!(!c.is_null(), "the handle is written at the call");
        }
        assert_eq!(ncclGroupEnd(), 0, "group end: {}", last_error());
    }
    comms.iter().map(|c| *c as usize).collect()
}

#[test]
fn one_thread_inits_four_ranks_in_a_group_then_allreduces() {
    std::env::set_var("CCLD_BACKEND", "host");
    std::env::set_var("CCLD_BOOTSTRAP_IP", "127.0.0.1");
    within(Duration::from_secs(120), || {
        let mut id = UniqueId([0; 128]);
        // SAFETY: valid out-pointer.
        assert_eq!(unsafe { ncclGetUniqueId(&mut id) }, 0);
        let comms = init_grouped(id);
        for (r, c) in comms.iter().enumerate() {
            let (mut rank, mut n, mut err) = (-1, -1, -1);
            // SAFETY: live handles, valid out-pointers.
            unsafe {
                assert_eq!(ncclCommUserRank(*c as *mut c_void, &mut rank), 0);
                assert_eq!(ncclCommCount(*c as *mut c_void, &mut n), 0);
                assert_eq!(ncclCommGetAsyncError(*c as *mut c_void, &mut err), 0);
            }
            assert_eq!((rank, n, err), (r as i32, NRANKS as i32, 0));
        }
        // Grouped AllReduce over the four ranks, from this one thread. Reference: the sum
        // of the inputs computed here element by element (exact in f32 for these values).
        let count = 10_007;
        let sends: Vec<Vec<f32>> = (0..NRANKS)
            .map(|r| (0..count).map(|i| ((i * 7 + r * 3) % 11) as f32).collect())
            .collect();
        let mut recvs = vec![vec![-1f32; count]; NRANKS];
        // SAFETY: buffers outlive the group, which completes them before returning.
        unsafe {
            assert_eq!(ncclGroupStart(), 0);
            for r in 0..NRANKS {
                assert_eq!(
                    ncclAllReduce(
                        sends[r].as_ptr().cast(),
                        recvs[r].as_mut_ptr().cast(),
                        count,
                        FLOAT32,
                        SUM,
                        comms[r] as *mut c_void,
                        null_mut(),
                    ),
                    0,
                    "{}",
                    last_error()
                );
            }
            assert_eq!(ncclGroupEnd(), 0, "{}", last_error());
        }
        for i in 0..count {
            let want: f32 = sends.iter().map(|s| s[i]).sum();
            for (r, recv) in recvs.iter().enumerate() {
                assert_eq!(recv[i], want, "rank {r} element {i}");
            }
        }
        for c in comms {
            // SAFETY: live handle, destroyed once.
            assert_eq!(unsafe { ncclCommDestroy(c as *mut c_void) }, 0);
        }
    });
}

/// A grouped init that cannot complete (rank 1 of 2 never joins) is an error of
/// `ncclGroupEnd`, after the bootstrap timeout, not a hang; argument errors stay immediate.
/// Separate process from the test above (nextest), so the short timeout is private to it.
#[test]
fn a_failing_grouped_init_is_reported_by_group_end() {
    std::env::set_var("CCLD_BACKEND", "host");
    std::env::set_var("CCLD_BOOTSTRAP_IP", "127.0.0.1");
    std::env::set_var("CCLD_BOOTSTRAP_TIMEOUT_S", "2");
    within(Duration::from_secs(60), || {
        let mut id = UniqueId([0; 128]);
        let mut comm = null_mut::<c_void>();
        // SAFETY: valid out-pointers; the group is closed below.
        unsafe {
            assert_eq!(ncclGetUniqueId(&mut id), 0);
            assert_eq!(ncclGroupStart(), 0);
            assert_eq!(
                ncclCommInitRank(&mut comm, 2, id, 5),
                4,
                "an out-of-range rank is refused at the call"
            );
            assert_eq!(ncclCommInitRank(&mut comm, 2, id, 0), 0, "deferred");
            assert!(!comm.is_null());
            let t0 = std::time::Instant::now();
            let rc = ncclGroupEnd();
            assert_ne!(rc, 0, "rank 1 never joined: group end must fail");
            assert!(t0.elapsed() >= Duration::from_secs(1), "{:?}", t0.elapsed());
            let mut err = 0;
            assert_eq!(ncclCommGetAsyncError(comm, &mut err), 0);
            assert_eq!(err, rc, "the communicator carries the same error");
            assert_eq!(ncclCommDestroy(comm), 0);
        }
    });
}
