//! Slot FIFO and doorbells between threads: bulk transfer with content check, head/tail
//! protocol stress, misuse errors, and 8 producer/consumer pairs sharing the machine's cores.

use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ccl_core::internal::transport::shm::{
    segment_name, Backoff, Carve, Doorbell, FifoLayout, FifoReceiver, FifoSender, ShmRegion,
};
use ccl_core::CclError;

/// Runs `f` on a thread and fails the test (instead of hanging) if it takes over `limit`.
fn bounded<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)));
    });
    match rx.recv_timeout(limit) {
        Ok(Ok(v)) => v,
        Ok(Err(p)) => std::panic::resume_unwind(p),
        Err(_) => panic!("test body did not finish within {limit:?}"),
    }
}

/// Deterministic message length/content for message `i` (independent of the FIFO code).
fn msg_len(i: u64, max: usize) -> usize {
    (i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) as usize % (max + 1)
}

fn msg_byte(i: u64, j: usize) -> u8 {
    (i as u8)
        .wrapping_mul(31)
        .wrapping_add(j as u8)
        .wrapping_add((i >> 8) as u8)
}

/// A link: FIFO plus a doorbell for each side, in one region.
struct Link {
    region: Arc<ShmRegion>,
    fifo: usize,
    layout: FifoLayout,
    prod_bell: usize,
    cons_bell: usize,
}

fn link(region: Option<&str>, layout: FifoLayout) -> Link {
    let mut c = Carve::new();
    let prod_bell = c.take(Doorbell::BYTES).unwrap();
    let cons_bell = c.take(Doorbell::BYTES).unwrap();
    let fifo = c.take(layout.bytes()).unwrap();
    let region = match region {
        Some(n) => {
            let r = ShmRegion::create(n, c.total()).unwrap();
            // Both ends map this same handle: unlink at once, as the runtime does once every
            // peer has mapped, so an aborted test leaves nothing in /dev/shm.
            r.unlink().unwrap();
            r
        }
        None => ShmRegion::anonymous(c.total()).unwrap(),
    };
    Link {
        region: Arc::new(region),
        fifo,
        layout,
        prod_bell,
        cons_bell,
    }
}

/// Producer loop: `n` messages of variable length, reserve/write/commit/ring, snoozing on
/// its own doorbell when full.
fn produce(l: &Link, n: u64) -> FifoSender {
    let mut tx = FifoSender::new(l.region.clone(), l.fifo, l.layout).unwrap();
    let me = Doorbell::new(l.region.clone(), l.prod_bell).unwrap();
    let peer = Doorbell::new(l.region.clone(), l.cons_bell).unwrap();
    let mut backoff = Backoff::new();
    for i in 0..n {
        loop {
            let seen = me.value();
            if let Some(slot) = tx.try_reserve() {
                assert_eq!(slot.len(), l.layout.slot_bytes);
                let len = msg_len(i, slot.len());
                for (j, b) in slot[..len].iter_mut().enumerate() {
                    *b = msg_byte(i, j);
                }
                tx.commit(len);
                peer.ring();
                backoff.reset();
                break;
            }
            backoff.snooze(&me, seen);
        }
    }
    tx
}

/// Consumer loop: checks each message's length and content, returns how many were checked.
fn consume(l: &Link, n: u64) -> u64 {
    let mut rx = FifoReceiver::new(l.region.clone(), l.fifo, l.layout).unwrap();
    let me = Doorbell::new(l.region.clone(), l.cons_bell).unwrap();
    let peer = Doorbell::new(l.region.clone(), l.prod_bell).unwrap();
    let mut backoff = Backoff::new();
    for i in 0..n {
        loop {
            let seen = me.value();
            if let Some(data) = rx.try_peek() {
                assert_eq!(
                    data.len(),
                    msg_len(i, l.layout.slot_bytes),
                    "length of message {i}"
                );
                for (j, b) in data.iter().enumerate() {
                    assert_eq!(*b, msg_byte(i, j), "byte {j} of message {i}");
                }
                rx.release();
                peer.ring();
                backoff.reset();
                break;
            }
            backoff.snooze(&me, seen);
        }
    }
    assert!(rx.try_peek().is_none(), "nothing beyond the {n} messages");
    assert_eq!(rx.released(), n);
    n
}

