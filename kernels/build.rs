//! Builds the device kernels with nvcc (through the `cc` crate in CUDA mode) when nvcc can
//! be found, and always builds the small C layout probe used by the tests.
//!
//! nvcc is looked up in this order: `$NVCC`, `nvcc` on `PATH`, `$CUDA_HOME/bin/nvcc`
//! (`$CUDA_PATH` too), the `nvidia-cuda-nvcc` PyPI wheel of the project's venv
//! `.cache/venv` or else of `python3` (`site-packages/nvidia/cu13/bin/nvcc`, see
//! scripts/install-toolchains.sh), then
//! `/usr/local/cuda/bin/nvcc`. `CCLD_NO_NVCC=1` skips the search. Without nvcc the crate builds the host backend only
//! (`kernels::cuda_built() == false`) and says so with a cargo warning; with the `cuda`
//! feature a missing nvcc is an error.
//!
//! Rerun: cargo reruns this script when `PATH` or the variables above change, when the
//! nvcc it used changes, and, while no nvcc is found, when the wheel's directory
//! (`site-packages/nvidia`, or site-packages itself while that does not exist) changes, so
//! that installing the toolchain after a first build switches to the CUDA variant. The
//! variant built is always printed as a cargo warning.
//!
//! Always built, with the system C++ compiler: the device part of the kernels
//! (`src/ccl_kernel_body.h`) for the host CPU (`src/host_kernel.cpp`, `include/ccl_sim.h`),
//! which the emulated device runs. `CCLD_SIM_THREADS` (default 2) sets its threads per
//! block (`CCL_THREADS`); `CCLD_KERNEL_TSAN=1` instruments it with ThreadSanitizer;
//! `CCLD_KERNEL_COVERAGE=1` with gcov (scripts/kernel-coverage.sh).
//!
//! The kernels are compiled to machine code for sm_80, sm_90 and the newer targets this
//! nvcc supports (sm_100, sm_120), no PTX, so nothing is JIT-compiled at load time; the CUDA
//! runtime is linked statically (`cudart_static`, plus pthread, dl, rt), so libnccl.so.2
//! needs neither libcudart nor libcuda at load time (cudart_static dlopens libcuda on first
//! use).

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const ARCHS: &[&str] = &["sm_80", "sm_90", "sm_100", "sm_120"];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=include/ccl_device.h");
    println!("cargo:rerun-if-changed=include/ccl_portability.h");
    println!("cargo:rerun-if-changed=src/ccl_kernels.cu");
    println!("cargo:rerun-if-changed=src/ccl_kernel_body.h");
    println!("cargo:rerun-if-changed=src/ccl_host_sim.h");
    println!("cargo:rerun-if-changed=src/host_kernel.cpp");
    println!("cargo:rerun-if-changed=include/ccl_sim.h");
    println!("cargo:rerun-if-changed=src/layout.c");
    println!("cargo:rerun-if-changed=src/dev_stubs.c");
    println!("cargo:rerun-if-changed={CHECKED_IN_BINDINGS}");
    for v in [
        "NVCC",
        "CUDA_HOME",
        "CUDA_PATH",
        ccl_params::CCLD_NO_NVCC.name,
        "PATH",
        ccl_params::CCLD_SIM_THREADS.name,
        ccl_params::CCLD_KERNEL_TSAN.name,
        ccl_params::CCLD_KERNEL_COVERAGE.name,
    ] {
        println!("cargo:rerun-if-env-changed={v}");
    }
    println!("cargo:rustc-check-cfg=cfg(ccl_cuda)");

    bindings();

    // The C layout probe: sizeof/offsetof of the header's structs as gcc sees them.
    cc::Build::new()
        .file("src/layout.c")
        .include("include")
        .warnings(true)
        .compile("ccl_layout");

    build_host_kernel();

    let required = env::var_os("CARGO_FEATURE_CUDA").is_some();
    // CCLD_NO_NVCC=1: build the host-only variant even where nvcc exists (checks that
    // variant in CI; saves the nvcc time on machines that never run kernels).
    let skip = env::var(ccl_params::CCLD_NO_NVCC.name).is_ok_and(|v| v == "1");
    match if skip { None } else { find_nvcc() } {
        Some(nvcc) => {
            println!("cargo:rerun-if-changed={}", nvcc.display());
            build_cuda(&nvcc);
        }
        None if required => {
            panic!(
                "kernels: feature `cuda` is on but no nvcc was found (tried $NVCC, PATH, \
                 $CUDA_HOME/bin, the nvidia-cuda-nvcc wheel of python3, /usr/local/cuda); \
                 run scripts/install-toolchains.sh --cuda-only"
            );
        }
        None => {
            build_stubs();
            if !skip {
                watch_wheel_dirs();
            }
            println!(
                "cargo:warning=kernels: variant HOST-ONLY ({}); the device kernels are not \
                 in this build (run scripts/install-toolchains.sh --cuda-only; cargo rebuilds \
                 when nvcc appears)",
                if skip {
                    "CCLD_NO_NVCC=1"
                } else {
                    "nvcc not found"
                }
            );
        }
    }
}

