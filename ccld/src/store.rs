//! A shard's persistent history of diagnoses and incidents in an embedded SQLite database
//! (`ccld serve --data-dir`), an [`analyzer_net::history::History`].
//!
//! A restarted shard answers queries for its whole history from here; the engine's
//! per-communicator soft state is not persisted and is rebuilt from new records. It lives
//! in the `ccld` crate, not in `analyzer-net`, so that `libnccl.so.2` (whose embedded hub
//! keeps its history in memory) links no database engine.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

use analyzer_net::history::{History, HistoryError, Query, StoredDiagnosis, StoredIncident};
use rusqlite::{params, Connection, OptionalExtension};

/// File name of the database inside `--data-dir`.
pub const DB_FILE: &str = "ccld-diagnoses.sqlite3";

/// `,<id>,<id>,` (each id as signed decimal): matched with `LIKE '%,<id>,%'`.
fn comms_column(ids: &[u64]) -> String {
    let mut s = String::from(",");
    for &c in ids {
        s.push_str(&i64_of(c).to_string());
        s.push(',');
    }
    s
}

/// The SQLite history of one shard.
pub struct Store {
    conn: Mutex<Connection>,
    path: String,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

fn i64_of(v: u64) -> i64 {
    // SQLite integers are signed 64-bit; store the bit pattern.
    v as i64
}

fn u64_of(v: i64) -> u64 {
    v as u64
}

impl Store {
    /// Opens (creating if needed) the store under `data_dir`, or an in-memory store when
    /// `data_dir` is `None`.
    pub fn open(data_dir: Option<&Path>) -> Result<Self, HistoryError> {
        let (conn, path) = match data_dir {
            Some(dir) => {
                std::fs::create_dir_all(dir).map_err(|source| HistoryError::CreateDir {
                    path: dir.to_path_buf(),
                    source,
                })?;
                let p = dir.join(DB_FILE);
                let ps = p.display().to_string();
                let c = Connection::open(&p).map_err(|source| HistoryError::Backend {
                    path: ps.clone(),
                    source: Box::new(source),
                })?;
                (c, ps)
            }
            None => {
                let c = Connection::open_in_memory().map_err(|source| HistoryError::Backend {
                    path: ":memory:".into(),
                    source: Box::new(source),
                })?;
                (c, ":memory:".to_string())
            }
        };
        let err = |source: rusqlite::Error| HistoryError::Backend {
            path: path.clone(),
            source: Box::new(source),
        };
        // WAL + NORMAL: a committed insert survives a process kill (not necessarily a power
        // loss), and readers do not block the writer.
        conn.pragma_update(None, "journal_mode", "WAL")
            .or_else(|_| conn.pragma_update(None, "journal_mode", "DELETE"))
            .map_err(err)?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(err)?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS diagnoses (
                 id INTEGER PRIMARY KEY,
                 comm_id INTEGER NOT NULL,
                 class TEXT NOT NULL,
                 detected_ns INTEGER NOT NULL,
                 payload BLOB NOT NULL
             );
             CREATE INDEX IF NOT EXISTS diagnoses_comm ON diagnoses(comm_id);
             CREATE INDEX IF NOT EXISTS diagnoses_time ON diagnoses(detected_ns);
             CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
             CREATE TABLE IF NOT EXISTS incidents (
                 id TEXT PRIMARY KEY,
                 comms TEXT NOT NULL,
                 detected_ns INTEGER NOT NULL,
                 payload BLOB NOT NULL
             );
             CREATE INDEX IF NOT EXISTS incidents_time ON incidents(detected_ns);",
        )
        .map_err(err)?;
        Ok(Self {
            conn: Mutex::new(conn),
            path,
        })
    }

    /// Where the database lives (`:memory:` when not persisted).
    pub fn path(&self) -> &str {
        &self.path
    }

