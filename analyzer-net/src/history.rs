//! A shard's history of diagnoses and incidents: the interface the server writes to and
//! queries, and the in-memory history that every shard without a data directory uses (the
//! embedded hub inside `libnccl.so.2` among them).
//!
//! The persistent history (SQLite, `ccld serve --data-dir`) lives in the `ccld` crate and
//! implements the same trait, so that the collective library never links a database engine.
//! Both keep the same order and filters; `ccld`'s tests compare them on random operations.
//!
//! A history is deliberately ignorant of the diagnosis type: each row holds a few indexed
//! fields (id, communicator, class, detection time) and the diagnosis itself as an opaque
//! encoded blob (the protobuf encoding of the wire `Diagnosis`).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

/// History errors.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    /// Creating the data directory failed.
    #[error("cannot create data directory {path}: {source}")]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// The storage engine failed.
    #[error("diagnosis store ({path}): {source}")]
    Backend {
        /// Where the history lives (a database path, `:memory:`).
        path: String,
        /// Cause.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A previous panic poisoned the history's lock.
    #[error("diagnosis store lock poisoned")]
    Poisoned,
}

/// One stored incident (the first cause across communicators, see `analyzer::incident`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredIncident {
    /// Incident id (`inc-...`).
    pub id: String,
    /// Every communicator it concerns (its own and its evidence's).
    pub comm_ids: Vec<u64>,
    /// Detection time, ns since the Unix epoch.
    pub detected_ns: u64,
    /// Encoded incident.
    pub payload: Vec<u8>,
}

/// One stored diagnosis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredDiagnosis {
    /// Cluster-unique id (see [`StoredDiagnosis::make_id`]).
    pub id: u64,
    /// Communicator id.
    pub comm_id: u64,
    /// Anomaly class name (`H1`, `S2`, ...).
    pub class: String,
    /// Detection time, ns since the Unix epoch.
    pub detected_ns: u64,
    /// Encoded diagnosis.
    pub payload: Vec<u8>,
}

impl StoredDiagnosis {
    /// Builds a cluster-unique id from the shard index (top 16 bits) and a per-shard
    /// sequence number (low 48 bits).
    pub fn make_id(shard: usize, seq: u64) -> u64 {
        ((shard as u64 & 0xffff) << 48) | (seq & SEQ_MASK)
    }

    /// Shard index encoded in an id.
    pub fn shard_of(id: u64) -> usize {
        (id >> 48) as usize
    }
}

/// The per-shard sequence bits of an id.
pub const SEQ_MASK: u64 = 0xffff_ffff_ffff;

/// Filter for [`History::list`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Query {
    /// Only this communicator.
    pub comm_id: Option<u64>,
    /// Only diagnoses detected at or after this time (ns).
    pub since_ns: Option<u64>,
    /// At most this many rows (newest first); `None` = all.
    pub limit: Option<usize>,
}

/// The order of both lists, newest first: detection time, then id, both descending.
///
/// Times and ids compare as signed 64-bit integers, SQLite's only integer type, so that
/// the in-memory history and the SQLite one agree on every value (a time of 2^63 or more
/// sorts as a negative number in both).
pub fn newest_first_key(detected_ns: u64) -> i64 {
    detected_ns as i64
}

/// A shard's history. Inserting an id that exists replaces its row.
pub trait History: std::fmt::Debug + Send + Sync {
    /// The next unused per-shard sequence number for ids of `shard` (one past the largest
    /// stored), so that a restarted shard never reuses an id.
    fn next_seq(&self, shard: usize) -> Result<u64, HistoryError>;
    /// Inserts diagnoses atomically.
    fn insert_all(&self, rows: &[StoredDiagnosis]) -> Result<(), HistoryError>;
    /// Lists diagnoses, newest first.
    fn list(&self, q: &Query) -> Result<Vec<StoredDiagnosis>, HistoryError>;
    /// Inserts incidents atomically.
    fn insert_incidents(&self, rows: &[StoredIncident]) -> Result<(), HistoryError>;
    /// Lists incidents, newest first: those concerning `comm_id` (when given), detected at
    /// or after `since_ns`, at most `limit`.
    fn list_incidents(
        &self,
        comm_id: Option<u64>,
        since_ns: u64,
        limit: usize,
    ) -> Result<Vec<StoredIncident>, HistoryError>;
    /// Number of stored diagnoses per communicator.
    fn count_by_comm(&self) -> Result<HashMap<u64, u32>, HistoryError>;
    /// Number of stored diagnoses.
    fn count(&self) -> Result<u64, HistoryError>;
}

