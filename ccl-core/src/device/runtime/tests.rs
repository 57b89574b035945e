//! Unit tests of the device runtime (`runtime.rs`).

use super::*;

#[test]
fn backend_variable_parses_strictly() {
    assert_eq!(parse_backend(None).unwrap(), BackendEnv::Auto);
    assert_eq!(parse_backend(Some("Device")).unwrap(), BackendEnv::Device);
    assert_eq!(parse_backend(Some("host")).unwrap(), BackendEnv::Host);
    let e = parse_backend(Some("gpu")).unwrap_err();
    assert!(e.to_string().contains(ENV_BACKEND.name), "{e}");
}

#[test]
fn decision_covers_variables_and_probe_outcomes() {
    let none = || DeviceProbe::NoDevice("driver missing".into());
    let two = || DeviceProbe::Present {
        count: 2,
        current: 1,
    };
    let never = || -> DeviceProbe { panic!("probe must not run") };
    let no_gpu = || -> GpuSeen { (None, false) };
    assert!(matches!(
        decide(BackendEnv::Host, true, None, &never, &no_gpu).unwrap(),
        Decision::Host(_)
    ));
    assert_eq!(
        decide(BackendEnv::Auto, true, Some(3), &never, &no_gpu).unwrap(),
        Decision::Emulated(3)
    );
    assert_eq!(
        decide(BackendEnv::Device, true, None, &never, &no_gpu).unwrap(),
        Decision::Emulated(0)
    );
    assert!(matches!(
        decide(BackendEnv::Auto, false, None, &none, &no_gpu).unwrap(),
        Decision::Host(_)
    ));
    let e = decide(BackendEnv::Device, false, None, &none, &no_gpu).unwrap_err();
    assert!(
        e.to_string().contains(ENV_BACKEND.name) && e.to_string().contains("driver missing"),
        "{e}"
    );
    assert_eq!(
        decide(BackendEnv::Auto, false, None, &two, &no_gpu).unwrap(),
        Decision::Cuda(1)
    );
    assert_eq!(
        decide(BackendEnv::Device, false, Some(0), &two, &no_gpu).unwrap(),
        Decision::Cuda(0)
    );
    assert!(matches!(
        decide(BackendEnv::Auto, false, Some(5), &two, &no_gpu).unwrap(),
        Decision::Host(_)
    ));
    let nb = || DeviceProbe::NotBuilt;
    assert!(decide(BackendEnv::Device, false, None, &nb, &no_gpu).is_err());
    // Blocker 2: a GPU present but CUDA failing is an init error in auto mode, not a
    // silent host fallback; hidden on purpose (CUDA_VISIBLE_DEVICES) it falls back.
    let gpu = || -> GpuSeen { (Some("/dev/nvidia0".into()), false) };
    let e = decide(BackendEnv::Auto, false, None, &none, &gpu).unwrap_err();
    assert_eq!(e.code() as i32, 2, "ncclSystemError");
    assert!(e.to_string().contains("driver missing"), "{e}");
    let hidden = || -> GpuSeen { (Some("/dev/nvidia0".into()), true) };
    assert!(matches!(
        decide(BackendEnv::Auto, false, None, &none, &hidden).unwrap(),
        Decision::Host(m) if m.contains("CUDA_VISIBLE_DEVICES")
    ));
    // The explicit host backend and a host-only build never look at the GPU.
    let never_gpu = || -> GpuSeen { panic!("must not be asked") };
    assert!(matches!(
        decide(BackendEnv::Host, false, None, &none, &never_gpu).unwrap(),
        Decision::Host(_)
    ));
    assert!(matches!(
        decide(BackendEnv::Auto, false, None, &nb, &never_gpu).unwrap(),
        Decision::Host(_)
    ));
    // A GPU present and found: the device backend.
    assert_eq!(
        decide(BackendEnv::Auto, false, None, &two, &never_gpu).unwrap(),
        Decision::Cuda(1)
    );
}

#[test]
fn user_buffers_map_to_kernel_addresses_or_a_reason() {
    let info = |kind, device, device_ptr| PtrInfo {
        kind,
        device,
        device_ptr,
    };
    let p = 0x7000_0000;
    assert_eq!(kernel_address(info(PtrKind::Device, 1, p), p, 1), Ok(p));
    assert_eq!(kernel_address(info(PtrKind::Device, 1, 0), p, 1), Ok(p));
    let e = kernel_address(info(PtrKind::Device, 0, p), p, 1).unwrap_err();
    assert!(e.contains("device 0") && e.contains("device 1"), "{e}");
    assert_eq!(kernel_address(info(PtrKind::Managed, 0, p), p, 1), Ok(p));
    // Pinned host memory: the kernel uses its device alias.
    assert_eq!(
        kernel_address(info(PtrKind::HostPinned, -1, 0x9000), p, 1),
        Ok(0x9000)
    );
    let e = kernel_address(info(PtrKind::HostPinned, -1, 0), p, 1).unwrap_err();
    assert!(e.contains("not mapped"), "{e}");
    let e = kernel_address(info(PtrKind::Host, -1, 0), p, 1).unwrap_err();
    assert!(
        e.contains("host memory") && e.contains(ENV_BACKEND.name),
        "{e}"
    );
}

