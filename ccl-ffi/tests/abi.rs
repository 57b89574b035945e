//! ABI tests against NVIDIA's own NCCL 2.30.7 artefacts.
//!
//! NVIDIA's wheel `nvidia-nccl-cu13==2.30.7` is downloaded with pip into
//! `<workspace>/.cache/nvidia-nccl-2.30.7/` (gitignored; reused by later runs), and only
//! `nccl.h` and `libnccl.so.2` are extracted from it. C programs are compiled with gcc
//! against NVIDIA's header (CUDA headers replaced by a three-line stub that only declares
//! `cudaStream_t`) and linked ONLY against our `libnccl.so.2`.
//!
//! Without network or gcc the tests fail when `CI=true`, and otherwise skip with a loud
//! message on stderr.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const WHEEL_SPEC: &str = "nvidia-nccl-cu13==2.30.7";

struct Env {
    /// Directory with our libnccl.so.2 (target/<profile>).
    lib_dir: PathBuf,
    /// Our libnccl.so.2.
    our_lib: PathBuf,
    /// NVIDIA's extracted files.
    nv_include: PathBuf,
    nv_lib: PathBuf,
    /// Stub CUDA headers.
    cuda_stub: PathBuf,
    /// Scratch directory for binaries.
    work: PathBuf,
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("crate has a parent directory")
        .to_path_buf()
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Fails in CI, skips (loudly) elsewhere.
fn unavailable(why: &str) -> Option<&'static Env> {
    if in_ci() {
        panic!("ABI test prerequisites missing in CI: {why}");
    }
    eprintln!("\n!!!!! SKIPPING ABI TEST: {why} (set CI=true to make this a failure) !!!!!\n");
    None
}

/// Runs a command with a deadline; returns (success, stdout+stderr).
fn run_bounded(cmd: &mut Command, limit: Duration) -> (bool, String) {
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    let out_path = std::env::temp_dir().join(format!(
        "ccl-ffi-abi-{}-{}.log",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let out = std::fs::File::create(&out_path).expect("create log file");
    let err = out.try_clone().expect("clone log file");
    let mut child = match cmd.stdout(out).stderr(err).stdin(Stdio::null()).spawn() {
        Ok(c) => c,
        Err(e) => return (false, format!("cannot start {cmd:?}: {e}")),
    };
    let t0 = Instant::now();
    let ok = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st.success(),
            Ok(None) if t0.elapsed() > limit => {
                let _ = child.kill();
                let _ = child.wait();
                let log = std::fs::read_to_string(&out_path).unwrap_or_default();
                let _ = std::fs::remove_file(&out_path);
                return (false, format!("{log}\n[killed after {limit:?}]"));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(_) => break false,
        }
    };
    let log = std::fs::read_to_string(&out_path).unwrap_or_default();
    let _ = std::fs::remove_file(&out_path);
    (ok, log)
}

fn extract(wheel: &Path, dest: &Path) -> Result<(), String> {
    let script = r#"
import sys, zipfile, os
wheel, dest = sys.argv[1], sys.argv[2]
want = {"include/nccl.h": "nccl.h", "lib/libnccl.so.2": "libnccl.so.2"}
found = set()
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        out = None
        for suffix, o in want.items():
            if name.endswith("/" + suffix):
                out = o
        if "/include/nccl_device/" in name and not name.endswith("/"):
            out = "nccl_device/" + name.split("/include/nccl_device/", 1)[1]
        if out is None:
            continue
        path = os.path.join(dest, out)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with z.open(name) as src, open(path, "wb") as dst:
            dst.write(src.read())
        found.add(out)
missing = set(want.values()) - found
if missing or "nccl_device/core.h" not in found:
    sys.exit("wheel lacks " + ", ".join(sorted(missing)) + " or nccl_device/core.h")
"#;
    let (ok, log) = run_bounded(
        Command::new(python())
            .arg("-c")
            .arg(script)
            .arg(wheel)
            .arg(dest),
        Duration::from_secs(120),
    );
    if ok {
        Ok(())
    } else {
        Err(format!("extracting {}: {log}", wheel.display()))
    }
}

/// Downloads (once) and extracts NVIDIA's files; returns the cache directory. Test
/// processes run in parallel (nextest): one of them takes `.lock` (created atomically) and
/// fetches into a private directory, then renames the files into place; the others wait
/// for the files (a lock older than 15 minutes is considered stale).
fn nvidia_files() -> Result<PathBuf, String> {
    let cache = workspace_root().join(".cache").join("nvidia-nccl-2.30.7");
    let ready = || {
        cache.join("nccl.h").is_file()
            && cache.join("libnccl.so.2").is_file()
            && cache.join("nccl_device").join("core.h").is_file()
    };
    if ready() {
        return Ok(cache);
    }
    std::fs::create_dir_all(&cache).map_err(|e| format!("create {}: {e}", cache.display()))?;
    let lock = cache.join(".lock");
    let t0 = Instant::now();
    loop {
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&lock)
        {
            Ok(_) => {
                let r = fetch_into(&cache);
                let _ = std::fs::remove_file(&lock);
                return r.map(|()| cache);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                if ready() {
                    return Ok(cache);
                }
                let stale = std::fs::metadata(&lock)
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|m| m.elapsed().ok())
                    .is_some_and(|age| age > Duration::from_secs(900));
                if stale {
                    let _ = std::fs::remove_file(&lock);
                } else if t0.elapsed() > Duration::from_secs(900) {
                    return Err(format!("timed out waiting for {}", lock.display()));
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => return Err(format!("create {}: {e}", lock.display())),
        }
    }
}

/// pip download + extraction into a private directory, then atomic renames into `cache`.
fn fetch_into(cache: &Path) -> Result<(), String> {
    let tmp = cache.join(format!("tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| e.to_string())?;
    let (ok, log) = run_bounded(
        Command::new(python())
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--quiet",
                WHEEL_SPEC,
                "-d",
            ])
            .arg(&tmp),
        Duration::from_secs(600),
    );
    if !ok {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(format!("pip download {WHEEL_SPEC} failed: {log}"));
    }
    let wheel = std::fs::read_dir(&tmp)
        .map_err(|e| e.to_string())?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| format!("pip download left no wheel in {}", tmp.display()))?;
    let r = extract(&wheel, &tmp).and_then(|()| {
        // The device headers first: `nccl.h` and the library are what `ready` checks last.
        let _ = std::fs::remove_dir_all(cache.join("nccl_device"));
        for f in ["nccl_device", "libnccl.so.2", "nccl.h"] {
            std::fs::rename(tmp.join(f), cache.join(f)).map_err(|e| format!("rename {f}: {e}"))?;
        }
        Ok(())
    });
    // The 200 MB wheel is not kept: the tests need only the two files.
    let _ = std::fs::remove_dir_all(&tmp);
    r
}

