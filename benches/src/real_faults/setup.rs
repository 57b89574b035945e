//! Builds what a real-fault run needs: our `libnccl.so.2` and `ccld` (cargo, same profile
//! as the calling binary), NVIDIA's `nccl.h` (the ABI test's cache
//! `.cache/nvidia-nccl-2.30.7/`, fetched with pip on first use, same lock protocol), and
//! the C client compiled against that header and linked to our library.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// NVIDIA's wheel holding `nccl.h` (the one `ccl-ffi`'s ABI test uses).
const WHEEL_SPEC: &str = "nvidia-nccl-cu13==2.30.7";

/// Paths of a prepared environment.
#[derive(Debug, Clone)]
pub struct Env {
    /// target/<profile>: our `libnccl.so.2` and `ccld`.
    pub lib_dir: PathBuf,
    /// The `ccld` binary.
    pub ccld: PathBuf,
    /// The compiled C client.
    pub client: PathBuf,
    /// Scratch directory (reports, logs).
    pub work: PathBuf,
}

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("crate has a parent directory")
        .to_path_buf()
}

/// target/<profile> of the running binary (a test in target/<profile>/deps, or a bin in
/// target/<profile>).
pub fn profile_dir() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let mut dir = exe
        .parent()
        .ok_or("binary has no parent directory")?
        .to_path_buf();
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.pop();
    }
    Ok(dir)
}

/// Runs `cmd` with a deadline; returns (success, stdout+stderr).
pub fn run_bounded(cmd: &mut Command, limit: Duration) -> (bool, String) {
    let log = std::env::temp_dir().join(format!(
        "ccld-real-faults-{}-{:?}.log",
        std::process::id(),
        Instant::now()
    ));
    let Ok(out) = std::fs::File::create(&log) else {
        return (false, format!("cannot create {}", log.display()));
    };
    let Ok(err) = out.try_clone() else {
        return (false, "cannot clone a file handle".into());
    };
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
                break false;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(_) => break false,
        }
    };
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    (ok, text)
}

/// `cargo build` of `args` with the profile of `lib_dir` (a no-op when up to date).
pub fn cargo_build(lib_dir: &Path, args: &[&str]) -> Result<(), String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--quiet"]).args(args);
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
    if let Some(target) = lib_dir.parent() {
        cmd.env("CARGO_TARGET_DIR", target);
    }
    cmd.current_dir(workspace_root());
    let (ok, log) = run_bounded(&mut cmd, Duration::from_secs(1800));
    if ok {
        Ok(())
    } else {
        Err(format!("cargo build {args:?} failed:\n{log}"))
    }
}

/// NVIDIA's `nccl.h` directory (downloaded once; parallel callers wait on `.lock`).
fn nvidia_include() -> Result<PathBuf, String> {
    let cache = workspace_root().join(".cache").join("nvidia-nccl-2.30.7");
    if cache.join("nccl.h").is_file() {
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
                let r = fetch_header(&cache);
                let _ = std::fs::remove_file(&lock);
                return r.map(|()| cache);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                if cache.join("nccl.h").is_file() {
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

/// pip download into a private directory; `nccl.h` is extracted and renamed into place.
fn fetch_header(cache: &Path) -> Result<(), String> {
    let tmp = cache.join(format!("tmp-rf-{}", std::process::id()));
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
    let r = if ok {
        let script = "import sys, zipfile, glob\n\
                      w = glob.glob(sys.argv[1] + '/*.whl')[0]\n\
                      z = zipfile.ZipFile(w)\n\
                      n = [x for x in z.namelist() if x.endswith('/include/nccl.h')][0]\n\
                      open(sys.argv[1] + '/nccl.h', 'wb').write(z.read(n))\n";
        let (ok, log) = run_bounded(
            Command::new(python()).arg("-c").arg(script).arg(&tmp),
            Duration::from_secs(120),
        );
        if ok {
            std::fs::rename(tmp.join("nccl.h"), cache.join("nccl.h"))
                .map_err(|e| format!("rename nccl.h: {e}"))
        } else {
            Err(format!("extracting nccl.h: {log}"))
        }
    } else {
        Err(format!("pip download {WHEEL_SPEC} failed: {log}"))
    };
    let _ = std::fs::remove_dir_all(&tmp);
    r
}

/// Stub CUDA headers: NVIDIA's `nccl.h` includes `cuda_runtime.h` for `cudaStream_t` only.
fn cuda_stub(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
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
        let p = dir.join(name);
        if std::fs::read_to_string(&p).ok().as_deref() != Some(text) {
            let tmp = dir.join(format!("{name}.{}", std::process::id()));
            std::fs::write(&tmp, text).map_err(|e| e.to_string())?;
            std::fs::rename(&tmp, &p).map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// The C client's source.
pub fn client_source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("c/train_client.c")
}

/// Compiles the C program `source` against NVIDIA's `nccl.h` (fetched on first use, with
/// stub CUDA headers) and links it to the `libnccl.so.2` in `lib_dir`; the binary lands
/// in `work`, named after the source. `Err` carries the compiler's output.
pub fn compile_nccl_client(lib_dir: &Path, source: &Path, work: &Path) -> Result<PathBuf, String> {
    let include = nvidia_include()?;
    let stub = work.join("cuda-stub");
    cuda_stub(&stub)?;
    let name = source
        .file_stem()
        .and_then(|s| s.to_str())
        .ok_or_else(|| format!("{}: no file name", source.display()))?;
    // A private output name, renamed into place: parallel test processes never run a
    // half-written binary.
    let client = work.join(name);
    let tmp = work.join(format!("{name}.{}", std::process::id()));
    let (ok, log) = run_bounded(
        Command::new("gcc")
            .args([
                "-std=c11",
                "-D_DEFAULT_SOURCE",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-O2",
            ])
            .arg("-I")
            .arg(&stub)
            .arg("-I")
            .arg(&include)
            .arg(source)
            .arg("-o")
            .arg(&tmp)
            .arg("-L")
            .arg(lib_dir)
            .arg("-l:libnccl.so.2"),
        Duration::from_secs(120),
    );
    if !ok {
        let _ = std::fs::remove_file(&tmp);
        return Err(format!("compiling {}:\n{log}", source.display()));
    }
    std::fs::rename(&tmp, &client).map_err(|e| format!("rename {name}: {e}"))?;
    Ok(client)
}

/// Builds everything; `Err` says what is missing.
pub fn prepare() -> Result<Env, String> {
    let lib_dir = profile_dir()?;
    cargo_build(&lib_dir, &["-p", "ccl-ffi", "--lib"])?;
    cargo_build(&lib_dir, &["-p", "ccld", "--bin", "ccld"])?;
    let ccld = lib_dir.join("ccld");
    if !lib_dir.join("libnccl.so.2").exists() || !ccld.is_file() {
        return Err(format!(
            "{} lacks libnccl.so.2 or ccld after the build",
            lib_dir.display()
        ));
    }
    let work = lib_dir.join("real-faults-work");
    let client = compile_nccl_client(&lib_dir, &client_source(), &work)?;
    Ok(Env {
        lib_dir,
        ccld,
        client,
        work,
    })
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
