//! Hardware work queues and ranks that share a GPU in one process.
//!
//! A CUDA context feeds its streams to the GPU through `CUDA_DEVICE_MAX_CONNECTIONS`
//! hardware queues (8 unless set, at most 32). When a process has more streams in use than
//! queues, streams share a queue, and a kernel can be held behind a kernel of another
//! stream that went into the same queue first. Our kernels wait for their peers' kernels,
//! so when the held kernel is the one a running kernel waits for, both wait for ever.
//!
//! Seen on an H200 (docs/gpu-results.md, 2026-11-27): 8 ranks as threads of one process,
//! each with its own stream plus the communicator's setup stream (16 streams over 8
//! queues); in about one run of three an operation hung with 7 kernels active and the
//! eighth rank's kernel enqueued but never started. NCCL has the same limit; NVIDIA's
//! answer is one rank per GPU. Ours is a warning at init, once per device and process, when
//! the communicators on a device need more queues than the context has
//! ([`needs_more_queues`]), naming the variable to set before CUDA starts.

use std::collections::HashMap;

use parking_lot::Mutex;

/// Streams one device communicator keeps busy: the user's stream and its setup stream.
pub const STREAMS_PER_COMM: u64 = 2;

/// CUDA's default number of hardware queues per context.
pub const CUDA_DEFAULT_CONNECTIONS: u64 = 8;

/// Whether `comms` communicators on one device can need more hardware queues than
/// `connections` (pure).
pub fn needs_more_queues(comms: usize, connections: u64) -> bool {
    comms as u64 * STREAMS_PER_COMM > connections
}

/// The warning for `comms` communicators on `device` with `connections` queues.
pub fn warning(device: i32, comms: usize, connections: u64, set: bool) -> String {
    format!(
        "{comms} communicators of this process share CUDA device {device}, with {connections} \
         hardware queues (CUDA_DEVICE_MAX_CONNECTIONS {}): their kernels can be serialized \
         behind each other and hang. Set CUDA_DEVICE_MAX_CONNECTIONS=32 before CUDA starts, \
         or use fewer ranks per device in one process (or MPS with one rank per process)",
        if set {
            "as set"
        } else {
            "unset: CUDA's default"
        }
    )
}

/// Live device communicators per device in this process, and the devices already warned
/// about (pure bookkeeping; [`register`] adds the environment and the log).
#[derive(Debug, Default)]
pub struct Census {
    live: HashMap<i32, usize>,
    warned: Vec<i32>,
}

impl Census {
    /// One more communicator on `device`; returns the warning to log, the first time the
    /// device needs more queues than `connections`.
    pub fn add(&mut self, device: i32, connections: u64, set: bool) -> Option<String> {
        let n = self.live.entry(device).or_insert(0);
        *n += 1;
        let n = *n;
        if needs_more_queues(n, connections) && !self.warned.contains(&device) {
            self.warned.push(device);
            return Some(warning(device, n, connections, set));
        }
        None
    }

    /// One communicator fewer on `device`.
    pub fn remove(&mut self, device: i32) {
        if let Some(n) = self.live.get_mut(&device) {
            *n = n.saturating_sub(1);
        }
    }
}

static CENSUS: Mutex<Option<Census>> = Mutex::new(None);

/// A device communicator's place in the census; leaving it (drop) counts it out.
#[derive(Debug)]
pub struct Seat {
    device: i32,
}

impl Drop for Seat {
    fn drop(&mut self) {
        if let Some(c) = CENSUS.lock().as_mut() {
            c.remove(self.device);
        }
    }
}

/// Counts a new communicator on `device` in, warning (NCCL `WARN`) when this process's
/// communicators on it can need more hardware queues than the context has.
pub fn register(device: i32, rank: usize) -> Seat {
    let set = ccl_params::CUDA_DEVICE_MAX_CONNECTIONS.raw().ok().flatten();
    let connections = set
        .as_deref()
        // A value CUDA would not take counts as unset (CUDA ignores it too).
        .and_then(|v| ccl_params::CUDA_DEVICE_MAX_CONNECTIONS.parse_int(v).ok())
        .unwrap_or(CUDA_DEFAULT_CONNECTIONS);
    let warn =
        CENSUS
            .lock()
            .get_or_insert_with(Census::default)
            .add(device, connections, set.is_some());
    if let Some(w) = warn {
        tracing::warn!(target: "nccl::INIT", rank = rank, "{w}");
    }
    Seat { device }
}

/// For programs that run many ranks as threads on one GPU (the device suites): sets
/// `CUDA_DEVICE_MAX_CONNECTIONS=32` unless it is set. Call it first in `main`, before CUDA
/// starts and before any thread exists (it changes the process environment). The library
/// itself never calls it: the variable is the application's (Megatron sets it to 1).
pub fn most_queues_for_this_program() {
    if std::env::var_os(ccl_params::CUDA_DEVICE_MAX_CONNECTIONS.name).is_none() {
        std::env::set_var(ccl_params::CUDA_DEVICE_MAX_CONNECTIONS.name, "32");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_streams_per_communicator_against_the_queues() {
        assert!(!needs_more_queues(4, 8), "4 ranks: 8 streams fit 8 queues");
        assert!(needs_more_queues(5, 8));
        assert!(needs_more_queues(8, 8), "the case seen on the H200");
        assert!(!needs_more_queues(8, 16));
        assert!(!needs_more_queues(16, 32));
        assert!(needs_more_queues(17, 32));
    }

    #[test]
    fn the_census_warns_once_per_device_and_forgets_the_departed() {
        let mut c = Census::default();
        for _ in 0..4 {
            assert_eq!(c.add(0, 8, false), None);
        }
        let w = c
            .add(0, 8, false)
            .expect("the fifth communicator on device 0");
        assert!(
            w.contains("5 communicators") && w.contains("device 0"),
            "{w}"
        );
        assert!(w.contains("CUDA_DEVICE_MAX_CONNECTIONS=32"), "{w}");
        assert_eq!(c.add(0, 8, false), None, "once per device");
        // Another device, with the variable set to 32: 16 communicators fit.
        for _ in 0..16 {
            assert_eq!(c.add(1, 32, true), None);
        }
        let w = c
            .add(1, 32, true)
            .expect("the 17th communicator on device 1");
        assert!(
            w.contains("17 communicators") && w.contains("as set"),
            "{w}"
        );
        for _ in 0..6 {
            c.remove(0);
        }
        assert_eq!(c.live[&0], 0);
        c.remove(0);
        assert_eq!(c.live[&0], 0, "never below zero");
    }
}