#[test]
fn threads_move_200k_variable_length_messages() {
    bounded(Duration::from_secs(60), || {
        let n = 200_000;
        let l = Arc::new(link(
            Some(&segment_name("ccltest", 1, &[200_000])),
            FifoLayout {
                nslots: 8,
                slot_bytes: 200,
            },
        ));
        let l2 = l.clone();
        let t0 = Instant::now();
        let p = std::thread::spawn(move || produce(&l2, n));
        assert_eq!(consume(&l, n), n);
        let tx = p.join().unwrap();
        assert_eq!(tx.committed(), n);
        assert_eq!(tx.in_flight(), 0);
        eprintln!("200k messages in {:?}", t0.elapsed());
    });
}

/// Every message fills its whole slot with its sequence number. The consumer checks the
/// slot before and after a pause: a slot read before its commit would hold an older number,
/// a slot overwritten before its release would change during the pause.
#[test]
fn head_tail_protocol_stress_no_early_read_no_early_overwrite() {
    bounded(Duration::from_secs(90), || {
        for nslots in [1usize, 2, 3, 5, 8] {
            let layout = FifoLayout {
                nslots,
                slot_bytes: 256,
            };
            let l = Arc::new(link(None, layout));
            let n = 30_000u64;
            let l2 = l.clone();
            let producer = std::thread::spawn(move || {
                let mut tx = FifoSender::new(l2.region.clone(), l2.fifo, l2.layout).unwrap();
                let mut spins = 0u64;
                for i in 1..=n {
                    let slot = loop {
                        // Reserving twice before commit hands out the same slot.
                        if tx.try_reserve().is_some() {
                            break tx.try_reserve().unwrap();
                        }
                        spins += 1;
                        if spins.is_multiple_of(64) {
                            std::thread::yield_now();
                        } else {
                            std::hint::spin_loop();
                        }
                    };
                    for w in slot.chunks_exact_mut(8) {
                        w.copy_from_slice(&i.to_le_bytes());
                    }
                    // Vary the committed length; the slot is always written whole.
                    tx.commit(8 * (1 + (i as usize % 32)));
                    assert!(tx.in_flight() <= nslots);
                }
                tx
            });
            let mut rx = FifoReceiver::new(l.region.clone(), l.fifo, l.layout).unwrap();
            let mut idle = 0u64;
            let mut i = 1u64;
            while i <= n {
                let Some(data) = rx.try_peek() else {
                    idle += 1;
                    if idle.is_multiple_of(64) {
                        std::thread::yield_now();
                    }
                    continue;
                };
                assert_eq!(data.len(), 8 * (1 + (i as usize % 32)), "len of {i}");
                let check = |data: &[u8], when: &str| {
                    for w in data.chunks_exact(8) {
                        let v = u64::from_le_bytes(w.try_into().unwrap());
                        assert_eq!(v, i, "nslots {nslots}: message {i} {when}");
                    }
                };
                check(data, "at peek");
                // Give the producer a chance to (wrongly) overwrite the slot.
                if i.is_multiple_of(7) {
                    std::thread::yield_now();
                } else {
                    for _ in 0..(i % 50) {
                        std::hint::spin_loop();
                    }
                }
                let again = rx.try_peek().unwrap();
                check(again, "before release");
                rx.release();
                i += 1;
            }
            let tx = producer.join().unwrap();
            assert_eq!(tx.committed(), n);
            assert_eq!(rx.released(), n);
            assert!(rx.try_peek().is_none());
            assert_eq!(rx.pending(), 0);
        }
    });
}