/// The bindgen output as committed: what a build uses where libclang cannot be loaded, and
/// what `kernels/tests/abi.rs::the_committed_bindings_are_bindgens_output` compares the
/// generated file with.
const CHECKED_IN_BINDINGS: &str = "src/ccl_device_sys.rs";

/// The Rust bindings of `include/ccl_device.h` and `include/ccl_sim.h` (types, constants,
/// functions), generated by bindgen into `$OUT_DIR/ccl_device_sys.rs`, which `src/ffi.rs`
/// includes. bindgen loads libclang at run time; where it cannot (a machine without clang),
/// the committed copy is used instead and a cargo warning says so. `CCL_BINDINGS_SOURCE`
/// (compile-time environment of the crate) records which: `bindgen` or `checked-in`.
fn bindings() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR")).join("ccl_device_sys.rs");
    // bindgen panics when libclang is missing: that is the fallback's case, not an error.
    let generated = std::panic::catch_unwind(generate_bindings);
    let source = match generated {
        Ok(Ok(text)) => {
            std::fs::write(&out, text).expect("kernels: write the generated bindings");
            "bindgen"
        }
        failed => {
            let why = match failed {
                Ok(Err(e)) => e,
                _ => "libclang could not be loaded".to_string(),
            };
            println!(
                "cargo:warning=kernels: bindgen did not run ({why}); using the committed \
                 bindings {CHECKED_IN_BINDINGS}"
            );
            std::fs::copy(CHECKED_IN_BINDINGS, &out).expect("kernels: copy the committed bindings");
            "checked-in"
        }
    };
    println!("cargo:rustc-env=CCL_BINDINGS_SOURCE={source}");
}

/// Integer types of the header's constants where `u32` (bindgen's choice for a small
/// non-negative value) is not what Rust code indexes or compares with.
#[derive(Debug)]
struct ConstTypes;

impl bindgen::callbacks::ParseCallbacks for ConstTypes {
    fn int_macro(&self, name: &str, _value: i64) -> Option<bindgen::callbacks::IntKind> {
        use bindgen::callbacks::IntKind;
        const SIZES: &[&str] = &[
            "CCL_FRAME_BLOCKS",
            "CCL_FRAME_HEADER_BYTES",
            "CCL_PAPER_CHANNELS",
            "CCL_LL_MAX_CHUNK",
            "CCL_MAX_BUFS",
            "CCL_MAX_LANES_PER_CHANNEL",
            "CCL_MAX_CHANNELS",
            "CCL_IPC_HANDLE_BYTES",
            "CCL_DESC_WORDS",
            "CCL_GATE_WORD",
        ];
        if SIZES.contains(&name) {
            Some(IntKind::Custom {
                name: "usize",
                is_signed: false,
            })
        } else if name.starts_with("CCL_DEV_") || name.starts_with("CCL_PTR_") {
            Some(IntKind::I32)
        } else if matches!(
            name,
            "CCL_DESC_POISON_MARK" | "CCL_TAIL_POISON" | "CCL_FRAME_EXT_WORDS"
        ) {
            Some(IntKind::U64)
        } else {
            Some(IntKind::U32)
        }
    }
}

fn generate_bindings() -> Result<String, String> {
    let b = bindgen::Builder::default()
        .header("include/ccl_device.h")
        .header("include/ccl_sim.h")
        .allowlist_item("(ccl|CCL)_.*")
        .blocklist_item("CCL_(DEVICE|SIM)_H")
        .derive_default(true)
        .derive_eq(true)
        .derive_partialeq(true)
        .parse_callbacks(Box::new(ConstTypes))
        .formatter(bindgen::Formatter::Prettyplease)
        .generate()
        .map_err(|e| e.to_string())?;
    Ok(format!(
        "// @generated by bindgen from include/ccl_device.h and include/ccl_sim.h (kernels/build.rs).\n\
         // Do not edit: scripts/regen-bindings.sh writes this file.\n\n{b}"
    ))
}

