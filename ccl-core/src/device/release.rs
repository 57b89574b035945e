//! Deferred release of the memory peers map (issue 15, blocker 7). A device communicator's
//! inbound FIFOs are written (and their counters read) by its peers' kernels through raw
//! addresses, CUDA IPC or host-staged shared memory. Freeing them at destroy while a peer
//! may still reach them (its last operation still draining, or its init still opening our
//! staging segment) is a use-after-free on the device, or an init failure of the peer.
//!
//! `ncclCommDestroy` is not collective (nccl-tests `-g N` destroys its N ranks one after
//! the other from one thread), so destroy cannot wait in a barrier. Instead, at destroy,
//! once this rank's own operations drained, it tells every connected peer "done with your
//! memory" over the bootstrap, and a release thread frees what the peers map once each of
//! them said the same, bounded by a time limit (then it frees anyway, with a WARN naming
//! the late peers). Everything else (streams, mappings of peers' memory) is released at
//! once, on the caller's thread.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::bootstrap::Bootstrap;

/// Bootstrap tag of the "done with your memory" message.
pub(crate) const TAG_RELEASE: u32 = 0x6465_7603;

/// The distinct peers (other than `me`) among `peers`, sorted. Pure.
pub fn connected_peers(peers: impl IntoIterator<Item = usize>, me: usize) -> Vec<usize> {
    let mut v: Vec<usize> = peers.into_iter().filter(|p| *p != me).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Tells `peers` that this rank no longer touches their memory (errors, such as a peer
/// process that already exited, are logged at debug level: nothing to wait for then).
pub(crate) fn notify(boot: &Bootstrap, peers: &[usize]) {
    for &p in peers {
        if let Err(e) = boot.send(p, TAG_RELEASE, &[]) {
            tracing::debug!(target: "nccl::INIT", rank = boot.rank(), "release notice to rank {p}: {e}");
        }
    }
}

/// Waits until every one of `peers` said it is done with our memory, or `limit` passed.
/// Returns the peers that did not (a peer whose bootstrap link failed counts as done: its
/// process is gone, and with it its kernels).
pub(crate) fn wait(boot: &Bootstrap, peers: &[usize], limit: Duration) -> Vec<usize> {
    let deadline = Instant::now() + limit;
    let mut late = Vec::new();
    for &p in peers {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            late.push(p);
            continue;
        }
        match boot.recv_timeout(p, TAG_RELEASE, left) {
            Ok(_) => {}
            Err(e) if Instant::now() >= deadline => {
                tracing::debug!(target: "nccl::INIT", rank = boot.rank(), "release notice of rank {p}: {e}");
                late.push(p);
            }
            Err(e) => {
                tracing::debug!(target: "nccl::INIT", rank = boot.rank(), "release notice of rank {p}: {e}");
            }
        }
    }
    late
}

/// Runs `free` on a release thread once `peers` are done with our memory (see the module
/// doc), at most `limit` later. `what` names the communicator in logs. Without peers,
/// `free` runs at once on the calling thread.
pub(crate) fn defer(
    boot: Arc<Bootstrap>,
    peers: Vec<usize>,
    limit: Duration,
    what: String,
    free: Box<dyn FnOnce() + Send>,
) {
    if peers.is_empty() {
        free();
        return;
    }
    let run = move || {
        let late = wait(&boot, &peers, limit);
        if !late.is_empty() {
            tracing::warn!(target: "nccl::INIT", rank = boot.rank(),
                "{what}: ranks {late:?} did not finish with this rank's FIFOs within {limit:?} \
                 of its destroy; freeing them anyway");
        }
        free();
    };
    let spawned = std::thread::Builder::new()
        .name("ccl-release".into())
        .spawn(run);
    if let Err(e) = spawned {
        // No thread: leak rather than free under a peer's feet.
        tracing::warn!(target: "nccl::INIT", "{e}: cannot start the release thread; leaking the FIFOs");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::get_unique_id;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc;

    fn form(n: usize) -> Vec<Arc<Bootstrap>> {
        let id = get_unique_id().unwrap();
        let hs: Vec<_> = (0..n)
            .map(|r| {
                std::thread::spawn(move || {
                    let abort = Arc::new(AtomicBool::new(false));
                    Arc::new(Bootstrap::init(&id, n, r, abort, Duration::from_secs(20)).unwrap())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn peers_are_distinct_and_exclude_self() {
        assert_eq!(connected_peers([3, 1, 3, 2, 1], 2), vec![1, 3]);
        assert!(connected_peers([0, 0], 0).is_empty());
    }

    #[test]
    fn memory_is_freed_only_after_the_peer_is_done() {
        let b = form(2);
        let (tx, rx) = mpsc::channel();
        // Rank 0 destroys first: its release waits for rank 1.
        notify(&b[0], &[1]);
        defer(
            Arc::clone(&b[0]),
            vec![1],
            Duration::from_secs(20),
            "comm r0".into(),
            Box::new(move || tx.send(0).unwrap()),
        );
        assert!(
            rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "freed while rank 1 may still use it"
        );
        // Rank 1 destroys: both releases complete.
        let (tx1, rx1) = mpsc::channel();
        notify(&b[1], &[0]);
        defer(
            Arc::clone(&b[1]),
            vec![0],
            Duration::from_secs(20),
            "comm r1".into(),
            Box::new(move || tx1.send(1).unwrap()),
        );
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), 0);
        assert_eq!(rx1.recv_timeout(Duration::from_secs(10)).unwrap(), 1);
    }

    #[test]
    fn a_peer_that_never_finishes_delays_the_release_by_the_limit_only() {
        let b = form(2);
        let freed = Arc::new(AtomicBool::new(false));
        let f2 = Arc::clone(&freed);
        let t0 = Instant::now();
        let late = wait(&b[0], &[1], Duration::from_millis(300));
        assert_eq!(late, vec![1]);
        assert!(t0.elapsed() >= Duration::from_millis(300));
        assert!(t0.elapsed() < Duration::from_secs(5));
        defer(
            Arc::clone(&b[0]),
            Vec::new(),
            Duration::from_secs(1),
            "no peers".into(),
            Box::new(move || f2.store(true, Ordering::SeqCst)),
        );
        assert!(freed.load(Ordering::SeqCst), "no peers: freed at once");
    }
}
