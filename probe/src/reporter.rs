//! Remote delivery (`CCLD_ANALYZER=host:port[,host:port...]`): batches go to the shard that
//! owns each communicator through the analyzer's client library
//! ([`analyzer::client::BlockingClient`]: rendezvous hashing, failover to the next shard in
//! hash order, reconnect with doubling back-off). While no shard is reachable, batches are
//! spooled to `CCLD_SPOOL_DIR` (default `$TMPDIR/ccld-spool`), file
//! `spool-<pid>.bin`, at most `CCLD_SPOOL_MAX_MB` MiB (default 64; beyond it batches are
//! dropped and counted); the spool is replayed, oldest first, as soon as a shard answers.
//! Spool format: repeated `[u32 little-endian length][protobuf Batch]`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use analyzer::client::{BlockingClient, ClientConfig};
use analyzer::wire;
use prost::Message;

use crate::diag::{count_drop, env_u64, EnvGet, Sink};

/// A bounded on-disk queue of batches.
#[derive(Debug)]
pub struct Spool {
    path: PathBuf,
    max_bytes: u64,
}

impl Spool {
    /// A spool file `spool-<pid>.bin` in `dir` (created), at most `max_bytes`.
    pub fn new(dir: &Path, max_bytes: u64) -> Result<Spool, String> {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("CCLD_SPOOL_DIR {}: {e}", dir.display()))?;
        Ok(Spool {
            path: dir.join(format!("spool-{}.bin", std::process::id())),
            max_bytes,
        })
    }

    /// Bytes currently spooled.
    pub fn len(&self) -> u64 {
        std::fs::metadata(&self.path).map_or(0, |m| m.len())
    }

    /// True when nothing is spooled.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends a batch; `false` (batch dropped) when the spool is full or unwritable.
    pub fn push(&self, b: &wire::Batch) -> bool {
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
    pub fn replay(&self, mut send: impl FnMut(wire::Batch) -> bool) -> usize {
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
pub struct SpoolSettings {
    /// Directory of `spool-<pid>.bin`.
    pub dir: PathBuf,
    /// Most bytes spooled.
    pub max_bytes: u64,
}

impl SpoolSettings {
    /// From the environment (strict: a malformed size is an error naming it).
    pub fn from_env(get: EnvGet<'_>) -> Result<SpoolSettings, String> {
        let dir = get("CCLD_SPOOL_DIR")
            .map_or_else(|| std::env::temp_dir().join("ccld-spool"), PathBuf::from);
        let mb = env_u64(get, "CCLD_SPOOL_MAX_MB", 1, 1 << 20)?.unwrap_or(64);
        Ok(SpoolSettings {
            dir,
            max_bytes: mb << 20,
        })
    }

    /// Creates the directory and the spool.
    pub fn open(&self) -> Result<Spool, String> {
        Spool::new(&self.dir, self.max_bytes)
    }
}

/// Spool settings from the environment, spool opened.
pub fn spool_from_env(get: EnvGet<'_>) -> Result<Spool, String> {
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
        match self.client.ingest(b.clone()) {
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
