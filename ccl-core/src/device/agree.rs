//! Backend choice safety (issue 15, blocker 2):
//!
//! - no silent host fallback when a GPU is present but CUDA could not be initialised (the
//!   program's buffers are device pointers the host backend would dereference on the CPU):
//!   init fails with a clear error; `CCLD_BACKEND=host` chooses the host backend anyway,
//!   and a set `CUDA_VISIBLE_DEVICES` (the user hiding devices) falls back with a WARN;
//! - all ranks agree on the backend at init: one bootstrap allgather of each rank's
//!   backend, and a mismatch is an init error naming the ranks of each side.
//!
//! The decisions are pure functions of their inputs; [`gpu_evidence`] reads the system.

use crate::error::{CclError, Result};

/// A rank's backend as exchanged at init (one byte).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendCode {
    /// Host backend.
    Host = 0,
    /// Device backend on CUDA.
    Cuda = 1,
    /// Device backend on the CPU emulator.
    Emulated = 2,
}

impl BackendCode {
    fn name(b: u8) -> &'static str {
        match b {
            0 => "the host backend",
            1 => "the device backend (CUDA)",
            2 => "the device backend (emulated)",
            _ => "an unknown backend",
        }
    }
}

/// Checks the backends of all ranks (`all[r]` = rank r's one-byte contribution). On a
/// mismatch the error names the ranks of each backend and `me`'s own.
pub fn check_agreement(all: &[Vec<u8>], me: usize) -> Result<()> {
    let code = |v: &Vec<u8>| v.first().copied().unwrap_or(u8::MAX);
    let Some(first) = all.first().map(code) else {
        return Ok(());
    };
    if all.iter().all(|v| code(v) == first && v.len() == 1) {
        return Ok(());
    }
    let mut groups: Vec<(u8, Vec<usize>)> = Vec::new();
    for (r, v) in all.iter().enumerate() {
        let c = if v.len() == 1 { code(v) } else { u8::MAX };
        match groups.iter_mut().find(|(g, _)| *g == c) {
            Some((_, ranks)) => ranks.push(r),
            None => groups.push((c, vec![r])),
        }
    }
    let sides: Vec<String> = groups
        .iter()
        .map(|(c, ranks)| format!("ranks {ranks:?} use {}", BackendCode::name(*c)))
        .collect();
    Err(CclError::usage(format!(
        "the ranks of this communicator disagree on the backend: {} (rank {me} is one of \
         them). Every rank must use the same one: check CCLD_BACKEND, CCLD_DEVICE_EMULATION \
         and that each rank sees a GPU",
        sides.join("; ")
    )))
}

/// What to do when the CUDA probe found no usable device, given whether the system shows
/// a GPU (`evidence`, e.g. "/dev/nvidia0") and whether `CUDA_VISIBLE_DEVICES` is set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fallback {
    /// No GPU in sight: the host backend, logged at INFO.
    Quiet,
    /// A GPU is present but hidden on purpose (`CUDA_VISIBLE_DEVICES`): the host backend
    /// with a WARN carrying this text.
    Loud(String),
    /// A GPU is present and CUDA failed: init fails with this error text.
    Refuse(String),
}

/// Pure rule of the no-silent-fallback policy (see the module doc).
pub fn fallback(why: &str, evidence: Option<&str>, visible_devices_set: bool) -> Fallback {
    match evidence {
        None => Fallback::Quiet,
        Some(ev) if visible_devices_set => Fallback::Loud(format!(
            "a GPU is present ({ev}) but CUDA reports no usable device ({why}) with \
             CUDA_VISIBLE_DEVICES set: using the host backend; device pointers passed to \
             this communicator would be read on the CPU"
        )),
        Some(ev) => Fallback::Refuse(format!(
            "a GPU is present ({ev}) but CUDA initialisation failed: {why}. Refusing to fall \
             back to the host backend, which would read device pointers on the CPU. Fix the \
             driver/runtime (this library needs a driver for CUDA 13.0, R580 or newer), or \
             set CCLD_BACKEND=host if every buffer is host memory"
        )),
    }
}

/// A sign that this machine has an NVIDIA GPU, whatever CUDA says: a device node
/// `/dev/nvidia<N>` or an entry under `/proc/driver/nvidia/gpus`.
pub fn gpu_evidence() -> Option<String> {
    if let Ok(dir) = std::fs::read_dir("/proc/driver/nvidia/gpus") {
        if let Some(e) = dir.flatten().next() {
            return Some(format!(
                "/proc/driver/nvidia/gpus/{}",
                e.file_name().to_string_lossy()
            ));
        }
    }
    let dev = std::fs::read_dir("/dev").ok()?;
    dev.flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| {
            n.strip_prefix("nvidia")
                .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(|n| format!("/dev/{n}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agreement_names_the_ranks_of_each_side() {
        let h = vec![BackendCode::Host as u8];
        let c = vec![BackendCode::Cuda as u8];
        check_agreement(&[c.clone(), c.clone(), c.clone()], 1).unwrap();
        check_agreement(std::slice::from_ref(&h), 0).unwrap();
        check_agreement(&[], 0).unwrap();
        let e = check_agreement(&[c.clone(), h.clone(), c.clone(), h.clone()], 2).unwrap_err();
        assert_eq!(e.code() as i32, 5, "ncclInvalidUsage");
        let m = e.to_string();
        assert!(
            m.contains("ranks [0, 2] use the device backend (CUDA)"),
            "{m}"
        );
        assert!(m.contains("ranks [1, 3] use the host backend"), "{m}");
        assert!(m.contains("rank 2"), "{m}");
        // A malformed contribution is a disagreement, not a panic.
        let e = check_agreement(&[c, vec![]], 0).unwrap_err();
        assert!(e.to_string().contains("unknown backend"), "{e}");
        let e = check_agreement(&[vec![2], vec![1]], 0).unwrap_err();
        assert!(e.to_string().contains("emulated"), "{e}");
    }

    #[test]
    fn fallback_is_refused_when_a_gpu_is_present() {
        assert_eq!(fallback("no device", None, false), Fallback::Quiet);
        assert_eq!(fallback("no device", None, true), Fallback::Quiet);
        match fallback("driver too old", Some("/dev/nvidia0"), false) {
            Fallback::Refuse(m) => {
                assert!(
                    m.contains("/dev/nvidia0") && m.contains("driver too old"),
                    "{m}"
                );
                assert!(m.contains("CCLD_BACKEND=host"), "{m}");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            fallback("no device", Some("/dev/nvidia0"), true),
            Fallback::Loud(_)
        ));
    }

    #[test]
    fn evidence_matches_this_machine() {
        // Independent check: the same question asked with a shell-free listing of /dev.
        let nodes = std::fs::read_dir("/dev")
            .map(|d| {
                d.flatten().any(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    n.len() > 6 && n.starts_with("nvidia") && n[6..].parse::<u32>().is_ok()
                })
            })
            .unwrap_or(false);
        let procfs = std::fs::read_dir("/proc/driver/nvidia/gpus")
            .map(|mut d| d.next().is_some())
            .unwrap_or(false);
        assert_eq!(gpu_evidence().is_some(), nodes || procfs);
    }
}
