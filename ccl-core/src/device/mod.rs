//! Runtime glue of the device backend (docs/device-backend.md): which backend a communicator
//! uses, and the lowering of a pure [`crate::schedule::Plan`] into the flat arrays the
//! kernels execute (`kernels/include/ccl_device.h`).
//!
//! Status: the pure parts (backend decision, lowering, reduction parameters) are unit-tested;
//! the runtime ([`runtime`], over the [`api::DeviceApi`] trait) is tested end to end through
//! the CPU emulation of the device ([`emu`], `CCLD_DEVICE_EMULATION=1`). The CUDA side
//! ([`api::CudaApi`]) has never run on a GPU (see docs/device-backend.md).

pub mod agree;
pub mod api;
pub mod board;
pub mod capture;
pub mod check;
pub(crate) mod completion;
pub mod emu;
pub mod emu_kernel;
pub mod liveness;
pub mod lower;
pub mod order;
pub mod plans;
pub mod queues;
pub mod release;
pub mod runtime;
pub mod selftest;
pub mod starts;

pub use lower::{lower, red_params, ConnDir, ConnKey, LoweredPlan, RedParams};

/// The execution backend of a communicator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// Buffers in host memory, a worker thread per communicator (ccl-core's executor).
    Host,
    /// Buffers in device memory, kernels on CUDA device `device`.
    Device {
        /// CUDA device ordinal of the communicator.
        device: i32,
    },
}

/// What the runtime found when it looked for a device (inputs of [`choose_backend`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceProbe {
    /// The library was built without kernels (no nvcc at build time).
    NotBuilt,
    /// Kernels are built but the runtime reports no usable device (the message says why).
    NoDevice(String),
    /// `count` devices, `current` is the calling thread's current device.
    Present {
        /// Devices visible.
        count: usize,
        /// Current device of the calling thread.
        current: i32,
    },
}

/// Pure backend decision at communicator init: the device backend when kernels are built
/// and a current device exists, the host backend otherwise. Returns the backend and a
/// one-line reason for the INIT log.
pub fn choose_backend(probe: &DeviceProbe) -> (Backend, String) {
    match probe {
        DeviceProbe::NotBuilt => (
            Backend::Host,
            "host backend: library built without device kernels".into(),
        ),
        DeviceProbe::NoDevice(why) => (Backend::Host, format!("host backend: no device ({why})")),
        DeviceProbe::Present { count, current } => {
            if *count == 0 || *current < 0 || *current as usize >= *count {
                (
                    Backend::Host,
                    format!("host backend: current device {current} of {count} is not usable"),
                )
            } else {
                (
                    Backend::Device { device: *current },
                    format!("device backend on CUDA device {current} of {count}"),
                )
            }
        }
    }
}

/// Looks for a device through the kernels' C ABI (never aborts without one).
pub fn probe_device() -> DeviceProbe {
    match kernels::device_count() {
        Err(kernels::DevError::NotBuilt) => DeviceProbe::NotBuilt,
        Err(e) => DeviceProbe::NoDevice(e.to_string()),
        Ok(0) => DeviceProbe::NoDevice("no device".into()),
        Ok(count) => DeviceProbe::Present {
            count,
            // Device 0 until the runtime asks the ABI for the current device.
            current: 0,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_choice_covers_every_probe_outcome() {
        assert_eq!(choose_backend(&DeviceProbe::NotBuilt).0, Backend::Host);
        let (b, why) = choose_backend(&DeviceProbe::NoDevice("driver missing".into()));
        assert_eq!(b, Backend::Host);
        assert!(why.contains("driver missing"));
        assert_eq!(
            choose_backend(&DeviceProbe::Present {
                count: 2,
                current: 1
            })
            .0,
            Backend::Device { device: 1 }
        );
        for (count, current) in [(0, 0), (2, 2), (2, -1)] {
            assert_eq!(
                choose_backend(&DeviceProbe::Present { count, current }).0,
                Backend::Host,
                "{count} {current}"
            );
        }
    }

    #[test]
    fn this_machine_without_a_gpu_gets_the_host_backend() {
        // CI and the development machine have no GPU: the probe must say so gracefully.
        // (On a GPU machine this test checks the device branch instead.)
        let p = probe_device();
        let (b, why) = choose_backend(&p);
        match p {
            DeviceProbe::Present { .. } => assert!(matches!(b, Backend::Device { .. })),
            DeviceProbe::NotBuilt => {
                assert!(!kernels::cuda_built());
                assert_eq!(b, Backend::Host);
            }
            DeviceProbe::NoDevice(_) => {
                assert!(kernels::cuda_built());
                assert_eq!(b, Backend::Host);
                assert!(why.starts_with("host backend: no device"), "{why}");
            }
        }
    }
}

#[cfg(test)]
mod elem_tests;