/// Creates `dir` with stub CUDA headers (only `cudaStream_t`), atomically: concurrent test
/// processes never see a half-written file.
fn cuda_stub(dir: &Path) -> Result<(), String> {
    if dir.join("cuda_runtime.h").is_file() {
        return Ok(());
    }
    let tmp = dir.with_extension(format!("tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| e.to_string())?;
    let files = [
        (
            "cuda_runtime.h",
            "#include <stddef.h>\n#define CUDART_VERSION 12000\nstruct CUstream_st;\n\
             typedef struct CUstream_st* cudaStream_t;\n",
        ),
        ("cuda_fp16.h", ""),
        ("cuda_bf16.h", ""),
    ];
    for (name, text) in files {
        std::fs::write(tmp.join(name), text).map_err(|e| e.to_string())?;
    }
    if std::fs::rename(&tmp, dir).is_err() {
        // Another process won the race; its directory is complete.
        let _ = std::fs::remove_dir_all(&tmp);
    }
    if dir.join("cuda_runtime.h").is_file() {
        Ok(())
    } else {
        Err(format!("could not create {}", dir.display()))
    }
}

fn env() -> Option<&'static Env> {
    static ENV: OnceLock<Result<Env, String>> = OnceLock::new();
    let r = ENV.get_or_init(|| {
        // Test binary: target/<profile>/deps/abi-<hash>; the library is in target/<profile>.
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let lib_dir = exe
            .parent()
            .and_then(Path::parent)
            .ok_or("unexpected test binary location")?
            .to_path_buf();
        build_cdylib(&lib_dir)?;
        let our_lib = lib_dir.join("libnccl.so.2");
        if !our_lib.exists() {
            return Err(format!(
                "{} does not exist (ccl-ffi/build.rs creates it; if only the link was deleted, \
                 `touch ccl-ffi/build.rs` and build again)",
                our_lib.display()
            ));
        }
        if !Command::new("gcc")
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
        {
            return Err("gcc is not installed".into());
        }
        let cache = nvidia_files()?;
        let work = lib_dir.join("abi-test");
        std::fs::create_dir_all(&work).map_err(|e| e.to_string())?;
        let cuda_stub = work.join("cuda-stub");
        self::cuda_stub(&cuda_stub)?;
        Ok(Env {
            lib_dir,
            our_lib,
            nv_lib: cache.join("libnccl.so.2"),
            nv_include: cache,
            cuda_stub,
            work,
        })
    });
    match r {
        Ok(e) => Some(e),
        Err(why) => unavailable(why),
    }
}

/// `cargo test` builds this crate as an rlib for the tests but does not refresh the cdylib:
/// build it (a no-op when up to date) with the profile of this test binary.
fn build_cdylib(lib_dir: &Path) -> Result<(), String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--quiet", "-p", "ccl-ffi", "--lib"]);
    match lib_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => {}
        Some("release") => {
            cmd.arg("--release");
        }
        Some(other) => {
            cmd.args(["--profile", other]);
        }
        None => return Err("cannot tell the build profile".into()),
    }
    // target/<profile> -> target (also right for target/<triple>/<profile> builds without
    // --target, the only layout `cargo test` produces here).
    if let Some(target_dir) = lib_dir.parent() {
        cmd.env("CARGO_TARGET_DIR", target_dir);
    }
    cmd.current_dir(workspace_root());
    let (ok, log) = run_bounded(&mut cmd, Duration::from_secs(900));
    if ok {
        Ok(())
    } else {
        Err(format!("cargo build -p ccl-ffi failed:\n{log}"))
    }
}

