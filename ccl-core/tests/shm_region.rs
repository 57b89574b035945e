//! Shared-memory segments: create/open/unlink, name validation, missing segments, in-process
//! overlap claims, pid_alive.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ccl_core::internal::transport::shm::{
    is_not_found, pid_alive, remove_stale_segments, segment_name, Doorbell, FifoLayout,
    FifoReceiver, FifoSender, ShmRegion, SHM_DIR,
};
use ccl_core::CclError;

fn name(tag: &str) -> String {
    segment_name("ccltest", 0x5eed, &[tag.len() as u64, fxhash(tag)])
}

fn fxhash(s: &str) -> u64 {
    s.bytes().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
    })
}

fn exists(name: &str) -> bool {
    Path::new(SHM_DIR).join(name).exists()
}

#[test]
fn create_open_share_bytes_and_unlink() {
    let n = name("create_open");
    let a = ShmRegion::create(&n, 4096).unwrap();
    assert_eq!(a.name(), n);
    assert_eq!(a.len(), 4096);
    assert!(a.is_creator());
    assert!(exists(&n));
    let b = ShmRegion::open(&n).unwrap();
    assert_eq!(b.len(), 4096);
    assert!(!b.is_creator());
    assert_eq!(b.creator_pid(), std::process::id());
    // The two mappings share memory: a word written through one is read through the other.
    let wa = a.atomic_u64(4088).unwrap();
    let wb = b.atomic_u64(4088).unwrap();
    assert_eq!(
        wb.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "zero-filled"
    );
    wa.store(0xdead_beef_1234, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        wb.load(std::sync::atomic::Ordering::SeqCst),
        0xdead_beef_1234
    );
    // Unlink by a peer removes the name; idempotent; the mappings stay usable.
    b.unlink().unwrap();
    assert!(!exists(&n));
    b.unlink().unwrap();
    a.unlink().unwrap();
    wb.store(7, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(wa.load(std::sync::atomic::Ordering::SeqCst), 7);
    let e = ShmRegion::open(&n).unwrap_err();
    assert!(is_not_found(&e), "{e}");
}

#[test]
fn creator_drop_unlinks_but_opener_drop_does_not() {
    let n = name("drop_unlinks");
    let a = ShmRegion::create(&n, 64).unwrap();
    let b = ShmRegion::open(&n).unwrap();
    drop(b);
    assert!(exists(&n), "an opener never removes the name");
    drop(a);
    assert!(!exists(&n), "the creator removes the name when dropped");
}

#[test]
fn creator_drop_leaves_a_newer_segment_of_the_same_name_alone() {
    let n = name("reuse");
    let a = ShmRegion::create(&n, 64).unwrap();
    // Someone else unlinked it and a new segment took the name.
    std::fs::remove_file(Path::new(SHM_DIR).join(&n)).unwrap();
    let b = ShmRegion::create(&n, 128).unwrap();
    drop(a);
    assert!(exists(&n), "old creator must not unlink the new file");
    assert_eq!(ShmRegion::open(&n).unwrap().len(), 128);
    drop(b);
    assert!(!exists(&n));
}

#[test]
fn create_refuses_existing_names_bad_names_and_zero_length() {
    let n = name("exclusive");
    let _a = ShmRegion::create(&n, 64).unwrap();
    let e = ShmRegion::create(&n, 64).unwrap_err();
    assert!(
        matches!(e, CclError::System(ref m) if m.contains("already exists")),
        "{e}"
    );
    for bad in ["", "a/b", "../etc", ".x", "x y", &"n".repeat(300)] {
        for e in [
            ShmRegion::create(bad, 64).unwrap_err(),
            ShmRegion::open(bad).unwrap_err(),
        ] {
            assert!(matches!(e, CclError::InvalidArgument(_)), "{bad:?}: {e}");
        }
    }
    let e = ShmRegion::create(&name("zero"), 0).unwrap_err();
    assert!(matches!(e, CclError::InvalidArgument(_)), "{e}");
    assert!(!exists(&name("zero")));
    let e = ShmRegion::create(&name("huge"), usize::MAX).unwrap_err();
    assert!(matches!(e, CclError::InvalidArgument(_)), "{e}");
    assert!(!exists(&name("huge")));
}

#[test]
fn open_of_missing_or_unfinished_segment_is_retryable() {
    let n = name("missing");
    let e = ShmRegion::open(&n).unwrap_err();
    assert!(is_not_found(&e), "{e}");
    assert!(e.to_string().contains(&n), "names the segment: {e}");
    assert!(ShmRegion::try_open(&n).unwrap().is_none());
    let t0 = std::time::Instant::now();
    let e = ShmRegion::open_timeout(&n, Duration::from_millis(30)).unwrap_err();
    assert!(matches!(e, CclError::Timeout(_)), "{e}");
    assert!(t0.elapsed() >= Duration::from_millis(30));
    assert!(!is_not_found(&CclError::System("other".into())));

    // A file that exists but was not initialised by a creator (empty, or zeroed) is "not
    // yet", not a crash and not success.
    let path = Path::new(SHM_DIR).join(&n);
    std::fs::write(&path, b"").unwrap();
    assert!(is_not_found(&ShmRegion::open(&n).unwrap_err()));
    std::fs::write(&path, vec![0u8; 4096]).unwrap();
    assert!(ShmRegion::try_open(&n).unwrap().is_none());
    std::fs::remove_file(&path).unwrap();

    // open_timeout picks up a segment created while it waits.
    let n2 = n.clone();
    let opener = std::thread::spawn(move || ShmRegion::open_timeout(&n2, Duration::from_secs(10)));
    std::thread::sleep(Duration::from_millis(20));
    let a = ShmRegion::create(&n, 256).unwrap();
    let b = opener.join().unwrap().unwrap();
    assert_eq!(b.len(), 256);
    drop(a);
}

#[test]
fn anonymous_regions_work_for_threads() {
    let r = Arc::new(ShmRegion::anonymous(1 << 16).unwrap());
    assert_eq!(r.name(), "anon");
    r.unlink().unwrap();
    let layout = FifoLayout {
        nslots: 4,
        slot_bytes: 100,
    };
    let mut tx = FifoSender::new(r.clone(), 0, layout).unwrap();
    let mut rx = FifoReceiver::new(r.clone(), 0, layout).unwrap();
    let h = std::thread::spawn(move || {
        for i in 0..1000u32 {
            loop {
                if let Some(s) = tx.try_reserve() {
                    s[..4].copy_from_slice(&i.to_le_bytes());
                    break;
                }
                std::thread::yield_now();
            }
            tx.commit(4);
        }
    });
    for i in 0..1000u32 {
        let v = loop {
            if let Some(s) = rx.try_peek() {
                break u32::from_le_bytes(s.try_into().unwrap());
            }
            std::thread::yield_now();
        };
        assert_eq!(v, i);
        rx.release();
    }
    h.join().unwrap();
    assert!(ShmRegion::anonymous(0).is_err());
}

#[test]
fn bounds_alignment_and_overlap_are_checked() {
    let r = Arc::new(ShmRegion::anonymous(8192).unwrap());
    let layout = FifoLayout {
        nslots: 8,
        slot_bytes: 512,
    };
    // head, tail, 8 slot headers of 32 bytes (length + descriptor), 8 slots.
    assert_eq!(layout.bytes(), 128 + 256 + 8 * 512);
    // Out of bounds, misaligned, bad layout.
    for (off, l) in [
        (8192, layout),
        (8192 - 64, layout),
        (usize::MAX - 10, layout),
        (32, layout),
        (
            0,
            FifoLayout {
                nslots: 0,
                slot_bytes: 64,
            },
        ),
        (
            0,
            FifoLayout {
                nslots: 8,
                slot_bytes: 0,
            },
        ),
    ] {
        let e = FifoSender::new(r.clone(), off, l).unwrap_err();
        assert!(
            matches!(e, CclError::InvalidArgument(_)),
            "{off} {l:?}: {e}"
        );
        let e = FifoReceiver::new(r.clone(), off, l).unwrap_err();
        assert!(
            matches!(e, CclError::InvalidArgument(_)),
            "{off} {l:?}: {e}"
        );
    }
    assert!(Doorbell::new(r.clone(), 8190).is_err());
    assert!(Doorbell::new(r.clone(), 4).is_err());
    assert!(r.atomic_u64(8188).is_err());
    assert!(r.atomic_u32(2).is_err());

    let tx = FifoSender::new(r.clone(), 0, layout).unwrap();
    // A second producer of the same FIFO, an overlapping FIFO, a doorbell or a word inside
    // it: refused with InvalidUsage.
    for e in [
        FifoSender::new(r.clone(), 0, layout).unwrap_err(),
        FifoSender::new(r.clone(), 64, layout).unwrap_err(),
        FifoReceiver::new(r.clone(), 64, layout).unwrap_err(),
        FifoReceiver::new(
            r.clone(),
            0,
            FifoLayout {
                nslots: 4,
                slot_bytes: 512,
            },
        )
        .unwrap_err(),
        Doorbell::new(r.clone(), 1024).unwrap_err(),
        r.atomic_u64(0).err().unwrap(),
    ] {
        assert!(matches!(e, CclError::InvalidUsage(_)), "{e}");
    }
    // The matching consumer is fine, and so is a FIFO right after it.
    let rx = FifoReceiver::new(r.clone(), 0, layout).unwrap();
    assert!(FifoReceiver::new(r.clone(), 0, layout).is_err());
    let after = layout.bytes();
    let _tx2 = FifoSender::new(
        r.clone(),
        after,
        FifoLayout {
            nslots: 1,
            slot_bytes: 64,
        },
    )
    .unwrap();
    // Doorbells: many handles to one bell are fine.
    let bell_at = 8192 - 64;
    let b1 = Doorbell::new(r.clone(), bell_at).unwrap();
    let b2 = Doorbell::new(r.clone(), bell_at).unwrap();
    b1.ring();
    assert_eq!(b2.value(), 1);
    // Mixed-size access to the doorbell's words is refused; same-size sharing is fine.
    assert!(matches!(
        r.atomic_u64(bell_at),
        Err(CclError::InvalidUsage(_))
    ));
    assert!(matches!(
        r.atomic_u32(bell_at),
        Err(CclError::InvalidUsage(_))
    ));
    let w = r.atomic_u64(bell_at - 64).unwrap();
    assert!(matches!(
        r.atomic_u32(bell_at - 60),
        Err(CclError::InvalidUsage(_))
    ));
    assert!(matches!(
        Doorbell::new(r.clone(), bell_at - 64),
        Err(CclError::InvalidUsage(_))
    ));
    assert!(std::ptr::eq(w, r.atomic_u64(bell_at - 64).unwrap()));
    // Dropping the ends frees the range.
    drop(tx);
    drop(rx);
    let _again = FifoSender::new(r.clone(), 0, layout).unwrap();
}

#[test]
fn pid_alive_on_self_and_on_a_reaped_child() {
    assert!(pid_alive(std::process::id()));
    assert!(!pid_alive(0));
    assert!(!pid_alive(u32::MAX));
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .arg("--list")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    assert!(child.wait().unwrap().success());
    assert!(!pid_alive(pid), "reaped child {pid} reported alive");
    // Pid 1 exists but (normally) may not be signalled by us: still alive.
    assert!(pid_alive(1));
}

#[test]
fn stale_segments_of_dead_creators_are_removed() {
    let prefix = format!("cclstale{}", std::process::id());
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .arg("--list")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let live = std::process::id();
    let dead_name = format!("{prefix}-00aa-1-{dead}");
    let live_name = format!("{prefix}-00aa-1-{live}");
    let odd_name = format!("{prefix}-00aa-notapid");
    for n in [&dead_name, &live_name, &odd_name] {
        std::fs::write(Path::new(SHM_DIR).join(n), b"x").unwrap();
    }
    assert_eq!(remove_stale_segments(&prefix).unwrap(), 1);
    assert!(!exists(&dead_name));
    assert!(exists(&live_name));
    assert!(exists(&odd_name));
    for n in [&live_name, &odd_name] {
        std::fs::remove_file(Path::new(SHM_DIR).join(n)).unwrap();
    }
    assert!(remove_stale_segments("bad/prefix").is_err());
}

#[test]
fn creation_reserves_pages_up_front() {
    // posix_fallocate makes the pages count as used at creation time (no SIGBUS later).
    let n = name("fallocate");
    let r = ShmRegion::create(&n, 1 << 20).unwrap();
    let meta = std::fs::metadata(Path::new(SHM_DIR).join(&n)).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert!(meta.blocks() * 512 >= 1 << 20, "{} blocks", meta.blocks());
    drop(r);
}
