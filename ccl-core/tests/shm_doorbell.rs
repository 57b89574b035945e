//! Doorbells: a waiter wakes on ring, a wait without ring returns after its timeout, no lost
//! wake-ups in a ping-pong, and the back-off's spin/yield/park phases.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ccl_core::internal::transport::shm::{Backoff, Doorbell, ShmRegion};

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

fn region() -> Arc<ShmRegion> {
    Arc::new(ShmRegion::anonymous(4096).unwrap())
}

#[test]
fn ring_bumps_value_and_wait_returns_at_once_when_value_moved() {
    let r = region();
    let b = Doorbell::new(r, 64).unwrap();
    let v0 = b.value();
    b.ring();
    b.ring();
    assert_eq!(b.value(), v0.wrapping_add(2));
    let t0 = Instant::now();
    b.wait(v0, Duration::from_secs(20)); // value != seen: no sleep
    b.wait(b.value(), Duration::ZERO); // zero timeout: no sleep
    assert!(t0.elapsed() < Duration::from_secs(5));
}

#[test]
fn wait_without_ring_returns_after_timeout() {
    let r = region();
    let b = Doorbell::new(r, 0).unwrap();
    let seen = b.value();
    let t0 = Instant::now();
    b.wait(seen, Duration::from_millis(50));
    let took = t0.elapsed();
    // Spurious early returns are allowed by the contract but do not happen without signals;
    // the upper bound is generous for a loaded 2-core machine.
    assert!(took >= Duration::from_millis(45), "returned after {took:?}");
    assert!(took < Duration::from_secs(5), "returned after {took:?}");
    assert_eq!(b.value(), seen);
}

#[test]
fn waiter_wakes_on_ring_long_before_its_timeout() {
    bounded(Duration::from_secs(60), || {
        let r = region();
        let bell = Arc::new(Doorbell::new(r, 128).unwrap());
        let b2 = bell.clone();
        let seen = bell.value();
        let waiter = std::thread::spawn(move || {
            let t0 = Instant::now();
            while b2.value() == seen {
                b2.wait(seen, Duration::from_secs(30));
            }
            t0.elapsed()
        });
        std::thread::sleep(Duration::from_millis(30));
        let rung = Instant::now();
        bell.ring();
        let waited = waiter.join().unwrap();
        let latency = rung.elapsed();
        assert!(
            waited >= Duration::from_millis(25),
            "woke before the ring: {waited:?}"
        );
        // A missed wake-up would cost the whole 30 s timeout.
        assert!(latency < Duration::from_secs(5), "wake-up took {latency:?}");
        eprintln!("wake-up observed {latency:?} after ring");
    });
}

/// Two threads hand a token back and forth 5,000 times, each sleeping on its own doorbell
/// with a 20 s timeout: any lost wake-up would blow the time bound.
#[test]
fn ping_pong_loses_no_wake_ups() {
    bounded(Duration::from_secs(60), || {
        let r = region();
        let bells = Arc::new([
            Doorbell::new(r.clone(), 64).unwrap(),
            Doorbell::new(r.clone(), 128).unwrap(),
        ]);
        let rounds = 5_000u64;
        let run = move |me: usize, bells: Arc<[Doorbell; 2]>, r: Arc<ShmRegion>| {
            let token: &AtomicU64 = r.atomic_u64(0).unwrap();
            let mut longest = Duration::ZERO;
            for i in 0..rounds {
                let want = 2 * i + me as u64;
                let t0 = Instant::now();
                loop {
                    let seen = bells[me].value();
                    if token.load(Ordering::Acquire) == want {
                        break;
                    }
                    bells[me].wait(seen, Duration::from_secs(20));
                }
                longest = longest.max(t0.elapsed());
                token.store(want + 1, Ordering::Release);
                bells[1 - me].ring();
            }
            longest
        };
        let (b0, b1) = (bells.clone(), bells.clone());
        let (r0, r1) = (r.clone(), r.clone());
        let t0 = Instant::now();
        let a = std::thread::spawn(move || run(0, b0, r0));
        let b = std::thread::spawn(move || run(1, b1, r1));
        let la = a.join().unwrap();
        let lb = b.join().unwrap();
        assert_eq!(r.atomic_u64(0).unwrap().load(Ordering::SeqCst), 2 * rounds);
        let took = t0.elapsed();
        eprintln!(
            "{rounds} round trips in {took:?}, longest single wait {:?}",
            la.max(lb)
        );
        assert!(la.max(lb) < Duration::from_secs(10), "a wake-up was lost");
    });
}

#[test]
fn backoff_spins_then_yields_then_parks_with_bounded_sleeps() {
    let r = region();
    let bell = Doorbell::new(r, 0).unwrap();
    let mut b = Backoff::new();
    let seen = bell.value();
    let t0 = Instant::now();
    for _ in 0..(Backoff::SPIN_STEPS + Backoff::YIELD_STEPS) {
        assert!(!b.is_parking());
        b.snooze(&bell, seen);
    }
    let busy = t0.elapsed();
    assert!(b.is_parking());
    assert_eq!(b.park_duration(), Backoff::MIN_PARK);
    // Park durations double up to MAX_PARK and stay there.
    let mut last = Duration::ZERO;
    let mut parked_total = Duration::ZERO;
    for _ in 0..12 {
        let d = b.park_duration();
        assert!(d >= last && d <= Backoff::MAX_PARK);
        last = d;
        let t = Instant::now();
        b.snooze(&bell, seen);
        parked_total += t.elapsed();
    }
    assert_eq!(b.park_duration(), Backoff::MAX_PARK);
    // 12 parks: 0.1+0.2+0.4+0.8+1.6+3.2+5*6 ms ~ 36 ms of sleep.
    assert!(
        parked_total >= Duration::from_millis(30),
        "{parked_total:?}"
    );
    assert!(
        busy < Duration::from_secs(2),
        "spin/yield phase took {busy:?}"
    );
    // A rung bell makes snooze return without sleeping, even while parking (the bound is
    // loose for a loaded machine; a park would be MAX_PARK at most anyway).
    bell.ring();
    let t = Instant::now();
    b.snooze(&bell, seen);
    assert!(t.elapsed() < Duration::from_secs(1));
    b.reset();
    assert!(!b.is_parking());
}