    fn err(&self, source: rusqlite::Error) -> HistoryError {
        HistoryError::Backend {
            path: self.path.clone(),
            source: Box::new(source),
        }
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Connection>, HistoryError> {
        self.conn.lock().map_err(|_| HistoryError::Poisoned)
    }

    /// Runs `sql` once per row (bound by `bind`) in one transaction.
    fn insert_rows<R>(
        &self,
        sql: &str,
        rows: &[R],
        bind: impl Fn(&mut rusqlite::CachedStatement<'_>, &R) -> rusqlite::Result<usize>,
    ) -> Result<(), HistoryError> {
        if rows.is_empty() {
            return Ok(());
        }
        let mut conn = self.lock()?;
        let tx = conn.transaction().map_err(|e| self.err(e))?;
        {
            let mut st = tx.prepare_cached(sql).map_err(|e| self.err(e))?;
            for r in rows {
                bind(&mut st, r).map_err(|e| self.err(e))?;
            }
        }
        tx.commit().map_err(|e| self.err(e))
    }
}

impl History for Store {
    /// The next unused per-shard sequence number for ids of `shard` (one past the
    /// largest stored), so that a restarted shard never reuses an id.
    fn next_seq(&self, shard: usize) -> Result<u64, HistoryError> {
        let conn = self.lock()?;
        let lo = i64_of(StoredDiagnosis::make_id(shard, 0));
        let hi = i64_of(StoredDiagnosis::make_id(shard, 0xffff_ffff_ffff));
        let max: Option<i64> = conn
            .query_row(
                "SELECT MAX(id) FROM diagnoses WHERE id BETWEEN ?1 AND ?2",
                params![lo, hi],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| self.err(e))?
            .flatten();
        Ok(match max {
            Some(m) => (u64_of(m) & 0xffff_ffff_ffff) + 1,
            None => 0,
        })
    }

    /// Inserts diagnoses atomically (one transaction). A row whose id already exists is
    /// replaced.
    fn insert_all(&self, rows: &[StoredDiagnosis]) -> Result<(), HistoryError> {
        self.insert_rows(
            "INSERT OR REPLACE INTO diagnoses (id, comm_id, class, detected_ns, payload)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            rows,
            |st, r| {
                st.execute(params![
                    i64_of(r.id),
                    i64_of(r.comm_id),
                    r.class,
                    i64_of(r.detected_ns),
                    r.payload
                ])
            },
        )
    }

    /// Lists diagnoses, newest first.
    fn list(&self, q: &Query) -> Result<Vec<StoredDiagnosis>, HistoryError> {
        let conn = self.lock()?;
        let mut sql = String::from(
            "SELECT id, comm_id, class, detected_ns, payload FROM diagnoses WHERE 1=1",
        );
        let mut args: Vec<i64> = Vec::new();
        if let Some(c) = q.comm_id {
            args.push(i64_of(c));
            sql.push_str(&format!(" AND comm_id = ?{}", args.len()));
        }
        if let Some(s) = q.since_ns {
            args.push(i64_of(s));
            sql.push_str(&format!(" AND detected_ns >= ?{}", args.len()));
        }
        sql.push_str(" ORDER BY detected_ns DESC, id DESC");
        if let Some(l) = q.limit {
            args.push(i64::try_from(l).unwrap_or(i64::MAX));
            sql.push_str(&format!(" LIMIT ?{}", args.len()));
        }
        let mut st = conn.prepare(&sql).map_err(|e| self.err(e))?;
        let rows = st
            .query_map(rusqlite::params_from_iter(args.iter()), |r| {
                Ok(StoredDiagnosis {
                    id: u64_of(r.get(0)?),
                    comm_id: u64_of(r.get(1)?),
                    class: r.get(2)?,
                    detected_ns: u64_of(r.get(3)?),
                    payload: r.get(4)?,
                })
            })
            .map_err(|e| self.err(e))?;
        rows.collect::<Result<Vec<_>, _>>().map_err(|e| self.err(e))
    }

    /// Inserts incidents atomically (one transaction); an incident whose id exists is
    /// replaced.
    fn insert_incidents(&self, rows: &[StoredIncident]) -> Result<(), HistoryError> {
        self.insert_rows(
            "INSERT OR REPLACE INTO incidents (id, comms, detected_ns, payload)
             VALUES (?1, ?2, ?3, ?4)",
            rows,
            |st, r| {
                st.execute(params![
                    r.id,
                    comms_column(&r.comm_ids),
                    i64_of(r.detected_ns),
                    r.payload
                ])
            },
        )
    }

    /// Lists incidents, newest first: those concerning `comm_id` (when given), detected at
    /// or after `since_ns`, at most `limit`.
    fn list_incidents(
        &self,
        comm_id: Option<u64>,
        since_ns: u64,
        limit: usize,
    ) -> Result<Vec<StoredIncident>, HistoryError> {
        let conn = self.lock()?;
        let mut st = conn
            .prepare_cached(
                "SELECT id, comms, detected_ns, payload FROM incidents
                 WHERE detected_ns >= ?1 AND (?2 IS NULL OR comms LIKE '%,' || ?2 || ',%')
                 ORDER BY detected_ns DESC, id DESC LIMIT ?3",
            )
            .map_err(|e| self.err(e))?;
        let rows = st
            .query_map(
                params![
                    i64_of(since_ns),
                    comm_id.map(i64_of),
                    i64::try_from(limit).unwrap_or(i64::MAX)
                ],
                |r| {
                    let comms: String = r.get(1)?;
                    Ok(StoredIncident {
                        id: r.get(0)?,
                        comm_ids: comms
                            .split(',')
                            .filter_map(|x| x.parse::<i64>().ok())
                            .map(u64_of)
                            .collect(),
                        detected_ns: u64_of(r.get(2)?),
                        payload: r.get(3)?,
                    })
                },
            )
            .map_err(|e| self.err(e))?;
        rows.collect::<Result<Vec<_>, _>>().map_err(|e| self.err(e))
    }

    /// Number of stored diagnoses per communicator.
    fn count_by_comm(&self) -> Result<HashMap<u64, u32>, HistoryError> {
        let conn = self.lock()?;
        let mut st = conn
            .prepare_cached("SELECT comm_id, COUNT(*) FROM diagnoses GROUP BY comm_id")
            .map_err(|e| self.err(e))?;
        let rows = st
            .query_map([], |r| {
                let c: i64 = r.get(0)?;
                let n: i64 = r.get(1)?;
                Ok((u64_of(c), u32::try_from(n).unwrap_or(u32::MAX)))
            })
            .map_err(|e| self.err(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.err(e))
    }

    /// Number of stored diagnoses.
    fn count(&self) -> Result<u64, HistoryError> {
        let conn = self.lock()?;
        let n: i64 = conn
            .query_row("SELECT COUNT(*) FROM diagnoses", [], |r| r.get(0))
            .map_err(|e| self.err(e))?;
        Ok(u64_of(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn incident(id: &str, comms: &[u64], t: u64) -> StoredIncident {
        StoredIncident {
            id: id.into(),
            comm_ids: comms.to_vec(),
            detected_ns: t,
            payload: id.as_bytes().to_vec(),
        }
    }

    #[test]
    fn incidents_survive_a_reopen_and_filter_by_comm_time_and_limit() {
        let dir = tempfile::tempdir().unwrap();
        let big = u64::MAX - 5; // stored as a negative i64: must round-trip and match.
        {
            let s = Store::open(Some(dir.path())).unwrap();
            s.insert_incidents(&[
                incident("inc-a", &[0xd0, 0x70], 10),
                incident("inc-b", &[0xd0], 20),
                incident("inc-c", &[big], 30),
                incident("inc-d", &[0x700], 40),
            ])
            .unwrap();
            // Same id again: replaced, not duplicated.
            s.insert_incidents(&[incident("inc-b", &[0xd0, 0x71], 20)])
                .unwrap();
        }
        let s = Store::open(Some(dir.path())).unwrap();
        let ids = |v: Vec<StoredIncident>| v.into_iter().map(|i| i.id).collect::<Vec<_>>();
        assert_eq!(
            ids(s.list_incidents(None, 0, 100).unwrap()),
            ["inc-d", "inc-c", "inc-b", "inc-a"]
        );
        assert_eq!(
            ids(s.list_incidents(Some(0xd0), 0, 100).unwrap()),
            ["inc-b", "inc-a"]
        );
        // 0x70 is not a prefix match of 0x700 (112 vs 1792) nor of anything else.
        assert_eq!(
            ids(s.list_incidents(Some(0x70), 0, 100).unwrap()),
            ["inc-a"]
        );
        assert_eq!(
            ids(s.list_incidents(Some(0x71), 0, 100).unwrap()),
            ["inc-b"]
        );
        assert_eq!(ids(s.list_incidents(Some(big), 0, 100).unwrap()), ["inc-c"]);
        assert_eq!(
            ids(s.list_incidents(None, 20, 100).unwrap()),
            ["inc-d", "inc-c", "inc-b"]
        );
        assert_eq!(ids(s.list_incidents(None, 0, 1).unwrap()), ["inc-d"]);
        let b = &s.list_incidents(Some(0x71), 0, 1).unwrap()[0];
        assert_eq!(
            (b.comm_ids.clone(), b.payload.clone()),
            (vec![0xd0, 0x71], b"inc-b".to_vec())
        );
    }

    fn row(shard: usize, seq: u64, comm: u64, t: u64) -> StoredDiagnosis {
        StoredDiagnosis {
            id: StoredDiagnosis::make_id(shard, seq),
            comm_id: comm,
            class: if seq.is_multiple_of(2) {
                "H1".into()
            } else {
                "S2".into()
            },
            detected_ns: t,
            payload: vec![seq as u8, 1, 2, 3],
        }
    }

    #[test]
    fn in_memory_insert_list_filter() {
        let s = Store::open(None).unwrap();
        assert_eq!(s.next_seq(0).unwrap(), 0);
        let rows: Vec<_> = (0..10)
            .map(|i| row(0, i, 100 + (i % 3), 1_000 + i))
            .collect();
        s.insert_all(&rows).unwrap();
        assert_eq!(s.count().unwrap(), 10);
        let all = s.list(&Query::default()).unwrap();
        assert_eq!(all.len(), 10);
        assert_eq!(all[0], rows[9]); // newest first
        assert_eq!(all[9], rows[0]);
        let c = s
            .list(&Query {
                comm_id: Some(101),
                ..Default::default()
            })
            .unwrap();
        let want: Vec<u64> = vec![7, 4, 1];
        assert_eq!(c.iter().map(|r| r.id).collect::<Vec<_>>(), want);
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
        assert_eq!(lim.len(), 2);
        assert_eq!(s.next_seq(0).unwrap(), 10);
        assert_eq!(s.next_seq(1).unwrap(), 0);
    }

    #[test]
    fn large_u64_values_survive() {
        let s = Store::open(None).unwrap();
        let r = StoredDiagnosis {
            id: StoredDiagnosis::make_id(0xffff, 0xffff_ffff_fffe),
            comm_id: u64::MAX,
            class: "H3".into(),
            detected_ns: u64::MAX - 5,
            payload: vec![],
        };
        s.insert_all(std::slice::from_ref(&r)).unwrap();
        assert_eq!(s.list(&Query::default()).unwrap(), vec![r]);
        assert_eq!(s.next_seq(0xffff).unwrap(), 0xffff_ffff_ffff);
    }

    #[test]
    fn persists_across_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = Store::open(Some(dir.path())).unwrap();
            s.insert_all(&[row(2, 0, 5, 10), row(2, 1, 6, 20)]).unwrap();
        }
        let s = Store::open(Some(dir.path())).unwrap();
        assert_eq!(s.count().unwrap(), 2);
        assert_eq!(s.next_seq(2).unwrap(), 2);
        let l = s.list(&Query::default()).unwrap();
        assert_eq!(l[0], row(2, 1, 6, 20));
    }

    #[test]
    fn bad_data_dir_is_an_error() {
        let f = tempfile::NamedTempFile::new().unwrap();
        // A regular file cannot be a directory.
        let e = Store::open(Some(&f.path().join("sub"))).unwrap_err();
        assert!(matches!(e, HistoryError::CreateDir { .. }), "{e}");
    }

    /// One step of the differential test.
    #[derive(Debug, Clone)]
    enum Step {
        Insert(Vec<StoredDiagnosis>),
        InsertIncidents(Vec<StoredIncident>),
        List(Query),
        ListIncidents(Option<u64>, u64, usize),
        NextSeq(usize),
    }

    fn any_step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        // Few distinct values, so that ids collide (replace), times tie (order by id) and
        // filters hit; the extremes check the signed 64-bit order of both histories.
        let time = prop_oneof![0u64..6, Just(u64::MAX - 1), Just(1u64 << 63)];
        let comm = prop_oneof![0u64..4, Just(u64::MAX)];
        let diag = (0usize..3, 0u64..8, comm.clone(), time.clone(), any::<u8>()).prop_map(
            |(shard, seq, comm_id, detected_ns, b)| StoredDiagnosis {
                id: StoredDiagnosis::make_id(shard, seq),
                comm_id,
                class: ["H1", "S2"][usize::from(b & 1)].into(),
                detected_ns,
                payload: vec![b],
            },
        );
        let inc = (
            0u8..6,
            proptest::collection::vec(comm.clone(), 0..3),
            time.clone(),
            any::<u8>(),
        )
            .prop_map(|(id, comm_ids, detected_ns, b)| StoredIncident {
                id: format!("inc-{id}"),
                comm_ids,
                detected_ns,
                payload: vec![b],
            });
        let opt = |s: BoxedStrategy<u64>| prop_oneof![Just(None), s.prop_map(Some)];
        prop_oneof![
            proptest::collection::vec(diag, 0..4).prop_map(Step::Insert),
            proptest::collection::vec(inc, 0..3).prop_map(Step::InsertIncidents),
            (
                opt(comm.clone().boxed()),
                opt(time.clone().boxed()),
                prop_oneof![Just(None), (0usize..5).prop_map(Some)]
            )
                .prop_map(|(comm_id, since_ns, limit)| Step::List(Query {
                    comm_id,
                    since_ns,
                    limit
                })),
            (opt(comm.boxed()), time, 0usize..5).prop_map(|(c, t, l)| Step::ListIncidents(c, t, l)),
            (0usize..3).prop_map(Step::NextSeq),
        ]
    }

    proptest::proptest! {
        /// The in-memory history of `analyzer-net` (every shard without a data directory,
        /// the embedded hub among them) answers exactly as SQLite does, on random inserts,
        /// replacements and queries.
        #[test]
        fn the_memory_history_answers_as_sqlite_does(
            steps in proptest::collection::vec(any_step(), 1..40)
        ) {
            let sql = Store::open(None).unwrap();
            let mem = analyzer_net::history::MemoryHistory::new();
            for st in steps {
                match st {
                    Step::Insert(r) => {
                        sql.insert_all(&r).unwrap();
                        mem.insert_all(&r).unwrap();
                    }
                    Step::InsertIncidents(r) => {
                        sql.insert_incidents(&r).unwrap();
                        mem.insert_incidents(&r).unwrap();
                    }
                    Step::List(q) => proptest::prop_assert_eq!(sql.list(&q).unwrap(), mem.list(&q).unwrap()),
                    Step::ListIncidents(c, t, l) => proptest::prop_assert_eq!(
                        sql.list_incidents(c, t, l).unwrap(),
                        mem.list_incidents(c, t, l).unwrap()
                    ),
                    Step::NextSeq(s) => proptest::prop_assert_eq!(sql.next_seq(s).unwrap(), mem.next_seq(s).unwrap()),
                }
                proptest::prop_assert_eq!(sql.count().unwrap(), mem.count().unwrap());
                proptest::prop_assert_eq!(sql.count_by_comm().unwrap(), mem.count_by_comm().unwrap());
            }
        }
    }
}