/// The history of a shard without a data directory: lost when the process ends.
#[derive(Debug, Default)]
pub struct MemoryHistory {
    rows: Mutex<Rows>,
}

#[derive(Debug, Default)]
struct Rows {
    diagnoses: BTreeMap<u64, StoredDiagnosis>,
    incidents: BTreeMap<String, StoredIncident>,
}

impl MemoryHistory {
    /// An empty history.
    pub fn new() -> Self {
        Self::default()
    }

    fn rows(&self) -> Result<MutexGuard<'_, Rows>, HistoryError> {
        self.rows.lock().map_err(|_| HistoryError::Poisoned)
    }
}

/// Keeps the newest `limit` of `v` under `key` (descending), in that order.
fn newest<T, K: Ord>(mut v: Vec<T>, key: impl Fn(&T) -> K, limit: Option<usize>) -> Vec<T> {
    v.sort_unstable_by_key(|x| std::cmp::Reverse(key(x)));
    if let Some(l) = limit {
        v.truncate(l);
    }
    v
}

impl History for MemoryHistory {
    fn next_seq(&self, shard: usize) -> Result<u64, HistoryError> {
        let lo = StoredDiagnosis::make_id(shard, 0);
        let hi = StoredDiagnosis::make_id(shard, SEQ_MASK);
        let rows = self.rows()?;
        Ok(match rows.diagnoses.range(lo..=hi).next_back() {
            Some((&id, _)) => (id & SEQ_MASK) + 1,
            None => 0,
        })
    }

    fn insert_all(&self, rows: &[StoredDiagnosis]) -> Result<(), HistoryError> {
        let mut all = self.rows()?;
        for r in rows {
            all.diagnoses.insert(r.id, r.clone());
        }
        Ok(())
    }

    fn list(&self, q: &Query) -> Result<Vec<StoredDiagnosis>, HistoryError> {
        let rows = self.rows()?;
        let since = q.since_ns.map(newest_first_key);
        let hits = rows
            .diagnoses
            .values()
            .filter(|r| q.comm_id.is_none_or(|c| r.comm_id == c))
            .filter(|r| since.is_none_or(|s| newest_first_key(r.detected_ns) >= s))
            .cloned()
            .collect();
        Ok(newest(
            hits,
            |r| (newest_first_key(r.detected_ns), r.id as i64),
            q.limit,
        ))
    }

    fn insert_incidents(&self, rows: &[StoredIncident]) -> Result<(), HistoryError> {
        let mut all = self.rows()?;
        for r in rows {
            all.incidents.insert(r.id.clone(), r.clone());
        }
        Ok(())
    }

    fn list_incidents(
        &self,
        comm_id: Option<u64>,
        since_ns: u64,
        limit: usize,
    ) -> Result<Vec<StoredIncident>, HistoryError> {
        let rows = self.rows()?;
        let since = newest_first_key(since_ns);
        let hits = rows
            .incidents
            .values()
            .filter(|r| newest_first_key(r.detected_ns) >= since)
            .filter(|r| comm_id.is_none_or(|c| r.comm_ids.contains(&c)))
            .cloned()
            .collect();
        Ok(newest(
            hits,
            |r| (newest_first_key(r.detected_ns), r.id.clone()),
            Some(limit),
        ))
    }

    fn count_by_comm(&self) -> Result<HashMap<u64, u32>, HistoryError> {
        let rows = self.rows()?;
        let mut n: HashMap<u64, u32> = HashMap::new();
        for r in rows.diagnoses.values() {
            let c = n.entry(r.comm_id).or_default();
            *c = c.saturating_add(1);
        }
        Ok(n)
    }