#[test]
fn fifo_descriptors_round_trip_and_junk_is_an_error() {
    let name = staging_name(0xfeed, 1, 0, LinkKind::P2p, 4242);
    let descs = [
        FifoDesc {
            pid: 42,
            ends: FifoEnds::Raw(vec![0x1234, 0xdead_beef_0000]),
        },
        FifoDesc {
            pid: 7,
            ends: FifoEnds::Ipc(vec![[0u8; 64], [7u8; 64], [0xff; 64]]),
        },
        FifoDesc {
            pid: 9,
            ends: FifoEnds::Staged {
                name: name.clone(),
                offsets: vec![0, 4096, 8192],
            },
        },
        FifoDesc {
            pid: 1,
            ends: FifoEnds::Raw(Vec::new()),
        },
    ];
    for d in &descs {
        let b = encode_desc(d);
        assert_eq!(&decode_desc(&b, 3).unwrap(), d);
        // Every truncation and any trailing byte is an error, never a panic.
        for cut in 0..b.len() {
            let e = decode_desc(&b[..cut], 3).unwrap_err();
            assert!(matches!(e, CclError::Remote(_)), "{e}");
            assert!(e.to_string().contains("rank 3"), "{e}");
        }
        let mut long = b.clone();
        long.push(0);
        assert!(decode_desc(&long, 3)
            .unwrap_err()
            .to_string()
            .contains("trailing"));
    }
    let staged = encode_desc(&descs[2]);
    // Unknown kind.
    let mut bad = staged.clone();
    bad[4] = 3;
    assert!(decode_desc(&bad, 3)
        .unwrap_err()
        .to_string()
        .contains("unknown kind 3"));
    // Name with a character outside [A-Za-z0-9._-] ('/': a path).
    let mut bad = staged.clone();
    bad[11] = b'/';
    assert!(decode_desc(&bad, 3).is_err());
    // Invalid UTF-8 in the name.
    let mut bad = staged.clone();
    bad[12] = 0xff;
    assert!(decode_desc(&bad, 3).is_err());
    // A valid name that is not a staging segment (the host transport's prefix).
    let other = FifoDesc {
        pid: 9,
        ends: FifoEnds::Staged {
            name: "ccld-00000000000000ff-2-0-1-9".into(),
            offsets: vec![0],
        },
    };
    assert!(decode_desc(&encode_desc(&other), 3)
        .unwrap_err()
        .to_string()
        .contains("not a staging segment"));
    // Empty name, unaligned offset, a count beyond the bytes.
    let empty = FifoDesc {
        pid: 9,
        ends: FifoEnds::Staged {
            name: String::new(),
            offsets: vec![0],
        },
    };
    assert!(decode_desc(&encode_desc(&empty), 3).is_err());
    let unaligned = FifoDesc {
        pid: 9,
        ends: FifoEnds::Staged {
            name: name.clone(),
            offsets: vec![0, 100],
        },
    };
    assert!(decode_desc(&encode_desc(&unaligned), 3)
        .unwrap_err()
        .to_string()
        .contains("aligned"));
    let mut huge = encode_desc(&descs[0]);
    huge[5..9].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(decode_desc(&huge, 3)
        .unwrap_err()
        .to_string()
        .contains("truncated"));
    // Random junk never panics.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for len in 0..300 {
        let junk: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % 4) as u8 // small values: kinds 0..3 and short lengths
            })
            .collect();
        let _ = decode_desc(&junk, 0);
    }
}

#[test]
fn path_choice_follows_process_ipc_and_p2p_disable() {
    use PeerPath::*;
    for ipc in [false, true] {
        for off in [false, true] {
            assert_eq!(choose_path(true, ipc, off), SameProcess);
        }
    }
    assert_eq!(choose_path(false, true, false), Ipc);
    assert_eq!(choose_path(false, true, true), HostStaged);
    assert_eq!(choose_path(false, false, false), HostStaged);
    assert_eq!(choose_path(false, false, true), HostStaged);
    assert_eq!(HostStaged.to_string(), "host-staged shm");
    assert_eq!(Ipc.to_string(), "CUDA IPC");
}

