//! The start-up of NVIDIA's nccl-tests with `-g 4` (one thread, four devices) through our C
//! ABI on the device backend, with the CPU emulator as the device
//! (`CCLD_DEVICE_EMULATION=1`): `cudaSetDevice(r)` + grouped `ncclCommInitRank` for each
//! rank (issue 15 blocker 5), buffers from `ncclMemAlloc` on each rank's device (blocker
//! 1: device memory, not host memory), a grouped AllReduce on the default stream, stream
//! synchronisation, results against a host reference, `ncclMemFree`, destroy.

use std::ffi::{c_void, CStr};
use std::ptr::null_mut;
use std::sync::mpsc;
use std::time::Duration;

use ccl_core::bootstrap::UniqueId;
use ccl_core::device::api::{DeviceApi, PtrKind};
use ccl_core::device::emu;
use nccl::api::*;

const NRANKS: usize = 4;
const INT32: i32 = 2;
const SUM: i32 = 0;

fn last_error() -> String {
    // SAFETY: ncclGetLastError returns a NUL-terminated string valid until the next call.
    unsafe { CStr::from_ptr(ncclGetLastError(null_mut())) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn grouped_init_mem_alloc_and_allreduce_on_four_emulated_devices() {
    std::env::set_var("CCLD_DEVICE_EMULATION", "1");
    std::env::set_var("CCLD_BOOTSTRAP_IP", "127.0.0.1");
    std::env::set_var("NCCL_BUFFSIZE", "65536");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        scenario();
        let _ = tx.send(());
    });
    rx.recv_timeout(Duration::from_secs(180))
        .expect("the nccl-tests start-up did not finish in 180 s (hang?)");
}

fn scenario() {
    let api = emu::global();
    let mut id = UniqueId([0; 128]);
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { ncclGetUniqueId(&mut id) }, 0);
    let mut comms = [null_mut::<c_void>(); NRANKS];
    // SAFETY: valid out-pointers; the group is closed below.
    unsafe {
        assert_eq!(ncclGroupStart(), 0);
        for (r, c) in comms.iter_mut().enumerate() {
            api.set_device(r as i32).unwrap();
            assert_eq!(
                ncclCommInitRank(c, NRANKS as i32, id, r as i32),
                0,
                "{}",
                last_error()
            );
        }
        assert_eq!(ncclGroupEnd(), 0, "{}", last_error());
    }
    for (r, c) in comms.iter().enumerate() {
        let mut dev = -1;
        // SAFETY: live handle, valid out-pointer.
        assert_eq!(unsafe { ncclCommCuDevice(*c, &mut dev) }, 0);
        assert_eq!(dev, r as i32, "each rank on the device current at its init");
    }
    // Buffers: ncclMemAlloc on each rank's device must be device memory of that device.
    let count = 50_000;
    let bytes = count * 4;
    let mut send = [0usize; NRANKS];
    let mut recv = [0usize; NRANKS];
    for r in 0..NRANKS {
        api.set_device(r as i32).unwrap();
        for out in [&mut send[r], &mut recv[r]] {
            let mut p = null_mut();
            // SAFETY: valid out-pointer.
            let rc = unsafe { ncclMemAlloc(&mut p, bytes) };
            assert_eq!(rc, 0, "{}", last_error());
            *out = p as usize;
            let info = api.pointer_info(*out).unwrap();
            assert_eq!(info.kind, PtrKind::Device, "rank {r}: {info:?}");
            assert_eq!(info.device, r as i32, "rank {r}: {info:?}");
        }
        let input: Vec<i32> = (0..count as i32).map(|i| i * (r as i32 + 1) - 7).collect();
        // SAFETY: `send[r]` is `bytes` of (emulated) device memory; `input` has `bytes`.
        unsafe { api.memcpy(send[r], input.as_ptr() as usize, bytes).unwrap() };
    }
    // SAFETY: device buffers of `bytes` each, live until freed below after the sync.
    unsafe {
        assert_eq!(ncclGroupStart(), 0);
        for r in 0..NRANKS {
            api.set_device(r as i32).unwrap();
            assert_eq!(
                ncclAllReduce(
                    send[r] as *const c_void,
                    recv[r] as *mut c_void,
                    count,
                    INT32,
                    SUM,
                    comms[r],
                    null_mut(),
                ),
                0,
                "{}",
                last_error()
            );
        }
        assert_eq!(ncclGroupEnd(), 0, "{}", last_error());
    }
    // Reference: sum over ranks of i * (r + 1) - 7 = i * 10 - 28.
    for (r, recv) in recv.iter().enumerate() {
        api.set_device(r as i32).unwrap();
        let s = api.default_stream(r as i32).unwrap();
        api.stream_synchronize(s).unwrap();
        let mut out = vec![0i32; count];
        // SAFETY: `recv[r]` holds `bytes`; `out` has room for them.
        unsafe { api.memcpy(out.as_mut_ptr() as usize, *recv, bytes).unwrap() };
        for (i, v) in out.iter().enumerate() {
            assert_eq!(*v, i as i32 * 10 - 28, "rank {r} element {i}");
        }
    }
    for r in 0..NRANKS {
        for p in [send[r], recv[r]] {
            // SAFETY: from ncclMemAlloc, freed once.
            assert_eq!(unsafe { ncclMemFree(p as *mut c_void) }, 0);
            assert_eq!(
                api.pointer_info(p).unwrap().kind,
                PtrKind::Host,
                "freed through the emulator"
            );
        }
        // SAFETY: live handle, destroyed once.
        assert_eq!(unsafe { ncclCommDestroy(comms[r]) }, 0, "{}", last_error());
    }
}
