//! The end-to-end diagnosis cases of `benches/tests/e2e_device.rs` as a program, for the GPU
//! suite (part f; the GPU machine has no cargo): ranks as threads of this process, each
//! with its own device communicator, stream and device buffers on device 0 (a GPU, or the
//! CPU emulator with `--emulate`), the embedded analyzer with shortened windows, and one
//! anomaly of each class S1/S2/S3/H1/H2/H3 injected through `CCLD_INJECT` at a non-zero
//! root. Prints one line per case:
//!
//! ```text
//! RIGHT class=S2CommunicationSlow n=4 root=2 got=S2CommunicationSlow roots=[2, 3] t=1.7s: ...
//! WRONG class=... (wrong class or rank, or no diagnosis)
//! ```
//!
//! and exits 1 if any case was WRONG, 2 when the device ranks could not be set up (no
//! GPU, host backend chosen).
//!
//! Usage: `device_diagnosis [--emulate] [--ranks N] [--classes s1,s2,s3,h1,h2,h3]`

use std::sync::Arc;
use std::time::{Duration, Instant};

use benches::e2e_harness::{roots_ok, run_case_device};
use ccld_wire::AnomalyClass;
use probe::CollKind;

fn class_of(s: &str) -> Option<AnomalyClass> {
    Some(match s {
        "s1" => AnomalyClass::S1ComputationSlow,
        "s2" => AnomalyClass::S2CommunicationSlow,
        "s3" => AnomalyClass::S3MixedSlow,
        "h1" => AnomalyClass::H1NotEntered,
        "h2" => AnomalyClass::H2Inconsistent,
        "h3" => AnomalyClass::H3Hardware,
        _ => return None,
    })
}

fn usage() -> ! {
    eprintln!("usage: device_diagnosis [--emulate] [--ranks N] [--classes s1,s2,s3,h1,h2,h3]");
    std::process::exit(2)
}

fn main() {
    // 8 ranks as threads need 16 hardware queues (see ccl_core::device::queues).
    ccl_core::device::queues::most_queues_for_this_program();
    let mut emulate = false;
    let mut n = 4usize;
    let mut classes: Vec<AnomalyClass> = ["h1", "h2", "h3", "s1", "s2", "s3"]
        .iter()
        .filter_map(|c| class_of(c))
        .collect();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--emulate" => emulate = true,
            "--ranks" => {
                n = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|&v| (2..=8).contains(&v))
                    .unwrap_or_else(|| usage())
            }
            "--classes" => {
                let v = args.next().unwrap_or_else(|| usage());
                classes = v
                    .split(',')
                    .map(|c| class_of(c.trim()).unwrap_or_else(|| usage()))
                    .collect();
            }
            _ => usage(),
        }
    }
    if emulate {
        std::env::set_var("CCLD_DEVICE_EMULATION", "1");
    }
    if std::env::var_os("CCLD_BOOTSTRAP_IP").is_none() {
        std::env::set_var("CCLD_BOOTSTRAP_IP", "127.0.0.1");
    }
    // As the CI test: Simple, 16 KiB slots (one message per ring step and channel).
    std::env::set_var("NCCL_BUFFSIZE", "131072");
    std::env::set_var("NCCL_PROTO", "Simple");
    let (api, device) = match ccl_core::device::runtime::device_api(Some(0)) {
        Ok(Ok(x)) => x,
        Ok(Err(why)) => {
            println!("SKIP no device: {why}");
            std::process::exit(2);
        }
        Err(e) => {
            println!("SKIP {e}");
            std::process::exit(2);
        }
    };
    println!(
        "device_diagnosis: {} ranks on device {device} ({}), classes {classes:?}",
        n,
        api.name()
    );
    let mut wrong = 0;
    for (i, &class) in classes.iter().enumerate() {
        let root = 1 + i % (n - 1); // non-zero roots, rotating
        let t = Instant::now();
        let ds = match run_case_device(
            &Arc::clone(&api),
            device,
            class,
            n,
            root,
            CollKind::AllReduce,
            Duration::from_secs(20),
        ) {
            Ok(ds) => ds,
            Err(e) => {
                println!("SKIP device ranks could not be set up: {e}");
                std::process::exit(2);
            }
        };
        let line = match ds.first() {
            None => {
                wrong += 1;
                format!("WRONG class={class:?} n={n} root={root} got=nothing")
            }
            Some(d) => {
                let roots: Vec<u32> = d.roots.iter().map(|r| r.rank).collect();
                let ok = d.class() == class && roots_ok(class, root, &roots);
                if !ok {
                    wrong += 1;
                }
                format!(
                    "{} class={class:?} n={n} root={root} got={:?} roots={roots:?} t={:.1}s: {}",
                    if ok { "RIGHT" } else { "WRONG" },
                    d.class(),
                    t.elapsed().as_secs_f64(),
                    probe::describe(d)
                )
            }
        };
        println!("{line}");
    }
    println!(
        "device_diagnosis: {} of {} right",
        classes.len() - wrong,
        classes.len()
    );
    std::process::exit(i32::from(wrong > 0));
}