fn c_source(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/c")
        .join(name)
}

fn our_include() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("include")
}

/// Compiles `src` against NVIDIA's header (`nvidia = true`) or ours; links our library
/// when `link`. Returns the binary path.
fn compile(e: &Env, src: &Path, out_name: &str, nvidia: bool, link: bool) -> PathBuf {
    let out = e.work.join(out_name);
    let mut cmd = Command::new("gcc");
    cmd.args([
        "-std=c11",
        "-D_DEFAULT_SOURCE",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-O1",
    ]);
    if nvidia {
        cmd.arg("-I").arg(&e.cuda_stub).arg("-I").arg(&e.nv_include);
    } else {
        cmd.arg("-I").arg(our_include());
    }
    cmd.arg(src).arg("-o").arg(&out);
    if link {
        cmd.arg("-L").arg(&e.lib_dir).arg("-l:libnccl.so.2");
    }
    let (ok, log) = run_bounded(&mut cmd, Duration::from_secs(120));
    assert!(ok, "compiling {} failed:\n{log}", src.display());
    out
}

fn run_c(e: &Env, bin: &Path, args: &[&str], limit: Duration) -> (bool, String) {
    run_c_env(e, bin, args, &[], limit)
}

fn run_c_env(
    e: &Env,
    bin: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    limit: Duration,
) -> (bool, String) {
    let mut cmd = Command::new(bin);
    cmd.args(args)
        .env("LD_LIBRARY_PATH", &e.lib_dir)
        .env_remove("NCCL_COMM_ID")
        .env_remove("NCCL_DEBUG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    run_bounded(&mut cmd, limit)
}

fn dynamic_symbols(lib: &Path) -> Vec<String> {
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(lib)
        .output()
        .expect("nm runs");
    assert!(out.status.success(), "nm -D {} failed", lib.display());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_string))
        .collect()
}

#[test]
fn we_export_every_nccl_symbol_nvidia_exports() {
    let Some(e) = env() else { return };
    let theirs: Vec<String> = dynamic_symbols(&e.nv_lib)
        .into_iter()
        .filter(|s| s.starts_with("nccl") || s.starts_with("pnccl"))
        .collect();
    assert!(theirs.len() > 100, "NVIDIA's list looks wrong: {theirs:?}");
    let ours = dynamic_symbols(&e.our_lib);
    let missing: Vec<&String> = theirs.iter().filter(|s| !ours.contains(s)).collect();
    assert!(missing.is_empty(), "missing exports: {missing:?}");
    // Only API symbols: nothing of Rust's runtime leaks into the dynamic table.
    let extra: Vec<&String> = ours
        .iter()
        .filter(|s| !(s.starts_with("nccl") || s.starts_with("pnccl")))
        .collect();
    assert!(extra.is_empty(), "non-API exports: {extra:?}");
}