#[test]
fn staging_names_are_unique_valid_and_sweepable() {
    let a = staging_name(0xabc, 1, 2, LinkKind::Ring, 77);
    validate_name(&a).unwrap();
    assert!(a.starts_with("ccldev-0000000000000abc-"), "{a}");
    for b in [
        staging_name(0xabd, 1, 2, LinkKind::Ring, 77),
        staging_name(0xabc, 2, 1, LinkKind::Ring, 77),
        staging_name(0xabc, 1, 2, LinkKind::P2p, 77),
        staging_name(0xabc, 1, 2, LinkKind::Ring, 78),
    ] {
        assert_ne!(a, b);
    }
    // The stale sweep finds the creator pid; the host transport's sweep does not match.
    assert_eq!(
        crate::transport::shm::stale_candidate_pid(STAGING_PREFIX, &a),
        Some(77)
    );
    assert_eq!(crate::transport::shm::stale_candidate_pid("ccld", &a), None);
}

#[test]
fn emulated_host_registration_is_tracked() {
    let d = crate::device::emu::EmuDevice::default();
    assert!(!d.supports_ipc());
    let buf = vec![0u8; 4096];
    let p = buf.as_ptr() as usize;
    assert_eq!(d.host_register(p, 4096).unwrap(), p);
    assert_eq!(d.live_registrations(), 1);
    // Overlapping ranges (inside, straddling the start or the end) are refused.
    for (a, n) in [(p, 1), (p + 100, 10), (p - 8, 16), (p + 4095, 8)] {
        let e = d.host_register(a, n).unwrap_err();
        assert!(e.to_string().contains("overlaps"), "{e}");
    }
    assert!(d.host_register(0, 16).is_err());
    assert!(d.host_register(p + 8192, 0).is_err());
    assert!(d.host_register(usize::MAX - 4, 16).is_err());
    // Adjacent is fine.
    assert_eq!(d.host_register(p + 4096, 64).unwrap(), p + 4096);
    d.host_unregister(p + 4096).unwrap();
    d.host_unregister(p).unwrap();
    let e = d.host_unregister(p).unwrap_err();
    assert!(e.to_string().contains("not registered"), "{e}");
    assert!(d.host_unregister(p + 100).is_err());
    assert_eq!(d.live_registrations(), 0);
}

#[test]
fn staged_segment_is_claimed_registered_and_released() {
    let emu = Arc::new(crate::device::emu::EmuDevice::default());
    let api: Arc<dyn DeviceApi> = emu.clone();
    let name = staging_name(0x5eed, 0, 1, LinkKind::Ring, std::process::id());
    let seg = Staged::map(&api, ShmRegion::create(&name, 4096).unwrap()).unwrap();
    // The emulator's alias is the host address; the user area follows the header.
    assert_eq!(seg.dev_addr(64), seg.host_addr(64));
    // The user area is claimed for the device: no safe view may be made over it.
    assert!(seg.region.atomic_u64(0).is_err());
    // The peer's side: open by name, map, unlink; the file is gone, both still mapped.
    let peer = Staged::map(&api, ShmRegion::open(&name).unwrap()).unwrap();
    peer.region.unlink().unwrap();
    let path = std::path::Path::new(crate::transport::shm::SHM_DIR).join(&name);
    assert!(!path.exists());
    // SAFETY: offset 128 + 8 bytes lies inside both mappings of the same 4096 bytes.
    unsafe {
        std::ptr::write_volatile(seg.host_addr(128) as *mut u64, 0xabcd);
        assert_eq!(
            std::ptr::read_volatile(peer.host_addr(128) as *const u64),
            0xabcd
        );
    }
    assert_eq!(emu.live_registrations(), 2);
    drop(peer);
    drop(seg);
    assert_eq!(emu.live_registrations(), 0);
    let e = api.host_unregister(0x1000).unwrap_err();
    assert!(e.to_string().contains("not registered"), "{e}");
}

/// Parked frame blocks go back only to frames of the same kind, device and size, zeroed.
#[test]
fn parked_frame_blocks_are_reused_zeroed_by_equal_frames_only() {
    let d = crate::device::emu::global();
    let p = select::ParkedFrames::default();
    let bytes = 4096;
    let m = d.host_alloc_mapped(bytes).unwrap();
    // SAFETY: m is `bytes` of live mapped memory.
    unsafe { std::ptr::write_bytes(m.host as *mut u8, 0x5A, bytes) };
    p.put((true, 0, bytes), m);
    assert!(p.take((true, 1, bytes)).is_none(), "another device");
    assert!(p.take((true, 0, bytes * 2)).is_none(), "another size");
    assert!(
        p.take((false, 0, bytes)).is_none(),
        "CUDA, not the emulator"
    );
    let got = p.take((true, 0, bytes)).expect("the parked block");
    assert_eq!(got, m);
    // SAFETY: got == m: `bytes` of live mapped memory, nothing writes it during the read.
    let b = unsafe { std::slice::from_raw_parts(got.host as *const u8, bytes) };
    assert!(b.iter().all(|x| *x == 0), "handed out zeroed");
    assert_eq!(p.len(), 0);
    d.host_free(got.host).unwrap();
}
