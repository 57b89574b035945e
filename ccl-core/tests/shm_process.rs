//! The FIFO and doorbells between two processes: this test binary re-executes itself as the
//! peer (`--exact child_peer_entry` with the segment name in an environment variable).

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ccl_core::internal::transport::shm::{
    segment_name, Backoff, Carve, Doorbell, FifoLayout, FifoReceiver, FifoSender, ShmRegion,
    SHM_DIR,
};

const ENV: &str = "CCL_SHM_TEST_PEER_SEGMENT";
const N: u64 = 50_000;
const LAYOUT: FifoLayout = FifoLayout {
    nslots: 8,
    slot_bytes: 300,
};

/// Offsets in the segment: parent's bell, child's bell, parent->child FIFO, child->parent
/// FIFO, a "mapped" counter.
struct Offsets {
    parent_bell: usize,
    child_bell: usize,
    down: usize,
    up: usize,
    mapped: usize,
    total: usize,
}

fn offsets() -> Offsets {
    let mut c = Carve::new();
    let parent_bell = c.take(Doorbell::BYTES).unwrap();
    let child_bell = c.take(Doorbell::BYTES).unwrap();
    let mapped = c.take(8).unwrap();
    let down = c.take(LAYOUT.bytes()).unwrap();
    let up = c.take(LAYOUT.bytes()).unwrap();
    Offsets {
        parent_bell,
        child_bell,
        down,
        up,
        mapped,
        total: c.total(),
    }
}

fn msg_len(i: u64) -> usize {
    (i.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 50) as usize % (LAYOUT.slot_bytes + 1)
}

fn msg_byte(i: u64, j: usize) -> u8 {
    (i as u8) ^ (j as u8).wrapping_mul(13) ^ 0xa5
}

/// Echo transform applied by the child.
fn echo(b: u8) -> u8 {
    b.rotate_left(3) ^ 0x3c
}

fn send(
    tx: &mut FifoSender,
    me: &Doorbell,
    peer: &Doorbell,
    b: &mut Backoff,
    f: impl FnOnce(&mut [u8]) -> usize,
) {
    let mut f = Some(f);
    loop {
        let seen = me.value();
        if let Some(slot) = tx.try_reserve() {
            let len = (f.take().unwrap())(slot);
            tx.commit(len);
            peer.ring();
            b.reset();
            return;
        }
        b.snooze(me, seen);
    }
}

fn recv<T>(
    rx: &mut FifoReceiver,
    me: &Doorbell,
    peer: &Doorbell,
    b: &mut Backoff,
    f: impl FnOnce(&[u8]) -> T,
) -> T {
    let mut f = Some(f);
    loop {
        let seen = me.value();
        if let Some(data) = rx.try_peek() {
            let v = (f.take().unwrap())(data);
            rx.release();
            peer.ring();
            b.reset();
            return v;
        }
        b.snooze(me, seen);
    }
}

/// Peer side; does nothing unless started by `two_processes_exchange_and_echo`.
#[test]
#[ignore = "peer process entry point, run by two_processes_exchange_and_echo"]
fn child_peer_entry() {
    let Ok(name) = std::env::var(ENV) else {
        return;
    };
    let o = offsets();
    let r = Arc::new(ShmRegion::open_timeout(&name, Duration::from_secs(10)).unwrap());
    assert_eq!(r.len(), o.total);
    // Everyone has mapped it now: remove the name.
    r.unlink().unwrap();
    r.atomic_u64(o.mapped)
        .unwrap()
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let me = Doorbell::new(r.clone(), o.child_bell).unwrap();
    let peer = Doorbell::new(r.clone(), o.parent_bell).unwrap();
    peer.ring();
    let mut rx = FifoReceiver::new(r.clone(), o.down, LAYOUT).unwrap();
    let mut tx = FifoSender::new(r.clone(), o.up, LAYOUT).unwrap();
    let (mut b1, mut b2) = (Backoff::new(), Backoff::new());
    let mut buf = Vec::with_capacity(LAYOUT.slot_bytes);
    for _ in 0..N {
        buf.clear();
        recv(&mut rx, &me, &peer, &mut b1, |d| buf.extend_from_slice(d));
        send(&mut tx, &me, &peer, &mut b2, |slot| {
            for (d, s) in slot.iter_mut().zip(&buf) {
                *d = echo(*s);
            }
            buf.len()
        });
    }
}