#[test]
fn soname_is_libnccl_so_2() {
    let Some(e) = env() else { return };
    let out = Command::new("readelf")
        .arg("-d")
        .arg(&e.our_lib)
        .output()
        .expect("readelf runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("Library soname: [libnccl.so.2]"),
        "dynamic section:\n{text}"
    );
    assert!(e.lib_dir.join("libnccl.so").exists());
}

#[test]
fn our_header_has_nvidias_layout_and_values() {
    let Some(e) = env() else { return };
    let src = c_source("layout.c");
    let ours = compile(e, &src, "layout-ours", false, false);
    let theirs = compile(e, &src, "layout-nvidia", true, false);
    let (ok1, a) = run_c(e, &ours, &[], Duration::from_secs(30));
    let (ok2, b) = run_c(e, &theirs, &[], Duration::from_secs(30));
    assert!(ok1 && ok2, "layout programs failed:\n{a}\n{b}");
    assert!(a.contains("sizeof(ncclConfig_t) = 96"), "{a}");
    assert_eq!(a, b, "layout differs between our nccl.h and NVIDIA's");
    // Our header also works in C++ without CUDA headers.
    let (ok, log) = run_bounded(
        Command::new("g++")
            .args(["-x", "c++", "-Wall", "-Werror", "-fsyntax-only", "-I"])
            .arg(our_include())
            .arg(&src),
        Duration::from_secs(120),
    );
    assert!(
        ok || log.contains("cannot start"),
        "C++ compile failed:\n{log}"
    );
    // CUDA's runtime header before or after ours: one cudaStream_t, no conflict.
    let orders = [
        "#include <cuda_runtime.h>\n#include <nccl.h>\n",
        "#include <nccl.h>\n#include <cuda_runtime.h>\n",
    ];
    for (i, order) in orders.iter().enumerate() {
        let path = e.work.join(format!("cuda-order-{i}.c"));
        let text = format!(
            "{order}int f(cudaStream_t s) {{ return ncclBcast(0, 0, ncclInt, 0, 0, s); }}\n"
        );
        std::fs::write(&path, text).expect("write");
        let (ok, log) = run_bounded(
            Command::new("gcc")
                .args(["-std=c11", "-Wall", "-Werror", "-fsyntax-only", "-I"])
                .arg(our_include())
                .arg("-I")
                .arg(&e.cuda_stub)
                .arg(&path),
            Duration::from_secs(120),
        );
        assert!(ok, "{order}:\n{log}");
    }
}

/// The Rust types that cross the C ABI (`ncclConfig_t`, `ncclWaitSignalDesc_t`,
/// `ncclUniqueId`, handles) have the sizes and field offsets that NVIDIA's nccl.h gives
/// them, as a C compiler sees that header (`layout.c` built against NVIDIA's).
#[test]
fn rust_abi_types_have_nvidias_layout() {
    use std::mem::{offset_of, size_of};

    use nccl::api::WaitSignalDesc;
    use nccl::config::NcclConfig;
    let Some(e) = env() else { return };
    let theirs = compile(e, &c_source("layout.c"), "layout-nvidia-rs", true, false);
    let (ok, out) = run_c(e, &theirs, &[], Duration::from_secs(30));
    assert!(ok, "layout program failed:\n{out}");
    let c = |fact: &str| -> usize {
        out.lines()
            .find_map(|l| {
                l.strip_prefix(fact)?
                    .strip_prefix(" = ")?
                    .trim()
                    .parse()
                    .ok()
            })
            .unwrap_or_else(|| panic!("{fact} missing in NVIDIA's layout:\n{out}"))
    };
    let mut rust = vec![
        ("sizeof(ncclConfig_t)", size_of::<NcclConfig>()),
        ("sizeof(ncclWaitSignalDesc_t)", size_of::<WaitSignalDesc>()),
        ("sizeof(ncclUniqueId)", size_of::<ccl_core::UniqueId>()),
        ("sizeof(ncclComm_t)", size_of::<nccl::handles::CommHandle>()),
    ];
    macro_rules! fields {
        ($cty:literal, $rty:ty, $($c:ident => $r:ident),* $(,)?) => {
            $(rust.push((concat!("offsetof(", $cty, ", ", stringify!($c), ")"), offset_of!($rty, $r)));)*
        };
    }
    fields!("ncclConfig_t", NcclConfig,
        size => size, magic => magic, version => version, blocking => blocking,
        cgaClusterSize => cga_cluster_size, minCTAs => min_ctas, maxCTAs => max_ctas,
        netName => net_name, splitShare => split_share, trafficClass => traffic_class,
        commName => comm_name, collnetEnable => collnet_enable, CTAPolicy => cta_policy,
        shrinkShare => shrink_share, nvlsCTAs => nvls_ctas,
        nChannelsPerNetPeer => n_channels_per_net_peer,
        nvlinkCentricSched => nvlink_centric_sched, graphUsageMode => graph_usage_mode,
        numRmaCtx => num_rma_ctx, maxP2pPeers => max_p2p_peers,
        graphStreamOrdering => graph_stream_ordering,
    );
    fields!("ncclWaitSignalDesc_t", WaitSignalDesc,
        opCnt => op_cnt, peer => peer, sigIdx => sig_idx, ctx => ctx);
    let differ: Vec<String> = rust
        .iter()
        .filter(|(fact, ours)| c(fact) != *ours)
        .map(|(fact, ours)| format!("{fact}: ours {ours}, NVIDIA's {}", c(fact)))
        .collect();
    assert!(
        differ.is_empty(),
        "Rust ABI types differ from nccl.h: {differ:#?}"
    );
}