#[test]
fn full_empty_and_misuse() {
    let layout = FifoLayout {
        nslots: 3,
        slot_bytes: 64,
    };
    let r = Arc::new(ShmRegion::anonymous(layout.bytes()).unwrap());
    let mut tx = FifoSender::new(r.clone(), 0, layout).unwrap();
    let mut rx = FifoReceiver::new(r.clone(), 0, layout).unwrap();
    assert!(rx.try_peek().is_none());
    assert!(matches!(tx.try_commit(1), Err(CclError::InvalidUsage(_))));
    for k in 0..3u8 {
        let s = tx.try_reserve().unwrap();
        s[0] = k;
        assert!(matches!(tx.try_commit(65), Err(CclError::InvalidUsage(_))));
        tx.try_commit(1).unwrap();
        assert_eq!(tx.in_flight(), usize::from(k) + 1);
    }
    assert!(tx.try_reserve().is_none(), "full after nslots commits");
    assert_eq!(rx.pending(), 3);
    assert_eq!(rx.try_peek().unwrap(), &[0]);
    assert!(tx.try_reserve().is_none(), "peeking does not free the slot");
    rx.release();
    assert_eq!(tx.in_flight(), 2);
    let s = tx.try_reserve().unwrap();
    s[..3].copy_from_slice(b"abc");
    tx.commit(3);
    assert_eq!(rx.try_peek().unwrap(), &[1]);
    rx.release();
    assert_eq!(rx.try_peek().unwrap(), &[2]);
    rx.release();
    assert_eq!(rx.try_peek().unwrap(), b"abc");
    rx.release();
    assert!(rx.try_peek().is_none());
    // Zero-length messages are messages.
    tx.try_reserve().unwrap();
    tx.commit(0);
    assert_eq!(rx.try_peek().unwrap(), &[] as &[u8]);
    rx.release();
    assert_eq!(tx.in_flight(), 0);

    // Ends re-attached to the same FIFO resume where it stands.
    drop(tx);
    drop(rx);
    let mut tx = FifoSender::new(r.clone(), 0, layout).unwrap();
    let mut rx = FifoReceiver::new(r.clone(), 0, layout).unwrap();
    assert_eq!(tx.committed(), 5);
    tx.try_reserve().unwrap()[0] = 9;
    tx.commit(1);
    assert_eq!(rx.try_peek().unwrap(), &[9]);
    rx.release();
}

#[test]
fn corrupt_counters_are_reported_not_followed() {
    let layout = FifoLayout {
        nslots: 4,
        slot_bytes: 64,
    };
    let n = segment_name("ccltest", 0xbad, &[]);
    let a = Arc::new(ShmRegion::create(&n, layout.bytes()).unwrap());
    // A second mapping plays the scribbling peer (claims are per mapping, like per process).
    let peer = ShmRegion::open(&n).unwrap();
    let head = peer.atomic_u64(FifoLayout::HEAD_OFFSET).unwrap();
    let tail = peer.atomic_u64(FifoLayout::TAIL_OFFSET).unwrap();
    let len0 = peer.atomic_u64(layout.len_word_offset(0)).unwrap();

    // Counters that cannot come from the protocol are refused at attach time.
    head.store(100, Ordering::SeqCst);
    for e in [
        FifoReceiver::new(a.clone(), 0, layout).unwrap_err(),
        FifoSender::new(a.clone(), 0, layout).unwrap_err(),
    ] {
        assert!(matches!(e, CclError::Remote(_)), "{e}");
    }
    head.store(0, Ordering::SeqCst);
    let mut tx = FifoSender::new(a.clone(), 0, layout).unwrap();
    let mut rx = FifoReceiver::new(a.clone(), 0, layout).unwrap();

    // A length word larger than the slot.
    tx.try_reserve().unwrap();
    tx.commit(8);
    len0.store(65, Ordering::SeqCst);
    assert!(matches!(rx.try_peek_checked(), Err(CclError::Remote(_))));
    assert!(rx.try_peek().is_none());
    len0.store(8, Ordering::SeqCst);
    assert_eq!(rx.try_peek().unwrap().len(), 8);
    rx.release();

    // A head that jumps past the ring, or goes backwards.
    head.store(1 + 4 + 1, Ordering::SeqCst);
    assert!(matches!(rx.try_peek_checked(), Err(CclError::Remote(_))));
    head.store(0, Ordering::SeqCst);
    assert!(matches!(rx.try_peek_checked(), Err(CclError::Remote(_))));
    head.store(1, Ordering::SeqCst);
    assert!(rx.try_peek().is_none());

    // A tail beyond what was committed never lets the producer overwrite unreleased slots.
    for _ in 0..4 {
        tx.try_reserve().unwrap();
        tx.commit(1);
    }
    assert!(tx.try_reserve().is_none());
    tail.store(1000, Ordering::SeqCst);
    assert!(tx.try_reserve().is_none(), "corrupt tail treated as full");
    assert_eq!(tx.in_flight(), 0, "in_flight never underflows");
}

