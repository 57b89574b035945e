//! Where this process stands in a multi-process run (mpirun, srun, torchrun-style
//! launchers, `ccl-run`), NCCL_TESTS_SPLIT colours, and sharing the 128-byte unique id
//! through a rendezvous file. Environment values are parsed strictly: a malformed value is
//! an error naming the variable.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A bad environment value, naming the variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvError(pub String);

impl std::fmt::Display for EnvError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// This process's place among the launcher's processes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcInfo {
    /// Processes in the job.
    pub nprocs: usize,
    /// This process's index.
    pub proc: usize,
    /// Index among the processes on this host.
    pub local_rank: usize,
    /// Which launcher's variables were used ("none" for a single process).
    pub source: &'static str,
}

/// Launcher variable sets, in order of preference: (size, rank, local rank, name).
const LAUNCHERS: &[(&str, &str, &str, &str)] = &[
    (
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "Open MPI",
    ),
    ("PMI_SIZE", "PMI_RANK", "MPI_LOCALRANKID", "PMI"),
    (
        "SLURM_STEP_NUM_TASKS",
        "SLURM_PROCID",
        "SLURM_LOCALID",
        "Slurm",
    ),
    ("WORLD_SIZE", "RANK", "LOCAL_RANK", "torchrun/ccl-run"),
];

fn parse_usize(name: &str, raw: &str) -> Result<usize, EnvError> {
    raw.trim()
        .parse::<usize>()
        .map_err(|_| EnvError(format!("{name}={raw:?} is not a non-negative integer")))
}

/// Determines the process layout from `get` (the environment in production).
pub fn proc_info(get: &dyn Fn(&str) -> Option<String>) -> Result<ProcInfo, EnvError> {
    for (size_v, rank_v, local_v, source) in LAUNCHERS {
        let (Some(size), Some(rank)) = (get(size_v), get(rank_v)) else {
            continue;
        };
        let nprocs = parse_usize(size_v, &size)?;
        let proc = parse_usize(rank_v, &rank)?;
        if nprocs == 0 || proc >= nprocs {
            return Err(EnvError(format!(
                "{rank_v}={proc} is not below {size_v}={nprocs}"
            )));
        }
        let local_rank = match get(local_v) {
            Some(v) => parse_usize(local_v, &v)?,
            None => 0,
        };
        return Ok(ProcInfo {
            nprocs,
            proc,
            local_rank,
            source,
        });
    }
    Ok(ProcInfo {
        nprocs: 1,
        proc: 0,
        local_rank: 0,
        source: "none",
    })
}

/// NCCL_TESTS_SPLIT / NCCL_TESTS_SPLIT_MASK: the colour of process `proc` (processes of
/// one colour form one communicator). "AND|&", "OR||", "MOD|%", "DIV|/" then a number
/// (0x for hex); the mask is hexadecimal and means `proc & mask`.
pub fn split_color(
    proc: usize,
    split: Option<&str>,
    mask: Option<&str>,
) -> Result<usize, EnvError> {
    if let Some(s) = split {
        let s = s.trim();
        type Op = fn(usize, usize) -> Option<usize>;
        let ops: [(&str, Op); 8] = [
            ("AND", |p, v| Some(p & v)),
            ("&", |p, v| Some(p & v)),
            ("OR", |p, v| Some(p | v)),
            ("|", |p, v| Some(p | v)),
            ("MOD", |p, v| p.checked_rem(v)),
            ("%", |p, v| p.checked_rem(v)),
            ("DIV", |p, v| p.checked_div(v)),
            ("/", |p, v| p.checked_div(v)),
        ];
        for (prefix, f) in ops {
            if let Some(rest) = s.strip_prefix(prefix) {
                let rest = rest.trim();
                let v = if let Some(h) = rest.strip_prefix("0x").or_else(|| rest.strip_prefix("0X"))
                {
                    usize::from_str_radix(h, 16).ok()
                } else {
                    rest.parse::<usize>().ok()
                };
                let v = v.ok_or_else(|| {
                    EnvError(format!("NCCL_TESTS_SPLIT={s:?}: bad number {rest:?}"))
                })?;
                return f(proc, v)
                    .ok_or_else(|| EnvError(format!("NCCL_TESTS_SPLIT={s:?}: division by zero")));
            }
        }
        return Err(EnvError(format!(
            "NCCL_TESTS_SPLIT={s:?} must start with AND, &, OR, |, MOD, %, DIV or /"
        )));
    }
    if let Some(m) = mask {
        let t = m.trim();
        let h = t
            .strip_prefix("0x")
            .or_else(|| t.strip_prefix("0X"))
            .unwrap_or(t);
        let v = usize::from_str_radix(h, 16)
            .map_err(|_| EnvError(format!("NCCL_TESTS_SPLIT_MASK={m:?} is not hexadecimal")))?;
        return Ok(proc & v);
    }
    Ok(0)
}

/// The rendezvous file for the unique id: NCCL_TESTS_UID_FILE, else one derived from the
/// launcher's job id (Slurm job+step, PMIx namespace, Open MPI job id, torchrun run id)
/// under the temp directory; None when there is none.
pub fn uid_file(get: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
    if let Some(p) = get("NCCL_TESTS_UID_FILE") {
        return Some(PathBuf::from(p));
    }
    let job = if let Some(j) = get("SLURM_JOB_ID") {
        Some(format!(
            "slurm-{j}-{}",
            get("SLURM_STEP_ID").unwrap_or_default()
        ))
    } else if let Some(ns) = get("PMIX_NAMESPACE") {
        Some(format!("pmix-{ns}"))
    } else if let Some(j) = get("OMPI_MCA_ess_base_jobid") {
        Some(format!("ompi-{j}"))
    } else {
        get("TORCHELASTIC_RUN_ID").map(|r| format!("torch-{r}"))
    }?;
    let safe: String = job
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    Some(std::env::temp_dir().join(format!("nccl-tests-uid-{safe}")))
}