/// Every function NVIDIA's header declares is declared by ours with a compatible type:
/// each prototype of theirs is repeated after `#include <nccl.h>` (ours); C rejects
/// conflicting redeclarations. A reference to each name before the redeclarations fails
/// to compile if our header lacks it.
#[test]
fn our_header_declares_nvidias_prototypes() {
    let Some(e) = env() else { return };
    let text = std::fs::read_to_string(e.nv_include.join("nccl.h")).expect("read nccl.h");
    let protos = prototypes(&text);
    assert!(
        protos.len() >= 120,
        "found only {} prototypes",
        protos.len()
    );
    let mut src = String::from("#include <nccl.h>\nvoid *ccl_check_names[] = {\n");
    for (name, _) in &protos {
        src.push_str(&format!("  (void *)&{name},\n"));
    }
    src.push_str("};\n");
    for (_, p) in &protos {
        src.push_str(p);
        src.push('\n');
    }
    let path = e.work.join("protos.c");
    std::fs::write(&path, src).expect("write protos.c");
    let (ok, log) = run_bounded(
        Command::new("gcc")
            .args(["-std=c11", "-Wall", "-Werror", "-Wno-pedantic", "-c", "-o"])
            .arg(e.work.join("protos.o"))
            .arg("-I")
            .arg(our_include())
            .arg(&path),
        Duration::from_secs(120),
    );
    assert!(ok, "prototype check failed:\n{log}");
}

/// Function prototypes (name, text) of a C header: comments and preprocessor lines
/// dropped, statements split at `;`.
fn prototypes(header: &str) -> Vec<(String, String)> {
    let mut s = String::new();
    let mut rest = header;
    while let Some(i) = rest.find("/*") {
        s.push_str(&rest[..i]);
        rest = rest[i + 2..]
            .find("*/")
            .map_or("", |j| &rest[i + 2 + j + 2..]);
    }
    s.push_str(rest);
    let s: String = s
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = Vec::new();
    for chunk in s.split(';') {
        let c = chunk.rsplit(['{', '}']).next().unwrap_or("");
        let c = c.split_whitespace().collect::<Vec<_>>().join(" ");
        let body = c
            .strip_prefix("ncclResult_t ")
            .or_else(|| c.strip_prefix("const char* "))
            .or_else(|| c.strip_prefix("const char *"))
            .or_else(|| c.strip_prefix("void "));
        let Some(body) = body else { continue };
        let name = body.trim_start().split('(').next().unwrap_or("").trim();
        if (name.starts_with("nccl") || name.starts_with("pnccl"))
            && name
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || ch == '_')
            && body.contains('(')
        {
            out.push((name.to_string(), format!("{c};")));
        }
    }
    out
}