    fn count(&self) -> Result<u64, HistoryError> {
        Ok(self.rows()?.diagnoses.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(shard: usize, seq: u64, comm: u64, t: u64) -> StoredDiagnosis {
        StoredDiagnosis {
            id: StoredDiagnosis::make_id(shard, seq),
            comm_id: comm,
            class: if seq.is_multiple_of(2) { "H1" } else { "S2" }.into(),
            detected_ns: t,
            payload: vec![seq as u8, 1, 2, 3],
        }
    }

    #[test]
    fn id_packing_round_trips() {
        let id = StoredDiagnosis::make_id(7, 123_456);
        assert_eq!(StoredDiagnosis::shard_of(id), 7);
        assert_eq!(id & SEQ_MASK, 123_456);
    }

    #[test]
    fn insert_list_filter_newest_first() {
        let s = MemoryHistory::new();
        assert_eq!(s.next_seq(0).unwrap(), 0);
        let rows: Vec<_> = (0..10)
            .map(|i| row(0, i, 100 + (i % 3), 1_000 + i))
            .collect();
        s.insert_all(&rows).unwrap();
        assert_eq!(s.count().unwrap(), 10);
        let all = s.list(&Query::default()).unwrap();
        assert_eq!(all.len(), 10);
        assert_eq!(all[0], rows[9]);
        assert_eq!(all[9], rows[0]);
        let c = s
            .list(&Query {
                comm_id: Some(101),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(c.iter().map(|r| r.id).collect::<Vec<_>>(), vec![7, 4, 1]);
        let since = s
            .list(&Query {
                since_ns: Some(1_007),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(since.len(), 3);
        let lim = s
            .list(&Query {
                limit: Some(2),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(lim, vec![rows[9].clone(), rows[8].clone()]);
        assert_eq!(s.next_seq(0).unwrap(), 10);
        assert_eq!(s.next_seq(1).unwrap(), 0);
        assert_eq!(s.count_by_comm().unwrap()[&101], 3);
        // Same id again: replaced, not duplicated.
        s.insert_all(&[row(0, 3, 555, 1)]).unwrap();
        assert_eq!(s.count().unwrap(), 10);
        assert_eq!(s.count_by_comm().unwrap()[&555], 1);
    }

    #[test]
    fn large_u64_values_survive() {
        let s = MemoryHistory::new();
        let r = StoredDiagnosis {
            id: StoredDiagnosis::make_id(0xffff, 0xffff_ffff_fffe),
            comm_id: u64::MAX,
            class: "H3".into(),
            detected_ns: u64::MAX - 5,
            payload: vec![],
        };
        s.insert_all(std::slice::from_ref(&r)).unwrap();
        assert_eq!(s.list(&Query::default()).unwrap(), vec![r]);
        assert_eq!(s.next_seq(0xffff).unwrap(), SEQ_MASK);
    }

    #[test]
    fn incidents_filter_by_comm_time_and_limit() {
        let inc = |id: &str, comms: &[u64], t: u64| StoredIncident {
            id: id.into(),
            comm_ids: comms.to_vec(),
            detected_ns: t,
            payload: id.as_bytes().to_vec(),
        };
        let s = MemoryHistory::new();
        s.insert_incidents(&[
            inc("inc-a", &[0xd0, 0x70], 10),
            inc("inc-b", &[0xd0], 20),
            inc("inc-d", &[0x700], 40),
        ])
        .unwrap();
        s.insert_incidents(&[inc("inc-b", &[0xd0, 0x71], 20)])
            .unwrap();
        let ids = |v: Vec<StoredIncident>| v.into_iter().map(|i| i.id).collect::<Vec<_>>();
        assert_eq!(
            ids(s.list_incidents(None, 0, 100).unwrap()),
            ["inc-d", "inc-b", "inc-a"]
        );
        assert_eq!(
            ids(s.list_incidents(Some(0x70), 0, 100).unwrap()),
            ["inc-a"]
        );
        assert_eq!(
            ids(s.list_incidents(Some(0x71), 0, 100).unwrap()),
            ["inc-b"]
        );
        assert_eq!(
            ids(s.list_incidents(None, 20, 100).unwrap()),
            ["inc-d", "inc-b"]
        );
        assert_eq!(ids(s.list_incidents(None, 0, 1).unwrap()), ["inc-d"]);
    }
}