/// The header's functions as stubs (`CCL_DEV_UNSUPPORTED`), for a build without kernels: the
/// Rust declarations (bindgen's) are the same in both builds.
fn build_stubs() {
    cc::Build::new()
        .file("src/dev_stubs.c")
        .include("include")
        .warnings(true)
        .flag_if_supported("-Wno-unused-parameter")
        .compile("ccl_dev_stubs");
}

/// Threads per block of the host build of the kernel (`CCLD_SIM_THREADS`, default 2).
fn sim_threads() -> u32 {
    match env::var(ccl_params::CCLD_SIM_THREADS.name) {
        Ok(v) => match v.trim().parse::<u32>() {
            Ok(n) if (1..=1024).contains(&n) => n,
            _ => panic!("kernels: CCLD_SIM_THREADS={v:?} is not a thread count in 1..=1024"),
        },
        Err(_) => 2,
    }
}

/// Directory holding gcc's runtime library `file` (libtsan.so, libgcov.a).
fn gcc_lib_dir(file: &str) -> PathBuf {
    let out = Command::new("gcc")
        .arg(format!("-print-file-name={file}"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    match out {
        Some(p) if p.is_absolute() && p.is_file() => p.parent().map(Path::to_path_buf).unwrap(),
        _ => panic!("kernels: gcc does not know {file} (needed by the instrumented host kernel)"),
    }
}

/// The device part of the kernels for the host CPU (include/ccl_sim.h).
fn build_host_kernel() {
    let on = |v: &str| env::var(v).is_ok_and(|x| x == "1");
    let (tsan, cov) = (
        on(ccl_params::CCLD_KERNEL_TSAN.name),
        on(ccl_params::CCLD_KERNEL_COVERAGE.name),
    );
    let threads = sim_threads();
    let mut b = cc::Build::new();
    b.cpp(true)
        .file("src/host_kernel.cpp")
        .include("include")
        .define("CCL_THREADS", threads.to_string().as_str())
        .flag("-std=c++17")
        .warnings(true);
    if tsan {
        b.flag("-fsanitize=thread").opt_level(1).debug(true);
    }
    if cov {
        // gcov wants no optimisation (line counts of inlined code) and absolute paths.
        b.flag("--coverage").opt_level(0);
    }
    b.compile("ccl_host_kernel");
    if tsan {
        println!(
            "cargo:rustc-link-search=native={}",
            gcc_lib_dir("libtsan.so").display()
        );
        println!("cargo:rustc-link-lib=dylib=tsan");
    }
    if cov {
        println!(
            "cargo:rustc-link-search=native={}",
            gcc_lib_dir("libgcov.a").display()
        );
        println!("cargo:rustc-link-lib=static=gcov");
    }
    println!(
        "cargo:warning=kernels: host build of the kernel source: {threads} threads per block{}{}",
        if tsan { ", ThreadSanitizer" } else { "" },
        if cov { ", gcov" } else { "" }
    );
}

/// While no nvcc is found: rerun when the nvidia-cuda-nvcc wheel may appear. Watches
/// python3's `site-packages/nvidia` where it exists, else the site-packages directory
/// (cargo scans a watched directory recursively; pip creates `nvidia/` in it).
fn watch_wheel_dirs() {
    let out = Command::new(python())
        .args([
            "-c",
            "import site
for p in site.getsitepackages() + [site.getusersitepackages()]: print(p)",
        ])
        .output();
    let Ok(out) = out else { return };
    for dir in String::from_utf8_lossy(&out.stdout).lines() {
        let site = Path::new(dir.trim());
        let nv = site.join("nvidia");
        if nv.is_dir() {
            println!("cargo:rerun-if-changed={}", nv.display());
        } else if site.is_dir() {
            println!("cargo:rerun-if-changed={}", site.display());
        }
    }
}

/// The project's own Python (`.cache/venv`, made by scripts/python-env.sh, where
/// scripts/install-toolchains.sh puts the nvcc wheel) where it exists, else `python3`.
fn python() -> PathBuf {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.cache/venv/bin/python3");
    if is_file(&venv) {
        venv
    } else {
        PathBuf::from("python3")
    }
}

fn is_file(p: &Path) -> bool {
    p.is_file()
}

fn find_nvcc() -> Option<PathBuf> {
    if let Some(p) = env::var_os("NVCC") {
        let p = PathBuf::from(p);
        if is_file(&p) {
            return Some(p);
        }
        println!(
            "cargo:warning=kernels: NVCC={} is not a file; looking elsewhere",
            p.display()
        );
    }
    if let Some(path) = env::var_os("PATH") {
        for dir in env::split_paths(&path) {
            let p = dir.join("nvcc");
            if is_file(&p) {
                return Some(p);
            }
        }
    }
    for v in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(h) = env::var_os(v) {
            let p = PathBuf::from(h).join("bin").join("nvcc");
            if is_file(&p) {
                return Some(p);
            }
        }
    }
    if let Some(p) = wheel_nvcc() {
        return Some(p);
    }
    let p = PathBuf::from("/usr/local/cuda/bin/nvcc");
    is_file(&p).then_some(p)
}

/// nvcc of the `nvidia-cuda-nvcc` wheel installed for `python3` (nvidia/cu13/bin/nvcc).
fn wheel_nvcc() -> Option<PathBuf> {
    let out = Command::new(python())
        .args([
            "-c",
            "import nvidia, os\nfor p in nvidia.__path__: print(p)",
        ])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .flat_map(|root| {
            ["cu13", "cu12", "cuda_nvcc"]
                .iter()
                .map(move |sub| Path::new(root.trim()).join(sub).join("bin").join("nvcc"))
        })
        .find(|p| is_file(p))
}

/// Machine-code targets from [`ARCHS`] that this nvcc can generate.
fn supported_archs(nvcc: &Path) -> Vec<&'static str> {
    let listed = Command::new(nvcc)
        .arg("--list-gpu-code")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    match listed {
        Some(l) => ARCHS
            .iter()
            .copied()
            .filter(|a| l.split_whitespace().any(|w| w == *a))
            .collect(),
        // Old nvcc without --list-gpu-code: the two baseline targets.
        None => vec!["sm_80", "sm_90"],
    }
}

