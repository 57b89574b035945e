//! Build script of `libnccl.so.2`.
//!
//! 1. Gives the cdylib the soname `libnccl.so.2`, so programs linked against it (or against
//!    NVIDIA's library) look for `libnccl.so.2` at run time.
//! 2. Cargo names the cdylib `libnccl.so` (from the lib name `nccl`) and cannot name it
//!    `libnccl.so.2` itself. Build scripts run before the crate is linked, so this script
//!    places a symlink `libnccl.so.2 -> libnccl.so` in the profile directory
//!    (`target/<profile>/`, or `target/<triple>/<profile>/`) next to where Cargo puts the
//!    library. The link dangles until the first link step finishes; it always points at the
//!    current build because it is relative. (NVIDIA ships the opposite: the real file is
//!    `libnccl.so.2` and `libnccl.so` the link; the loader does not care.)

use std::path::{Path, PathBuf};

fn profile_dir(out_dir: &Path) -> Option<PathBuf> {
    // OUT_DIR = <profile dir>/build/<pkg>-<hash>/out
    let dir = out_dir.parent()?.parent()?.parent()?;
    (dir.join("build").is_dir()).then(|| dir.to_path_buf())
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl.so.2");

    let Some(out_dir) = std::env::var_os("OUT_DIR").map(PathBuf::from) else {
        println!("cargo:warning=OUT_DIR not set; libnccl.so.2 link not created");
        return;
    };
    let Some(dir) = profile_dir(&out_dir) else {
        println!(
            "cargo:warning=unexpected OUT_DIR layout {}; libnccl.so.2 link not created",
            out_dir.display()
        );
        return;
    };
    let link = dir.join("libnccl.so.2");
    match std::fs::read_link(&link) {
        Ok(t) if t == Path::new("libnccl.so") => return,
        Ok(_) => {
            let _ = std::fs::remove_file(&link);
        }
        Err(_) => {
            // Not a link: a regular file left by someone else is replaced.
            if link.exists() {
                let _ = std::fs::remove_file(&link);
            }
        }
    }
    #[cfg(unix)]
    if let Err(e) = std::os::unix::fs::symlink("libnccl.so", &link) {
        println!(
            "cargo:warning=cannot create {} -> libnccl.so: {e}",
            link.display()
        );
    }
}
