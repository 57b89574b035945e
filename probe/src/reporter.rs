//! Remote delivery (`CCLD_ANALYZER=host:port[,host:port...]`): batches go to the shard that
//! owns each communicator through the analyzer's client library
//! ([`analyzer_net::client::BlockingClient`]: rendezvous hashing, failover to the next shard in
//! hash order, reconnect with doubling back-off). While no shard is reachable, batches are
//! spooled to `CCLD_SPOOL_DIR` (default `$TMPDIR/ccld-spool`), file
//! `spool-<pid>-<start>.bin` (`<start>`: the process's start time from `/proc`, so a later
//! process that reuses the pid never replays another process's batches; files of processes
//! that are gone are deleted when a spool is opened), at most `CCLD_SPOOL_MAX_MB` MiB (default 64; beyond it batches are
//! dropped and counted); the spool is replayed, oldest first, as soon as a shard answers.
//! Spool format: repeated `[u32 little-endian length][protobuf Batch]`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use analyzer_net::client::{BlockingClient, ClientConfig};
use ccld_wire as wire;
use prost::Message;

use crate::diag::{count_drop, env_u64, EnvGet, Sink};

/// A bounded on-disk queue of batches.
#[derive(Debug)]
pub(crate) struct Spool {
    path: PathBuf,
    max_bytes: u64,
}

/// Start time of process `pid` (clock ticks since boot, field 22 of `/proc/<pid>/stat`);
/// `None` when the process does not exist (or `/proc` is unreadable).
fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_start_time(&stat)
}