/// 8 producer/consumer pairs (16 threads) on however few cores the machine has (2 in CI)
/// must all finish promptly: waits spin briefly, then yield, then park.
#[test]
fn eight_pairs_make_progress_on_few_cores() {
    bounded(Duration::from_secs(60), || {
        let n = 20_000u64;
        let t0 = Instant::now();
        let mut handles = Vec::new();
        for p in 0..8u64 {
            let l = Arc::new(link(
                Some(&segment_name("ccltest", 8, &[p])),
                FifoLayout {
                    nslots: 8,
                    slot_bytes: 128,
                },
            ));
            let l2 = l.clone();
            handles.push(std::thread::spawn(move || produce(&l2, n).committed()));
            handles.push(std::thread::spawn(move || consume(&l, n)));
        }
        for h in handles {
            assert_eq!(h.join().unwrap(), n);
        }
        let took = t0.elapsed();
        eprintln!(
            "8 pairs x {n} messages on {} cores in {took:?}",
            std::thread::available_parallelism().map_or(0, |c| c.get())
        );
        assert!(took < Duration::from_secs(45), "took {took:?}");
    });
}

#[test]
fn descriptors_travel_with_their_slot_across_wraparound() {
    bounded(Duration::from_secs(20), || {
        let layout = FifoLayout {
            nslots: 3,
            slot_bytes: 64,
        };
        let region = Arc::new(ShmRegion::anonymous(layout.bytes()).unwrap());
        let mut tx = FifoSender::new(Arc::clone(&region), 0, layout).unwrap();
        let mut rx = FifoReceiver::new(Arc::clone(&region), 0, layout).unwrap();
        // Independent expectation: descriptor i is [i, !i, i * 7] and the payload is i bytes
        // of the value i; 2 messages in flight at a time, 50 messages (wrapping 3 slots).
        let desc = |i: u64| [i, !i, i.wrapping_mul(7)];
        let mut sent = 0u64;
        let mut got = 0u64;
        while got < 50 {
            while sent < 50 && sent < got + 2 {
                let s = tx.try_reserve().expect("room");
                let n = (sent % 64) as usize;
                s[..n].fill(sent as u8);
                tx.commit_with_desc(n, desc(sent));
                sent += 1;
            }
            let (data, d) = rx.try_peek_with_desc().unwrap().expect("a message");
            assert_eq!(data.len(), (got % 64) as usize);
            assert!(data.iter().all(|b| *b == got as u8));
            assert_eq!(d, desc(got), "message {got}");
            assert_eq!(rx.peeked_desc(), desc(got));
            rx.release();
            got += 1;
        }
        assert!(rx.try_peek_with_desc().unwrap().is_none());
        assert_eq!(rx.peeked_desc(), [0; 3], "no peeked slot: zeros");
        // A plain commit leaves the slot's previous descriptor words untouched: the runtime
        // always commits with a descriptor, so a stale one can only come from a peer that
        // does not check (never in a job).
        let s = tx.try_reserve().unwrap();
        s[0] = 9;
        tx.commit(1);
        let (_, d) = rx.try_peek_with_desc().unwrap().unwrap();
        assert_eq!(d, desc(47), "slot 50 % 3 == 2 last held message 47");
        rx.release();
    });
}
