//! Ordering of one communicator's operations across streams (issue 15, blocker 4).
//!
//! The operations of a communicator share its FIFO counters, so they must run on the
//! device in the order they were issued, whichever streams the user passes. As NCCL does,
//! one event per communicator carries that order: after each operation's work is enqueued
//! on its stream the event is recorded there ([`Order::mark`]); an operation issued on a
//! different stream than the previous one first makes its stream wait for the event
//! ([`Order::join`], `cudaStreamWaitEvent`), so its kernel cannot start before the
//! previous operation (its kernel or copies) finished. Operations on one
//! stream need no wait: the stream orders them. The same event tells the liveness watch
//! ([`super::liveness`]) whether the last operation is done or faulted.

use parking_lot::Mutex;
use std::sync::Arc;

use super::api::{DeviceApi, Event, Stream};
use crate::error::Result;

/// Whether an operation on `next` must wait for the communicator's event (pure): only
/// when the previous operation ran on another stream.
pub fn needs_wait(last: Option<Stream>, next: Stream) -> bool {
    last.is_some_and(|l| l != next)
}

/// The per-communicator ordering event and the stream of the last operation.
#[derive(Debug)]
pub(crate) struct Order {
    api: Arc<dyn DeviceApi>,
    event: Event,
    last: Mutex<Option<Stream>>,
}

impl Order {
    /// Creates the event on the current device.
    pub(crate) fn new(api: Arc<dyn DeviceApi>) -> Result<Order> {
        let event = api.event_create()?;
        Ok(Order {
            api,
            event,
            last: Mutex::new(None),
        })
    }

    /// The event (recorded after every operation).
    pub(crate) fn event(&self) -> Event {
        self.event
    }

    /// Before the first work of an operation on `s` (a resolved handle, never 0 for
    /// "default"): waits for the previous operation when it ran on another stream.
    /// Returns whether a wait was enqueued.
    pub(crate) fn join(&self, s: Stream) -> Result<bool> {
        let last = *self.last.lock();
        if needs_wait(last, s) {
            self.api.stream_wait_event(s, self.event)?;
            return Ok(true);
        }
        Ok(false)
    }

    /// After the operation's work was enqueued on `s` (also after a failed enqueue: what
    /// was enqueued, including a wait from [`Self::join`], stays ordered): records the
    /// event on `s`.
    pub(crate) fn mark(&self, s: Stream) -> Result<()> {
        let mut g = self.last.lock();
        self.api.event_record(self.event, s)?;
        *g = Some(s);
        Ok(())
    }

    /// Destroys the event (destroy; pending records still complete).
    pub(crate) fn destroy(&self) -> Result<()> {
        self.api.event_destroy(self.event)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    use super::*;
    use crate::device::api::HostFn;
    use crate::device::emu;

    /// Waits (at most 10 s) until `gate` opens; then runs `then`. For a host function that
    /// holds a stream back.
    fn after_gate(gate: &Arc<AtomicBool>, then: impl FnOnce() + Send + 'static) -> HostFn {
        let g = Arc::clone(gate);
        Box::new(move || {
            let t0 = Instant::now();
            while !g.load(Ordering::Acquire) && t0.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(1));
            }
            then();
        })
    }

    #[test]
    fn only_a_change_of_stream_needs_a_wait() {
        assert!(!needs_wait(None, 0x10));
        assert!(!needs_wait(Some(0x10), 0x10));
        assert!(needs_wait(Some(0x10), 0x20));
    }

    /// On the emulator: work on stream B behind `join` does not start before the work on
    /// stream A that `mark` covered, even when A is held back; without the join it would.
    #[test]
    fn a_second_stream_waits_for_the_first_streams_work() {
        let api: Arc<dyn DeviceApi> = emu::global();
        let (a, b) = (api.stream_create().unwrap(), api.stream_create().unwrap());
        let order = Order::new(Arc::clone(&api)).unwrap();
        let gate = Arc::new(AtomicBool::new(false));
        let seq = Arc::new(AtomicUsize::new(0));
        let (first, second) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        {
            let (s, f) = (Arc::clone(&seq), Arc::clone(&first));
            api.launch_host_fn(
                a,
                after_gate(&gate, move || {
                    f.store(s.fetch_add(1, Ordering::AcqRel) + 1, Ordering::Release);
                }),
            )
            .unwrap();
        }
        assert!(
            !order.join(a).unwrap(),
            "first operation: nothing to wait for"
        );
        order.mark(a).unwrap();
        assert!(order.join(b).unwrap(), "another stream waits");
        {
            let (s, f) = (Arc::clone(&seq), Arc::clone(&second));
            api.launch_host_fn(
                b,
                Box::new(move || f.store(s.fetch_add(1, Ordering::AcqRel) + 1, Ordering::Release)),
            )
            .unwrap();
        }
        order.mark(b).unwrap();
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(second.load(Ordering::Acquire), 0, "B ran before A's work");
        assert!(
            !api.event_query(order.event()).unwrap(),
            "B's record pending"
        );
        gate.store(true, Ordering::Release);
        api.stream_synchronize(b).unwrap();
        assert_eq!(first.load(Ordering::Acquire), 1);
        assert_eq!(second.load(Ordering::Acquire), 2);
        assert!(api.event_query(order.event()).unwrap());
        assert!(!order.join(b).unwrap(), "same stream again: no wait");
        order.destroy().unwrap();
        api.stream_destroy(a).unwrap();
        api.stream_destroy(b).unwrap();
    }

    /// A kernel fault is sticky: the stream refuses new work, and an event recorded behind
    /// the fault (and a stream that waits for it) reports it.
    #[test]
    fn a_kernel_fault_reaches_the_event_and_waiting_streams() {
        let d = emu::global();
        d.set_device(7).unwrap();
        let api: Arc<dyn DeviceApi> = d.clone();
        let (a, b) = (api.stream_create().unwrap(), api.stream_create().unwrap());
        let order = Order::new(Arc::clone(&api)).unwrap();
        // Stream A waits for the gate, so that the kernel faults only after the event and
        // B's wait are enqueued (a stream that already faulted refuses them).
        let gate = Arc::new(AtomicBool::new(false));
        api.launch_host_fn(a, after_gate(&gate, || {})).unwrap();
        d.fault_next_kernel(7, "illegal memory access (test)");
        let plan = crate::device::emu::tests::empty_plan();
        // SAFETY: an empty plan (no arrays, no buffers).
        unsafe { api.launch_plan(&plan, a) }.unwrap();
        order.mark(a).unwrap();
        order.join(b).unwrap();
        gate.store(true, Ordering::Release);
        let e = api.stream_synchronize(a).unwrap_err().to_string();
        assert!(e.contains("illegal memory access (test)"), "{e}");
        let e = api.event_query(order.event()).unwrap_err().to_string();
        assert!(e.contains("illegal memory access (test)"), "{e}");
        let e = api.stream_synchronize(b).unwrap_err().to_string();
        assert!(e.contains("illegal memory access (test)"), "{e}");
        assert!(api.launch_host_fn(a, Box::new(|| {})).is_err());
        assert!(api.stream_query(a).is_err());
        order.destroy().unwrap();
    }
}