#[test]
fn bad_input_through_the_c_abi() {
    let Some(e) = env() else { return };
    let bin = compile(e, &c_source("badinput.c"), "badinput", true, true);
    let (ok, log) = run_c(e, &bin, &["basic"], Duration::from_secs(60));
    assert!(ok, "badinput basic:\n{log}");
}

#[test]
fn random_unique_id_fails_quickly() {
    let Some(e) = env() else { return };
    let bin = compile(e, &c_source("badinput.c"), "badinput-rid", true, true);
    // A short bootstrap timeout: even if the junk decoded to a reachable address, the
    // call must give up quickly.
    let env = [("CCLD_BOOTSTRAP_TIMEOUT_S", "5")];
    let (ok, log) = run_c_env(e, &bin, &["randomid"], &env, Duration::from_secs(30));
    assert!(ok, "badinput randomid:\n{log}");
}

#[test]
fn init_to_a_dead_root_fails_in_bounded_time() {
    let Some(e) = env() else { return };
    let bin = compile(e, &c_source("badinput.c"), "badinput-noroot", true, true);
    // The bound is the bootstrap timeout (CCLD_BOOTSTRAP_TIMEOUT_S, default 120 s).
    let env = [("CCLD_BOOTSTRAP_TIMEOUT_S", "5")];
    let (ok, log) = run_c_env(e, &bin, &["noroot"], &env, Duration::from_secs(60));
    assert!(ok, "badinput noroot:\n{log}");
}

#[test]
fn four_processes_run_collectives_through_nvidias_header() {
    let Some(e) = env() else { return };
    let bin = compile(e, &c_source("collectives.c"), "collectives", true, true);
    let (ok, log) = run_c(e, &bin, &["4"], Duration::from_secs(120));
    assert!(ok, "collectives on 4 processes:\n{log}");
    assert!(log.contains("collectives ok on 4 ranks"), "{log}");
}

fn run_feature(out_name: &str, mode: &str, n: &str) {
    let Some(e) = env() else { return };
    let bin = compile(e, &c_source("features.c"), out_name, true, true);
    let (ok, log) = run_c(e, &bin, &[mode, n], Duration::from_secs(120));
    assert!(ok, "features {mode} {n}:\n{log}");
    assert!(log.contains(&format!("{mode} ok on {n} ranks")), "{log}");
}

#[test]
fn comm_init_all_with_grouped_collectives() {
    run_feature("features-initall", "initall", "4");
}

#[test]
fn comm_split_across_processes() {
    run_feature("features-split", "split", "4");
}

#[test]
fn nonblocking_init_and_async_error_polling() {
    run_feature("features-nonblocking", "nonblocking", "3");
}

/// `ncclCommProperties_t` offsets in NVIDIA's device header (C++) equal ours.
#[test]
fn comm_properties_layout_matches_nvidia() {
    use nccl::device::{off, PROPS_SIZE};
    let Some(e) = env() else { return };
    let src = e.work.join("props.cc");
    std::fs::write(
        &src,
        "#include <nccl_device/core.h>\n#include <cstddef>\n#include <cstdio>\n\
         #define O(f) offsetof(ncclCommProperties_t, f)\n\
         int main() { printf(\"%zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu\\n\", \
         sizeof(ncclCommProperties_t), O(rank), O(nRanks), O(cudaDev), O(nvmlDev), \
         O(deviceApiSupport), O(multimemSupport), O(ginType), O(nLsaTeams), \
         O(hostRmaSupport), O(railedGinType)); }\n",
    )
    .expect("write props.cc");
    // NVIDIA's device headers also include cuda_fp8.h from C++.
    let stub = e.work.join("cuda-stub-cxx");
    let _ = std::fs::create_dir_all(&stub);
    for f in ["cuda_runtime.h", "cuda_fp16.h", "cuda_bf16.h"] {
        let _ = std::fs::copy(e.cuda_stub.join(f), stub.join(f));
    }
    let _ = std::fs::write(stub.join("cuda_fp8.h"), "");
    let bin = e.work.join("props");
    let (ok, log) = run_bounded(
        Command::new("g++")
            .arg("-I")
            .arg(&stub)
            .arg("-I")
            .arg(&e.nv_include)
            .arg(&src)
            .arg("-o")
            .arg(&bin),
        Duration::from_secs(120),
    );
    if !ok && log.contains("cannot start") {
        let _ = unavailable("g++ is not installed");
        return;
    }
    assert!(
        ok,
        "compiling against NVIDIA's nccl_device/core.h failed:\n{log}"
    );
    let (ok, out) = run_c(e, &bin, &[], Duration::from_secs(30));
    assert!(ok, "{out}");
    let want = format!(
        "{PROPS_SIZE} {} {} {} {} {} {} {} {} {} {}\n",
        off::RANK,
        off::N_RANKS,
        off::CUDA_DEV,
        off::NVML_DEV,
        off::DEVICE_API_SUPPORT,
        off::MULTIMEM_SUPPORT,
        off::GIN_TYPE,
        off::N_LSA_TEAMS,
        off::HOST_RMA_SUPPORT,
        off::RAILED_GIN_TYPE
    );
    assert_eq!(out, want);
}