#[test]
fn two_processes_exchange_and_echo() {
    let o = offsets();
    let name = segment_name("ccltest", 0x2bc, &[N]);
    let r = Arc::new(ShmRegion::create(&name, o.total).unwrap());
    let me = Doorbell::new(r.clone(), o.parent_bell).unwrap();
    let peer = Doorbell::new(r.clone(), o.child_bell).unwrap();
    let mut tx = FifoSender::new(r.clone(), o.down, LAYOUT).unwrap();
    let mut rx = FifoReceiver::new(r.clone(), o.up, LAYOUT).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_peer_entry",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ENV, &name)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);

    // Pipeline: keep up to `window` messages outstanding, check every echo.
    let mut sent = 0u64;
    let mut got = 0u64;
    let mut backoff = Backoff::new();
    while got < N {
        // The peer may exit (successfully) once its last echo is queued; a failed peer or
        // the deadline ends the test.
        let failed = matches!(child.try_wait(), Ok(Some(st)) if !st.success());
        if Instant::now() > deadline || failed {
            let _ = child.kill();
            let status = child.wait().unwrap();
            panic!("peer failed or timed out after {got}/{N} echoes: {status}");
        }
        let seen = me.value();
        let mut progressed = false;
        if sent < N {
            if let Some(slot) = tx.try_reserve() {
                let len = msg_len(sent);
                for (j, b) in slot[..len].iter_mut().enumerate() {
                    *b = msg_byte(sent, j);
                }
                tx.commit(len);
                peer.ring();
                sent += 1;
                progressed = true;
            }
        }
        if let Some(data) = rx.try_peek() {
            assert_eq!(data.len(), msg_len(got), "echo {got} length");
            for (j, b) in data.iter().enumerate() {
                assert_eq!(*b, echo(msg_byte(got, j)), "echo {got} byte {j}");
            }
            rx.release();
            peer.ring();
            got += 1;
            progressed = true;
        }
        if progressed {
            backoff.reset();
        } else {
            backoff.snooze(&me, seen);
        }
    }
    let status = child.wait().unwrap();
    assert!(status.success(), "peer exited with {status}");
    assert_eq!(
        r.atomic_u64(o.mapped)
            .unwrap()
            .load(std::sync::atomic::Ordering::SeqCst),
        1
    );
    assert!(
        !std::path::Path::new(SHM_DIR).join(&name).exists(),
        "peer unlinked the segment once mapped"
    );
    assert!(rx.try_peek().is_none());
    assert_eq!(tx.in_flight(), 0);
}

/// A doorbell rung from another process wakes a waiter here (shared, not private, futex).
#[test]
fn doorbell_across_processes() {
    let name = segment_name("ccltest", 0xbe11, &[]);
    let r = Arc::new(ShmRegion::create(&name, 64).unwrap());
    let bell = Doorbell::new(r.clone(), 0).unwrap();
    let seen = bell.value();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_ring_entry",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("CCL_SHM_TEST_RING_SEGMENT", &name)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while bell.value() == seen && t0.elapsed() < Duration::from_secs(30) {
        bell.wait(seen, Duration::from_secs(30));
    }
    let waited = t0.elapsed();
    assert_ne!(bell.value(), seen, "never rung");
    assert!(child.wait().unwrap().success());
    // The child sleeps 50 ms then rings; a missed futex wake-up would cost the full 30 s.
    assert!(waited < Duration::from_secs(10), "woke after {waited:?}");
}

/// Peer side of `doorbell_across_processes`.
#[test]
#[ignore = "peer process entry point, run by doorbell_across_processes"]
fn child_ring_entry() {
    let Ok(name) = std::env::var("CCL_SHM_TEST_RING_SEGMENT") else {
        return;
    };
    let r = Arc::new(ShmRegion::open_timeout(&name, Duration::from_secs(10)).unwrap());
    let bell = Doorbell::new(r, 0).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    bell.ring();
}