fn build_cuda(nvcc: &Path) {
    let archs = supported_archs(nvcc);
    if archs.is_empty() {
        panic!("kernels: {} supports none of {ARCHS:?}", nvcc.display());
    }
    // cc picks nvcc up from $NVCC (setting it as `.compiler()` would lose nvcc's flag
    // translation); only this build script's process sees the change.
    env::set_var("NVCC", nvcc);
    let mut b = cc::Build::new();
    b.cuda(true)
        .cudart("none")
        .include("include")
        .file("src/ccl_kernels.cu")
        // Device debug (-G) would make the kernels unusably slow; release profiles carry
        // host debug info, which cc would otherwise turn into -G.
        .debug(false)
        .opt_level(3)
        .flag("-std=c++17")
        .flag("--expt-relaxed-constexpr");
    for a in &archs {
        let num = a.trim_start_matches("sm_");
        b.flag(format!("-gencode=arch=compute_{num},code={a}"));
    }
    b.compile("ccl_kernels");

    // cudart_static and what it needs; the wheel keeps it in nvidia/cu13/lib, a toolkit in
    // lib64 (or targets/<arch>-linux/lib).
    let root = nvcc
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let mut found = false;
    for sub in [
        "lib",
        "lib64",
        "targets/x86_64-linux/lib",
        "targets/sbsa-linux/lib",
    ] {
        let dir = root.join(sub);
        if dir.join("libcudart_static.a").is_file() {
            println!("cargo:rustc-link-search=native={}", dir.display());
            found = true;
            break;
        }
    }
    if !found {
        panic!(
            "kernels: libcudart_static.a not found next to {} (install nvidia-cuda-runtime \
             of the same CUDA line: scripts/install-toolchains.sh --cuda-only)",
            nvcc.display()
        );
    }
    println!("cargo:rustc-link-lib=static=cudart_static");
    for l in ["pthread", "dl", "rt"] {
        println!("cargo:rustc-link-lib=dylib={l}");
    }
    println!("cargo:rustc-cfg=ccl_cuda");
    let version = Command::new(nvcc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .find(|l| l.contains("release"))
                .map(|l| l.trim().to_string())
        })
        .unwrap_or_else(|| "version unknown".into());
    println!(
        "cargo:warning=kernels: variant CUDA, built by {} ({version}) for {}",
        nvcc.display(),
        archs.join(",")
    );
}