#[test]
fn abort_from_another_thread_ends_a_blocked_collective() {
    run_feature("features-abort", "abort", "2");
}

/// Builds badinput.c against NVIDIA's header AND NVIDIA's library (optionally with an
/// RPATH to it), as a real application would be built.
fn compile_against_nvidia_lib(e: &Env, out_name: &str, rpath: bool) -> PathBuf {
    let out = e.work.join(out_name);
    let mut cmd = Command::new("gcc");
    cmd.args(["-std=c11", "-D_DEFAULT_SOURCE", "-pthread", "-O1", "-I"])
        .arg(&e.cuda_stub)
        .arg("-I")
        .arg(&e.nv_include)
        .arg(c_source("badinput.c"))
        .arg("-o")
        .arg(&out)
        .arg("-L")
        .arg(&e.nv_include)
        .arg("-l:libnccl.so.2");
    if rpath {
        // DT_RPATH (not RUNPATH): it wins over LD_LIBRARY_PATH, so only LD_PRELOAD helps.
        cmd.arg("-Wl,--disable-new-dtags")
            .arg(format!("-Wl,-rpath,{}", e.nv_include.display()));
    }
    let (ok, log) = run_bounded(&mut cmd, Duration::from_secs(120));
    assert!(ok, "linking against NVIDIA's libnccl.so.2 failed:\n{log}");
    out
}

/// Design §1: a program linked against NVIDIA's libnccl.so.2 runs on ours through
/// LD_LIBRARY_PATH (badinput checks messages only our library produces).
#[test]
fn program_linked_against_nvidia_runs_on_ours_via_library_path() {
    let Some(e) = env() else { return };
    let bin = compile_against_nvidia_lib(e, "badinput-nvlinked", false);
    let (ok, log) = run_c(e, &bin, &["basic"], Duration::from_secs(60));
    assert!(ok, "{log}");
}

/// With an RPATH to NVIDIA's library, LD_LIBRARY_PATH loses and NVIDIA's code runs (the
/// checks fail: they do tell the libraries apart); LD_PRELOAD of ours wins.
#[test]
fn program_with_rpath_to_nvidia_runs_on_ours_via_ld_preload() {
    let Some(e) = env() else { return };
    let bin = compile_against_nvidia_lib(e, "badinput-rpath", true);
    let (ok, log) = run_c(e, &bin, &["basic"], Duration::from_secs(60));
    assert!(!ok, "NVIDIA's library passed checks meant for ours:\n{log}");
    let (ok, log) = run_c_env(
        e,
        &bin,
        &["basic"],
        &[("LD_PRELOAD", e.our_lib.to_str().expect("utf-8 path"))],
        Duration::from_secs(60),
    );
    assert!(ok, "{log}");
}

#[test]
fn one_and_three_processes_run_collectives() {
    let Some(e) = env() else { return };
    let bin = compile(e, &c_source("collectives.c"), "collectives-13", true, true);
    for n in ["1", "3"] {
        let (ok, log) = run_c(e, &bin, &[n], Duration::from_secs(120));
        assert!(ok, "collectives on {n} processes:\n{log}");
        assert!(
            log.contains(&format!("collectives ok on {n} ranks")),
            "{log}"
        );
    }
}

/// The project's Python (`.cache/venv`, made by scripts/python-env.sh; Debian 12's system
/// Python refuses pip installs and may lack pip) where it exists, else `python3`.
fn python() -> std::path::PathBuf {
    let venv = std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../.cache/venv/bin/python3"
    ));
    if venv.is_file() {
        venv.to_path_buf()
    } else {
        "python3".into()
    }
}