/// Field 22 (`starttime`) of a `/proc/<pid>/stat` line; the command name (field 2) may
/// contain spaces and parentheses, so fields are counted after its last `)`.
fn parse_start_time(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // `rest` starts with field 3 (state): starttime is the 20th field from there.
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The (pid, start) a spool file name `spool-<pid>-<start>.bin` names; `start` is `None`
/// for the old `spool-<pid>.bin` names.
fn parse_spool_name(name: &str) -> Option<(u32, Option<u64>)> {
    let stem = name.strip_prefix("spool-")?.strip_suffix(".bin")?;
    match stem.split_once('-') {
        Some((pid, start)) => Some((pid.parse().ok()?, Some(start.parse().ok()?))),
        None => Some((stem.parse().ok()?, None)),
    }
}

/// Deletes spool files in `dir` whose process is gone (or is another process with the same
/// pid): their batches belong to a job that no longer exists.
fn remove_stale_spools(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some((pid, start)) = name.to_str().and_then(parse_spool_name) else {
            continue;
        };
        let live = process_start(pid);
        if live.is_none() || start.is_none() || live != start {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

impl Spool {
    /// A spool file `spool-<pid>-<start>.bin` in `dir` (created), at most `max_bytes`;
    /// stale spool files of processes that are gone are deleted first.
    pub(crate) fn new(dir: &Path, max_bytes: u64) -> Result<Spool, String> {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("CCLD_SPOOL_DIR {}: {e}", dir.display()))?;
        remove_stale_spools(dir);
        let pid = std::process::id();
        let start = process_start(pid).unwrap_or(0);
        Ok(Spool {
            path: dir.join(format!("spool-{pid}-{start}.bin")),
            max_bytes,
        })
    }

    /// Bytes currently spooled.
    pub(crate) fn len(&self) -> u64 {
        std::fs::metadata(&self.path).map_or(0, |m| m.len())
    }

    /// True when nothing is spooled.
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends a batch; `false` (batch dropped) when the spool is full or unwritable.
    pub(crate) fn push(&self, b: &wire::Batch) -> bool {
        let bytes = b.encode_to_vec();
        if self.len() + bytes.len() as u64 + 4 > self.max_bytes {
            return false;
        }
        let Ok(len) = u32::try_from(bytes.len()) else {
            return false;
        };
        let r = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .and_then(|mut f| {
                f.write_all(&len.to_le_bytes())?;
                f.write_all(&bytes)
            });
        r.is_ok()
    }

    /// Replays the spool through `send` (oldest first) until it fails; keeps the rest.
    /// Returns the number of batches replayed. A corrupt tail is discarded.
    pub(crate) fn replay(&self, mut send: impl FnMut(wire::Batch) -> bool) -> usize {
        let Ok(data) = std::fs::read(&self.path) else {
            return 0;
        };
        let mut off = 0;
        let mut n = 0;
        while off + 4 <= data.len() {
            let mut l = [0u8; 4];
            l.copy_from_slice(&data[off..off + 4]);
            let len = u32::from_le_bytes(l) as usize;
            let Some(body) = data.get(off + 4..off + 4 + len) else {
                off = data.len();
                break;
            };
            let Ok(b) = wire::Batch::decode(body) else {
                off = data.len();
                break;
            };
            if !send(b) {
                break;
            }
            off += 4 + len;
            n += 1;
        }
        let rest = &data[off.min(data.len())..];
        let _ = if rest.is_empty() {
            std::fs::remove_file(&self.path)
        } else {
            std::fs::write(&self.path, rest)
        };
        n
    }
}

/// Where and how large the spool is (`CCLD_SPOOL_DIR`, `CCLD_SPOOL_MAX_MB`), resolved
/// without touching the file system.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SpoolSettings {
    /// Directory of the spool files.
    pub dir: PathBuf,
    /// Most bytes spooled.
    pub max_bytes: u64,
}

impl SpoolSettings {
    /// From the environment (strict: a malformed size is an error naming it).
    pub(crate) fn from_env(get: EnvGet<'_>) -> Result<SpoolSettings, String> {
        let dir = get("CCLD_SPOOL_DIR")
            .map_or_else(|| std::env::temp_dir().join("ccld-spool"), PathBuf::from);
        let mb = env_u64(get, &ccl_params::CCLD_SPOOL_MAX_MB)?.unwrap_or(64);
        Ok(SpoolSettings {
            dir,
            max_bytes: mb << 20,
        })
    }

    /// Creates the directory and the spool.
    pub(crate) fn open(&self) -> Result<Spool, String> {
        Spool::new(&self.dir, self.max_bytes)
    }
}

/// Spool settings from the environment, spool opened.
pub(crate) fn spool_from_env(get: EnvGet<'_>) -> Result<Spool, String> {
    SpoolSettings::from_env(get)?.open()
}

/// Sink to an analyzer cluster.
pub(crate) struct RemoteSink {
    client: BlockingClient,
    spool: Spool,
    last_replay: Instant,
}

impl RemoteSink {
    pub(crate) fn new(shards: Vec<String>, spool: Spool) -> Result<RemoteSink, String> {
        let mut cfg = ClientConfig::new(shards);
        cfg.rpc_timeout = Duration::from_secs(2);
        let client = BlockingClient::new(cfg).map_err(|e| format!("CCLD_ANALYZER: {e}"))?;
        Ok(RemoteSink {
            client,
            spool,
            last_replay: Instant::now(),
        })
    }

    fn send(&mut self, b: wire::Batch) -> Result<(), wire::Batch> {
        match self.client.ingest_ref(&b) {
            Ok(_) => Ok(()),
            Err(e) => {
                tracing::debug!(target: "nccl::NET", "CCL-D reporter: {e}");
                Err(b)
            }
        }
    }

    fn replay(&mut self) {
        let spool = Spool {
            path: self.spool.path.clone(),
            max_bytes: self.spool.max_bytes,
        };
        spool.replay(|b| self.send(b).is_ok());
    }
}

impl Sink for RemoteSink {
    fn deliver(&mut self, batch: wire::Batch) {
        if !self.spool.is_empty() {
            self.replay();
        }
        if let Err(b) = self.send(batch) {
            if !self.spool.push(&b) {
                count_drop(b.records.len() as u64);
            }
        }
    }

    fn idle(&mut self) {
        if self.last_replay.elapsed() >= Duration::from_secs(1) && !self.spool.is_empty() {
            self.last_replay = Instant::now();
            self.replay();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spool_names_carry_the_process_start_and_stale_files_go() {
        assert_eq!(
            parse_start_time("42 (a b) c) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 777 9"),
            Some(777)
        );
        assert_eq!(parse_start_time("garbage"), None);
        assert_eq!(parse_spool_name("spool-12-345.bin"), Some((12, Some(345))));
        assert_eq!(parse_spool_name("spool-12.bin"), Some((12, None)));
        assert_eq!(parse_spool_name("spool-x.bin"), None);
        assert_eq!(parse_spool_name("other.bin"), None);
        let me = std::process::id();
        let start = process_start(me).expect("own /proc entry");
        let dir = std::env::temp_dir().join(format!("ccld-spool-stale-{me}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // A file of this process with another start time (a recycled pid), an old-style
        // name, a file of a process that does not exist (pid above pid_max), and ours.
        for n in [
            format!("spool-{me}-{}.bin", start + 1),
            format!("spool-{me}.bin"),
            "spool-4294967294-1.bin".to_string(),
            format!("spool-{me}-{start}.bin"),
            "unrelated.txt".to_string(),
        ] {
            std::fs::write(dir.join(n), b"x").unwrap();
        }
        let sp = Spool::new(&dir, 1 << 20).unwrap();
        let mut left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(
            left,
            vec![
                format!("spool-{me}-{start}.bin"),
                "unrelated.txt".to_string()
            ]
        );
        assert_eq!(sp.len(), 1, "this process's own spool is kept");
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn batch(n: u64) -> wire::Batch {
        wire::Batch {
            records: vec![wire::OpRecord {
                seq: n,
                ..Default::default()
            }],
            heartbeats: vec![],
        }
    }

    #[test]
    fn spool_is_bounded_fifo_and_replays_until_failure() {
        let dir = std::env::temp_dir().join(format!("ccld-spool-test-{}", std::process::id()));
        let s = Spool::new(&dir, 200).unwrap();
        let _ = std::fs::remove_file(&s.path);
        assert!(s.is_empty());
        let mut pushed = 0;
        while s.push(&batch(pushed)) {
            pushed += 1;
        }
        assert!(
            pushed > 2 && s.len() <= 200,
            "bounded: {pushed} batches, {} B",
            s.len()
        );
        // Deliver two, then the "network" fails: the rest stays, in order.
        let mut got = Vec::new();
        let n = s.replay(|b| {
            if got.len() == 2 {
                return false;
            }
            got.push(b.records[0].seq);
            true
        });
        assert_eq!((n, got), (2, vec![0, 1]));
        let mut rest = Vec::new();
        assert_eq!(
            s.replay(|b| {
                rest.push(b.records[0].seq);
                true
            }) as u64,
            pushed - 2
        );
        assert_eq!(rest, (2..pushed).collect::<Vec<_>>());
        assert!(s.is_empty());
        // A corrupt spool is discarded, never a panic.
        std::fs::write(&s.path, [9, 0, 0, 0, 1, 2]).unwrap();
        assert_eq!(s.replay(|_| true), 0);
        assert!(s.is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