/// The id file for one colour (colour 0 uses the path itself).
pub fn color_path(base: &Path, color: usize) -> PathBuf {
    if color == 0 {
        base.to_path_buf()
    } else {
        let mut s = base.as_os_str().to_owned();
        s.push(format!(".{color}"));
        PathBuf::from(s)
    }
}

/// Writes the id atomically (temp file + rename).
pub fn publish_id(path: &Path, id: &[u8; 128]) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, id)?;
    std::fs::rename(&tmp, path)
}

/// Waits for the id file to appear with 128 bytes, polling every 10 ms up to `timeout`.
pub fn wait_id(path: &Path, timeout: Duration) -> std::io::Result<[u8; 128]> {
    let start = Instant::now();
    loop {
        if let Ok(b) = std::fs::read(path) {
            if b.len() == 128 {
                let mut id = [0u8; 128];
                id.copy_from_slice(&b);
                return Ok(id);
            }
        }
        if start.elapsed() > timeout {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no unique id in {} after {:?}", path.display(), timeout),
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn launchers() {
        assert_eq!(proc_info(&env(&[])).unwrap().nprocs, 1);
        let p = proc_info(&env(&[
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            ("RANK", "9"),
        ]))
        .unwrap();
        assert_eq!(
            (p.nprocs, p.proc, p.local_rank, p.source),
            (4, 2, 0, "Open MPI")
        );
        let p = proc_info(&env(&[("PMI_SIZE", "2"), ("PMI_RANK", "1")])).unwrap();
        assert_eq!((p.nprocs, p.proc), (2, 1));
        let p = proc_info(&env(&[
            ("SLURM_STEP_NUM_TASKS", "8"),
            ("SLURM_PROCID", "5"),
            ("SLURM_LOCALID", "1"),
        ]))
        .unwrap();
        assert_eq!((p.nprocs, p.proc, p.local_rank), (8, 5, 1));
        let p = proc_info(&env(&[
            ("WORLD_SIZE", "3"),
            ("RANK", "2"),
            ("LOCAL_RANK", "2"),
        ]))
        .unwrap();
        assert_eq!((p.nprocs, p.proc, p.local_rank), (3, 2, 2));
        assert!(proc_info(&env(&[("WORLD_SIZE", "x"), ("RANK", "0")]))
            .unwrap_err()
            .0
            .contains("WORLD_SIZE"));
        assert!(proc_info(&env(&[("WORLD_SIZE", "2"), ("RANK", "2")])).is_err());
        assert!(proc_info(&env(&[
            ("WORLD_SIZE", "2"),
            ("RANK", "1"),
            ("LOCAL_RANK", "-1")
        ]))
        .unwrap_err()
        .0
        .contains("LOCAL_RANK"));
    }

    #[test]
    fn split_colors() {
        assert_eq!(split_color(5, None, None).unwrap(), 0);
        assert_eq!(split_color(5, Some("AND 1"), None).unwrap(), 1);
        assert_eq!(split_color(6, Some("&0x4"), None).unwrap(), 4);
        assert_eq!(split_color(5, Some("MOD2"), None).unwrap(), 1);
        assert_eq!(split_color(5, Some("%4"), None).unwrap(), 1);
        assert_eq!(split_color(5, Some("DIV 2"), None).unwrap(), 2);
        assert_eq!(split_color(5, Some("/4"), None).unwrap(), 1);
        assert_eq!(split_color(4, Some("OR1"), None).unwrap(), 5);
        assert_eq!(split_color(4, Some("|1"), None).unwrap(), 5);
        assert_eq!(split_color(7, None, Some("0x6")).unwrap(), 6);
        assert_eq!(split_color(7, None, Some("2")).unwrap(), 2);
        assert!(split_color(7, Some("XOR1"), None).is_err());
        assert!(split_color(7, Some("MOD 0"), None).is_err());
        assert!(split_color(7, Some("AND x"), None).is_err());
        assert!(split_color(7, None, Some("zz")).is_err());
    }

    #[test]
    fn uid_files() {
        assert_eq!(uid_file(&env(&[])), None);
        assert_eq!(
            uid_file(&env(&[("NCCL_TESTS_UID_FILE", "/x/y")])),
            Some(PathBuf::from("/x/y"))
        );
        let p = uid_file(&env(&[("SLURM_JOB_ID", "12"), ("SLURM_STEP_ID", "3")])).unwrap();
        assert!(p.to_string_lossy().ends_with("nccl-tests-uid-slurm-12-3"));
        assert_eq!(color_path(Path::new("/a/b"), 0), PathBuf::from("/a/b"));
        assert_eq!(color_path(Path::new("/a/b"), 3), PathBuf::from("/a/b.3"));
    }

    #[test]
    fn publish_and_wait() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("uid");
        assert!(wait_id(&p, Duration::from_millis(30)).is_err());
        let mut id = [0u8; 128];
        id[0] = 7;
        id[127] = 9;
        let p2 = p.clone();
        let h = std::thread::spawn(move || wait_id(&p2, Duration::from_secs(5)));
        std::thread::sleep(Duration::from_millis(20));
        publish_id(&p, &id).unwrap();
        assert_eq!(h.join().unwrap().unwrap(), id);
    }
}
