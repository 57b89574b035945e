//! Ranks as separate PROCESSES (the test binary re-executes itself: the ignored test
//! `proc_rank_entry` is the rank's main, the unique id travels in an environment variable).
//!
//! - A representative subset of the thread matrix (every collective; dtypes Float32,
//!   Bfloat16, Int8, Uint64, Float8e5m2; every reduction incl. both PreMulSum kinds;
//!   in/out-of-place; counts {0, 1, 7, 1023, 65537}; Send/Recv ring; one ~4 MiB AllReduce
//!   per type) for 2, 3 and 4 ranks, probe counters checked.
//! - A rank SIGKILLed while the others loop AllReduce: the survivors get
//!   `Remote("rank N (pid P) exited")` within `CCLD_PEER_CHECK_MS` (200 ms) + 5 ms of
//!   waiting (asserted: < 2 s after the kill, process exit included), and `/dev/shm` holds
//!   no segment of the job afterwards.

mod common;

use std::process::Child;
use std::time::{Duration, Instant};

use ccl_core::bootstrap::get_unique_id;
use ccl_core::{enqueue, CollArgs, Comm, CommConfig, DataType, UniqueId};
use ccl_optype::CollKind;
use common::procs::{spawn_ranks, wait_all, Job};
use common::*;

const ENV_MODE: &str = "CCL_RT_TEST_MODE";
const ENV_UID: &str = "CCL_RT_TEST_UID";
const ENV_UID2: &str = "CCL_RT_TEST_UID2";
const ENV_RANK: &str = "CCL_RT_TEST_RANK";
const ENV_NRANKS: &str = "CCL_RT_TEST_NRANKS";

const DTYPES: [DataType; 5] = [
    DataType::Float32,
    DataType::Bfloat16,
    DataType::Int8,
    DataType::Uint64,
    DataType::Float8e5m2,
];
const COUNTS: [usize; 5] = [0, 1, 7, 1023, 65537];

fn env_usize(name: &str) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing"))
}

fn child_comm() -> std::sync::Arc<Comm> {
    child_comm_of(ENV_UID)
}

fn child_comm_of(uid_var: &str) -> std::sync::Arc<Comm> {
    let uid = unhex(&std::env::var(uid_var).expect("uid")).expect("uid hex");
    let mut id = [0u8; 128];
    id.copy_from_slice(&uid);
    Comm::init_rank(
        env_usize(ENV_NRANKS) as i32,
        UniqueId(id),
        env_usize(ENV_RANK) as i32,
        CommConfig::default(),
    )
    .expect("init_rank")
}

fn matrix_rank() {
    let comm = child_comm();
    let n = comm.nranks() as usize;
    let mut b = Bufs::default();
    let mut dev = [[0u8; 8]; DTYPES.len()];
    let mut cases = Vec::new();
    for (di, dt) in DTYPES.into_iter().enumerate() {
        let reds = reductions(&comm, dt, &mut dev[di]);
        for coll in [
            CollKind::AllReduce,
            CollKind::Reduce,
            CollKind::ReduceScatter,
        ] {
            for &(red, op) in &reds {
                for in_place in [false, true] {
                    for count in COUNTS {
                        let root = (count + 1) % n;
                        cases.push(Case {
                            coll,
                            dt,
                            red,
                            op,
                            count,
                            root,
                            in_place,
                        });
                    }
                }
            }
        }
        for coll in [
            CollKind::Broadcast,
            CollKind::AllGather,
            CollKind::AlltoAll,
            CollKind::Gather,
            CollKind::Scatter,
        ] {
            for in_place in [false, true] {
                for count in COUNTS {
                    let root = (count + 2) % n;
                    cases.push(Case {
                        coll,
                        dt,
                        red: Red::Sum,
                        op: SUM,
                        count,
                        root,
                        in_place,
                    });
                }
            }
        }
        cases.push(Case {
            coll: CollKind::AllReduce,
            dt,
            red: Red::PreMul(4.0),
            op: reds[6].1,
            count: (4 << 20) / dt.size() + 1,
            root: 0,
            in_place: false,
        });
    }
    for c in &cases {
        if let Err(e) = run_case(&comm, c, &mut b) {
            panic!("{e}");
        }
    }
    // Send/Recv ring in one group, receive posted first on even ranks.
    let r = comm.rank() as usize;
    for count in COUNTS {
        let send: Vec<u32> = (0..count).map(|i| (r * 100_000 + i) as u32).collect();
        let mut recv = vec![0u32; count];
        let s = CollArgs {
            kind: CollKind::Send,
            sendbuf: send.as_ptr() as usize,
            recvbuf: 0,
            count,
            dtype: DataType::Uint32 as i32,
            op: 0,
            root: ((r + 1) % n) as i32,
            stream: 0,
        };
        let rv = CollArgs {
            kind: CollKind::Recv,
            sendbuf: 0,
            recvbuf: recv.as_mut_ptr() as usize,
            root: ((r + n - 1) % n) as i32,
            ..s
        };
        let order = if r.is_multiple_of(2) {
            [rv, s]
        } else {
            [s, rv]
        };
        let before = comm.ops_started();
        ccl_core::group_start().unwrap();
        for a in order {
            enqueue(&comm, a).unwrap();
        }
        ccl_core::group_end().expect("sendrecv group");
        let prev = (r + n - 1) % n;
        assert!(recv
            .iter()
            .enumerate()
            .all(|(i, v)| *v == (prev * 100_000 + i) as u32));
        let want = ccl_core::internal::group::expected_counts(&comm, &order).unwrap();
        check_probe(&comm, before, &want).expect("sendrecv probe");
    }
    comm.destroy().expect("destroy");
    println!("@@OK {} cases", cases.len());
}

/// A light case list for many processes on few cores.
fn smoke_rank() {
    // NCCL-style logging, as libnccl.so.2 sets it up (silent unless NCCL_DEBUG is set).
    ccl_core::debug::init();
    let comm = child_comm();
    let n = comm.nranks() as usize;
    let mut b = Bufs::default();
    let mut dev = [0u8; 8];
    let reds = reductions(&comm, DataType::Float32, &mut dev);
    let mut cases = Vec::new();
    for coll in [
        CollKind::AllReduce,
        CollKind::Reduce,
        CollKind::ReduceScatter,
        CollKind::Broadcast,
        CollKind::AllGather,
        CollKind::AlltoAll,
        CollKind::Gather,
        CollKind::Scatter,
    ] {
        for &(red, op) in &reds {
            for count in [1usize, 1023, 300_001] {
                let root = (count + 3) % n;
                cases.push(Case {
                    coll,
                    dt: DataType::Float32,
                    red,
                    op,
                    count,
                    root,
                    in_place: count % 2 == 0,
                });
            }
        }
    }
    for c in &cases {
        if let Err(e) = run_case(&comm, c, &mut b) {
            panic!("{e}");
        }
    }
    comm.destroy().expect("destroy");
    println!("@@OK {} cases", cases.len());
}

/// Prints each FAILED probe record of this process as `@@REC <rank> <cause> <peer rank>
/// <peer pid> <detail>` (the test checks what a survivor's probe reports).
struct PrintFailed;

impl probe::diag::Sink for PrintFailed {
    fn deliver(&mut self, batch: ccld_wire::Batch) {
        for r in batch.records {
            if r.state == ccld_wire::OpState::Failed as i32 {
                let p = r.peer_lost.clone().unwrap_or_default();
                println!(
                    "@@REC {} {:?} {} {} {}",
                    r.rank,
                    r.failure(),
                    p.rank,
                    p.pid,
                    p.detail
                );
            }
        }
    }
}

fn kill_rank() {
    // As in a C program: SIGPIPE kills (Rust binaries ignore it), so a library write to a
    // dead peer's socket that raises it ends this survivor instead of failing its call.
    // SAFETY: restores the default disposition of one signal; no handler is involved.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    // NCCL_DEBUG=WARN and NCCL_DEBUG_FILE come from the test: the survivors' WARN lines.
    ccl_core::debug::init();
    probe::diag::start_with(probe::diag::DiagConfig::default(), || {
        Ok(Box::new(PrintFailed) as Box<dyn probe::diag::Sink>)
    })
    .expect("diagnostic thread");
    let comm = child_comm();
    println!("@@COMM {:016x}", comm.comm_id());
    let send = vec![1f32; 1 << 18];
    let mut recv = vec![0f32; 1 << 18];
    let mut i = 0u64;
    loop {
        let r = enqueue(&comm, all_reduce_f32(&send, &mut recv));
        match r {
            Ok(()) => {
                i += 1;
                if i == 1 {
                    println!("@@RUNNING");
                }
            }
            Err(e) => {
                println!("@@ERR {:?} {e}", e.code());
                // The communicator is broken now: ncclCommGetAsyncError reports it.
                if comm.async_error().is_ok() {
                    std::process::exit(4);
                }
                // Linger so that the other survivor also finds the victim (and not this
                // process) dead first.
                std::thread::sleep(std::time::Duration::from_millis(500));
                let _ = comm.abort();
                let ok = matches!(e, ccl_core::CclError::Remote(ref m) if m.contains("exited"));
                std::process::exit(if ok { 0 } else { 3 });
            }
        }
    }
}

/// Rank 0 runs a 64 MiB AllReduce whose 32 MiB messages go by reference to rank 1 on
/// another "host", which stops itself (SIGSTOP) after a first operation: rank 0's first
/// message stalls in the kernel's buffers, partly written. A thread aborts the
/// communicator; rank 0 reuses its send buffer at once (7.0) and the test resumes rank 1
/// (SIGCONT), which then runs the AllReduce itself. Rank 1 must fail with an error, never
/// sum a 7.0 into its output (8.0), and both processes must end cleanly. (The abort tears
/// the connection down, so this does not tell a revoked message from one the proxy
/// abandoned; the proxy-level test `referenced_payloads_arrive_from_the_buffer_and_a_
/// revoked_one_is_never_sent` checks the revocation itself.)
fn abort_byref_rank() {
    let comm = child_comm();
    let r = comm.rank();
    let small = vec![1f32; 8];
    let mut small_out = vec![0f32; 8];
    enqueue(&comm, all_reduce_f32(&small, &mut small_out)).expect("first AllReduce");
    let n = 16 << 20;
    let mut send = vec![1f32; n];
    let mut recv = vec![0f32; n];
    if r == 1 {
        println!("@@STOPPING");
        // SAFETY: raises a signal at this process; no handler is involved.
        unsafe { libc::raise(libc::SIGSTOP) };
        let res = enqueue(&comm, all_reduce_f32(&send, &mut recv));
        let eights = recv.iter().filter(|&&x| x == 8.0).count();
        println!("@@RANK1 {} {eights}", res.is_err());
        std::process::exit(if eights == 0 { 0 } else { 9 });
    }
    let c = std::sync::Arc::clone(&comm);
    let aborter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500));
        c.abort()
    });
    let res = enqueue(&comm, all_reduce_f32(&send, &mut recv));
    send.fill(7.0);
    println!("@@REUSED");
    aborter.join().expect("aborter").expect("abort");
    // Rank 1 runs meanwhile, and finds this rank gone when it exits.
    std::thread::sleep(Duration::from_millis(1500));
    match res {
        Err(e @ ccl_core::CclError::Aborted(_)) => {
            println!("@@ABORTED {e}");
            std::process::exit(0);
        }
        other => {
            println!("@@UNEXPECTED {other:?}");
            std::process::exit(3);
        }
    }
}

/// Prints each completed probe record that carries time spent in other communicators as
/// `@@GAP <comm id> <rank> <gap ns> <elsewhere ns>`.
struct PrintGaps;

impl probe::diag::Sink for PrintGaps {
    fn deliver(&mut self, batch: ccld_wire::Batch) {
        for r in batch.records {
            if let (Some(gap), Some(elsewhere)) = (r.gap_ns, r.elsewhere_ns) {
                let comm = r.trace.as_ref().map_or(0, |t| t.comm_id);
                println!("@@GAP {comm:016x} {} {gap} {elsewhere}", r.rank);
            }
        }
    }
}

/// Two communicators made by separate `ncclCommInitRank` calls, one rank of each per
/// process (as PyTorch makes its process groups): rank 0 enters every AllReduce of B 30 ms
/// late, so rank 1 waits in B before each AllReduce of A. Its gaps on A must leave that
/// wait out (`@@GAP` lines of A with `elsewhere` >= 20 ms); prints `@@SHARED` and the
/// communicators' ids.
fn groups_rank() {
    probe::diag::start_with(probe::diag::DiagConfig::default(), || {
        Ok(Box::new(PrintGaps) as Box<dyn probe::diag::Sink>)
    })
    .expect("diagnostic thread");
    let a = child_comm_of(ENV_UID);
    let b = child_comm_of(ENV_UID2);
    println!(
        "@@SHARED {} {:016x} {:016x}",
        a.shares_rank_group(&b),
        a.comm_id(),
        b.comm_id()
    );
    let send = vec![1f32; 256];
    let mut recv = vec![0f32; 256];
    let all_reduce = |c: &std::sync::Arc<Comm>, recv: &mut [f32]| {
        enqueue(c, all_reduce_f32(&send, recv)).expect("all_reduce");
    };
    for _ in 0..12 {
        if a.rank() == 0 {
            std::thread::sleep(Duration::from_millis(30));
        }
        all_reduce(&b, &mut recv);
        all_reduce(&a, &mut recv);
    }
    a.destroy().expect("destroy A");
    b.destroy().expect("destroy B");
    println!("@@OK groups");
}

/// AllReduce (float sum) of 8 KiB to 256 KiB per rank (in 8 KiB slots under [`job_on`]); prints
/// the algorithm the op log recorded for each size (`@@ALGO bytes Tree|Ring`) after
/// checking the sums.
fn algo_rank() {
    let comm = child_comm();
    let n = comm.nranks() as f32;
    for kib in [8usize, 16, 32, 64, 128, 256] {
        let count = (kib << 10) / 4;
        let send = vec![1f32 + comm.rank() as f32; count];
        let mut recv = vec![0f32; count];
        let before = comm.ops_started();
        enqueue(&comm, all_reduce_f32(&send, &mut recv)).expect("all_reduce");
        let want = n * (n + 1.0) / 2.0;
        assert!(recv.iter().all(|v| *v == want), "{kib} KiB: sums");
        let snap = settled_op(&comm, before).expect("op log entry");
        println!("@@ALGO {kib} {:?}", snap.info.algo);
    }
    comm.destroy().expect("destroy");
    println!("@@OK algo");
}

/// Rank 1 calls AllGather(256) where its peers call AllReduce(1024), after one consistent
/// AllReduce: every rank's call must fail (exit 0 after printing `@@ERR`), none succeed.
fn mismatch_rank() {
    let comm = child_comm();
    let r = comm.rank();
    let send = vec![1f32; 1024];
    let mut recv = vec![0f32; 1024];
    let rp = recv.as_mut_ptr() as usize;
    let call = |kind, count| CollArgs {
        kind,
        sendbuf: send.as_ptr() as usize,
        recvbuf: rp,
        count,
        dtype: DataType::Float32 as i32,
        op: 0,
        root: -1,
        stream: 0,
    };
    enqueue(&comm, call(CollKind::AllReduce, 1024)).expect("consistent call");
    let second = if r == 1 {
        call(CollKind::AllGather, 1024 / comm.nranks() as usize)
    } else {
        call(CollKind::AllReduce, 1024)
    };
    match enqueue(&comm, second) {
        Ok(()) => {
            println!("@@PASSED");
            std::process::exit(5);
        }
        Err(e) => {
            println!("@@ERR {:?} {e}", e.code());
            let broken = comm.async_error().is_err();
            let _ = comm.abort();
            std::process::exit(if broken { 0 } else { 4 });
        }
    }
}

/// Three ranks, each done at a different time: rank 1 exits at once (without
/// `ncclCommDestroy`, as a crashed-looking but finished process); rank 2 sends 1 MiB to rank 0 after 1 s (five peer checks later), then exits right
/// away (without `ncclCommDestroy` when `CCL_RT_TEST_NO_DESTROY` is set); rank 0 receives
/// it and checks every element. A peer that finished and exited is no failure of a rank
/// waiting on another, and one that exits right after its last send is not lost before
/// what it sent was received.
fn staggered_exit_rank() {
    let comm = child_comm();
    let r = comm.rank();
    let n = 1usize << 18;
    let args = |kind, buf: usize, peer: i32| CollArgs {
        kind,
        sendbuf: buf,
        recvbuf: buf,
        count: n,
        dtype: DataType::Uint32 as i32,
        op: 0,
        root: peer,
        stream: 0,
    };
    match r {
        0 => {
            let mut recv = vec![0u32; n];
            enqueue(&comm, args(CollKind::Recv, recv.as_mut_ptr() as usize, 2))
                .expect("recv from rank 2 while rank 1 is gone");
            let bad = (0..n).find(|&i| recv[i] != (i as u32).wrapping_mul(2_654_435_761));
            assert_eq!(bad, None, "first wrong element");
            comm.destroy().expect("destroy");
        }
        2 => {
            let send: Vec<u32> = (0..n as u32)
                .map(|i| i.wrapping_mul(2_654_435_761))
                .collect();
            std::thread::sleep(Duration::from_secs(1));
            enqueue(&comm, args(CollKind::Send, send.as_ptr() as usize, 0)).expect("send");
            if std::env::var_os("CCL_RT_TEST_NO_DESTROY").is_some() {
                exit_without_destroy();
            }
            comm.destroy().expect("destroy");
        }
        _ => exit_without_destroy(),
    }
    println!("@@OK rank {r}");
}

fn exit_without_destroy() -> ! {
    println!("@@OK exiting without destroy");
    use std::io::Write;
    let _ = std::io::stdout().flush();
    std::process::exit(0);
}

/// Entry point of a rank process (does nothing when run without the environment).
#[test]
#[ignore = "entry point of the rank processes spawned by the other tests"]
fn proc_rank_entry() {
    match std::env::var(ENV_MODE).as_deref() {
        Ok("matrix") => matrix_rank(),
        Ok("kill") => kill_rank(),
        Ok("abort_byref") => abort_byref_rank(),
        Ok("smoke") => smoke_rank(),
        Ok("mismatch") => mismatch_rank(),
        Ok("staggered") => staggered_exit_rank(),
        Ok("groups") => groups_rank(),
        Ok("algo") => algo_rank(),
        _ => {}
    }
}

/// Starts the `n` rank processes of test `mode`, rank `r` on "host" `hosts[r]`
/// (`NCCL_HOSTID`; no variable when `hosts` is empty): ranks with different host ids talk
/// over the socket transport.
fn spawn_job_on(n: usize, mode: &str, extra: &[(&str, &str)], hosts: &[&str]) -> Job {
    let id = get_unique_id().expect("unique id");
    spawn_ranks(
        n,
        |r| {
            let mut v = vec![
                (ENV_MODE.to_string(), mode.to_string()),
                (ENV_UID.to_string(), hex(&id.0)),
                (ENV_RANK.to_string(), r.to_string()),
                (ENV_NRANKS.to_string(), n.to_string()),
            ];
            v.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
            if let Some(h) = hosts.get(r) {
                v.push(("NCCL_HOSTID".to_string(), h.to_string()));
            }
            v
        },
        &[
            "NCCL_HOSTID",
            "NCCL_P2P_DISABLE",
            "NCCL_SHM_DISABLE",
            "CCLD_SOCKET_SEND_BY_REF",
            "CCLD_SPIN_US",
        ],
    )
}

fn matrix(n: usize) {
    job(n, "matrix");
}

fn job(n: usize, mode: &str) {
    job_on(n, mode, &[], &[]);
}

/// Runs the job and checks that every rank exited 0 and printed its OK line; returns the
/// ranks' marker lines.
fn job_on(n: usize, mode: &str, extra: &[(&str, &str)], hosts: &[&str]) -> Vec<(usize, String)> {
    let mut env = vec![("NCCL_BUFFSIZE", "65536")];
    env.extend_from_slice(extra);
    let mut job = spawn_job_on(n, mode, &env, hosts);
    let codes = wait_all(&mut job.children, Duration::from_secs(200));
    let lines: Vec<(usize, String)> = job.lines.try_iter().collect();
    assert!(
        codes.iter().all(|c| *c == Some(0)),
        "exit codes {codes:?}, output {lines:?}"
    );
    assert_eq!(
        lines.iter().filter(|(_, l)| l.starts_with("OK ")).count(),
        n,
        "{lines:?}"
    );
    lines
}

#[test]
fn matrix_2_processes() {
    matrix(2);
}

#[test]
fn matrix_3_processes() {
    matrix(3);
}

#[test]
fn matrix_4_processes() {
    matrix(4);
}

#[test]
fn eight_processes_make_progress() {
    job(8, "smoke");
}

/// The socket transport: two "hosts" (`NCCL_HOSTID`) of two processes each, so every ring
/// has shared-memory and socket links, every Tree and p2p link of a pair across hosts
/// goes over TCP. Every message over a socket goes by reference
/// (`CCLD_SOCKET_SEND_BY_REF=1`; with these 16 KiB slots the default of 32 KiB would copy
/// them all): in place and out of place, every collective's data leaves from the user's
/// buffers.
#[test]
fn matrix_two_hosts_of_two_processes() {
    job_on(
        4,
        "matrix",
        &[("CCLD_SOCKET_SEND_BY_REF", "1")],
        &["a", "a", "b", "b"],
    );
}

/// The spin budget counts the ranks that share this machine's CPUs: "hosts" made with
/// `NCCL_HOSTID` (as network namespaces or containers) on one kernel are one machine, so
/// 2 "hosts" x 2 processes on this machine count 4 ranks, not the 2 of a host. Read from
/// every rank's INIT line (`NCCL_DEBUG=INFO`).
#[test]
fn the_spin_budget_counts_the_ranks_of_this_machine_across_host_ids() {
    let dir = std::env::temp_dir().join(format!("ccld-spin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("log dir");
    let pattern = dir.join("init.%p.log").to_string_lossy().into_owned();
    let env = [
        ("NCCL_DEBUG", "INFO"),
        ("NCCL_DEBUG_SUBSYS", "INIT"),
        ("NCCL_DEBUG_FILE", pattern.as_str()),
    ];
    job_on(4, "smoke", &env, &["a", "a", "b", "b"]);
    let lines: Vec<String> = std::fs::read_dir(&dir)
        .expect("logs")
        .map(|e| std::fs::read_to_string(e.expect("entry").path()).expect("log"))
        .flat_map(|t| t.lines().map(str::to_string).collect::<Vec<_>>())
        .filter(|l| l.contains("host executor: a wait spins"))
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(lines.len(), 4, "one line per rank: {lines:?}");
    assert!(
        lines
            .iter()
            .all(|l| l.contains("(4 of 4 ranks on this machine, with socket proxies)")),
        "{lines:?}"
    );
}

/// Two "hosts" of one process each: AllReduce runs Tree up to 128 KiB per rank over the
/// socket (`hostalgo::tree_limit`), here in messages of one 8 KiB slot (so the 64 KiB
/// cases of one-byte types take 8 exchanges), and the probe counts it as Tree; every
/// other case as on the ring.
#[test]
fn matrix_two_hosts_of_one_process() {
    job_on(2, "matrix", &[], &["a", "b"]);
}

/// The automatic algorithm choice (`hostalgo::tree_limit`, docs/host-backend.md): Tree for
/// AllReduce up to 8 KiB per rank over shared memory; over sockets up to 128 KiB at 2 ranks
/// and 32 KiB at more; Ring above. Read from the op log of every rank.
#[test]
fn automatic_choice_runs_tree_further_over_sockets() {
    let tree_up_to = |n: usize, hosts: &[&str]| -> Vec<usize> {
        let lines = job_on(n, "algo", &[], hosts);
        // Per rank: the largest size that ran Tree, checking that every smaller one did.
        (0..n)
            .map(|r| {
                let algos: Vec<(usize, bool)> = lines
                    .iter()
                    .filter(|(lr, _)| *lr == r)
                    .filter_map(|(_, l)| l.strip_prefix("ALGO "))
                    .map(|l| {
                        let (kib, algo) = l.split_once(' ').expect("ALGO kib algo");
                        (kib.parse().expect("kib"), algo == "Tree")
                    })
                    .collect();
                assert_eq!(algos.len(), 6, "rank {r}: {lines:?}");
                let last = algos
                    .iter()
                    .take_while(|(_, t)| *t)
                    .last()
                    .map_or(0, |a| a.0);
                assert!(
                    algos.iter().all(|(k, t)| *t == (*k <= last)),
                    "rank {r}: {algos:?}"
                );
                last
            })
            .collect()
    };
    assert_eq!(tree_up_to(2, &[]), [8, 8], "shared memory");
    assert_eq!(tree_up_to(2, &["a", "b"]), [128, 128], "2 hosts of 1");
    assert_eq!(
        tree_up_to(4, &["a", "a", "b", "b"]),
        [32; 4],
        "2 hosts of 2"
    );
}

/// Three "hosts" with uneven ranks (2, 1, 1), interleaved so that no ring neighbours share
/// a host but ranks 0 and 2 do; messages by reference as above.
#[test]
fn matrix_three_uneven_hosts() {
    job_on(
        4,
        "matrix",
        &[("CCLD_SOCKET_SEND_BY_REF", "1")],
        &["x", "y", "x", "z"],
    );
}

/// `NCCL_P2P_DISABLE=1` + `NCCL_SHM_DISABLE=1`: ranks of one host talk over sockets too
/// (NVIDIA's fallback to its network transport).
#[test]
fn matrix_sockets_within_one_host() {
    job_on(
        3,
        "matrix",
        &[("NCCL_P2P_DISABLE", "1"), ("NCCL_SHM_DISABLE", "1")],
        &[],
    );
}

/// `NCCL_SOCKET_NTHREADS=2` x `NCCL_NSOCKS_PERTHREAD=2`: every stream between the three
/// "hosts" runs over 4 sockets, and with 4 MiB buffers payloads of 128 KiB and more are
/// striped over them.
#[test]
fn matrix_striped_over_four_sockets_per_stream() {
    job_on(
        3,
        "matrix",
        &[
            ("NCCL_BUFFSIZE", "4194304"),
            ("NCCL_SOCKET_NTHREADS", "2"),
            ("NCCL_NSOCKS_PERTHREAD", "2"),
        ],
        &["a", "b", "c"],
    );
}

#[test]
fn eight_processes_on_four_hosts_make_progress() {
    job_on(8, "smoke", &[], &["a", "b", "c", "d", "a", "b", "c", "d"]);
}

#[test]
fn a_peer_that_finished_and_exited_fails_nothing() {
    job_on(3, "staggered", &[("CCL_RT_TEST_NO_DESTROY", "1")], &[]);
}

/// The same with every rank on its own "host": rank 1's connections close without a goodbye;
/// rank 2 destroys (a socket peer that exits without destroy may take what its proxy had not
/// sent yet with it).
#[test]
fn a_remote_peer_that_finished_and_exited_fails_nothing() {
    job_on(3, "staggered", &[], &["a", "b", "c"]);
}

fn shm_entries(needle: &str) -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.contains(needle))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn sigkill_of_a_rank_fails_the_survivors_within_the_bound_and_leaves_no_shm() {
    sigkill_of_the_last_rank(&[]);
}

/// The victim (rank 2) shares "host" b with rank 1 and is remote to rank 0: rank 1 finds its
/// process gone, rank 0 its connection closed without a goodbye.
#[test]
fn sigkill_of_a_remote_rank_fails_the_survivors_within_the_bound() {
    sigkill_of_the_last_rank(&["a", "b", "b"]);
}

/// The victim (rank 2) is the ring successor of remote rank 1, whose sends go to the dead
/// socket: the survivor (SIGPIPE at its default, as in a C program) fails its call.
#[test]
fn sigkill_of_a_remote_successor_fails_its_sender() {
    sigkill_of_the_last_rank(&["a", "b", "a"]);
}

/// The two cases above with every message over a socket sent by reference
/// (`CCLD_SOCKET_SEND_BY_REF=1`): a survivor's failed operation revokes what it had not
/// written, and every survivor still names the victim, and only it.
#[test]
fn sigkill_with_sends_by_reference_names_the_victim() {
    for hosts in [["a", "b", "b"], ["a", "b", "a"]] {
        sigkill_of_the_last_rank_with(&hosts, &[("CCLD_SOCKET_SEND_BY_REF", "1")]);
    }
}

/// An operation aborted while a message it sent by reference sits partly written (the
/// peer is stopped) returns `Aborted`, the caller may reuse the buffer at once, and the
/// peer gets an error, not the reused bytes (`abort_byref_rank`).
#[test]
fn an_abort_with_a_send_by_reference_half_written_fails_cleanly() {
    let mut job = spawn_job_on(
        2,
        "abort_byref",
        &[("NCCL_BUFFSIZE", "268435456"), ("NCCL_MAX_CTAS", "1")],
        &["a", "b"],
    );
    let mut lines: Vec<(usize, String)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !lines.iter().any(|(r, l)| *r == 0 && l == "REUSED") {
        let left = deadline.saturating_duration_since(Instant::now());
        match job.lines.recv_timeout(left) {
            Ok(l) => lines.push(l),
            Err(_) => break,
        }
    }
    // SAFETY: sends a signal to our own child process.
    unsafe { libc::kill(job.children[1].id() as i32, libc::SIGCONT) };
    let codes = wait_all(&mut job.children, Duration::from_secs(60));
    lines.extend(job.lines.try_iter());
    assert_eq!(codes, vec![Some(0), Some(0)], "exit codes: {lines:?}");
    assert!(
        lines
            .iter()
            .any(|(r, l)| *r == 0 && l.starts_with("ABORTED ")),
        "{lines:?}"
    );
    assert!(
        lines.iter().any(|(r, l)| *r == 1 && l == "RANK1 true 0"),
        "{lines:?}"
    );
}

fn sigkill_of_the_last_rank(hosts: &[&str]) {
    sigkill_of_the_last_rank_with(hosts, &[]);
}

fn sigkill_of_the_last_rank_with(hosts: &[&str], extra: &[(&str, &str)]) {
    let n = 3;
    let victim = n - 1;
    let log_dir =
        std::env::temp_dir().join(format!("ccld-kill-{}-{}", std::process::id(), hosts.len()));
    std::fs::create_dir_all(&log_dir).expect("log dir");
    let pattern = log_dir.join("warn.%p.log").to_string_lossy().into_owned();
    let mut env = vec![
        ("NCCL_DEBUG", "WARN"),
        ("NCCL_DEBUG_FILE", pattern.as_str()),
    ];
    env.extend_from_slice(extra);
    let mut job = spawn_job_on(n, "kill", &env, hosts);
    let remote_to_victim = |r: usize| !hosts.is_empty() && hosts.get(r) != hosts.get(victim);
    let mut hash = None;
    let mut running = false;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !(running && hash.is_some()) {
        let left = deadline.saturating_duration_since(Instant::now());
        match job.lines.recv_timeout(left) {
            Ok((r, l)) => {
                if let Some(h) = l.strip_prefix("COMM ") {
                    hash = Some(h.to_string());
                }
                running |= r == victim && l == "RUNNING";
            }
            Err(_) => {
                for c in &mut job.children {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                panic!("ranks never started");
            }
        }
    }
    let hash = hash.unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let pids: Vec<u32> = job.children.iter().map(|c| c.id()).collect();
    let kill_at = Instant::now();
    job.children[victim].kill().expect("SIGKILL");
    // Deliberately not reaped yet: a dead-but-unreaped (zombie) rank must count as dead.
    let mut errs: Vec<Option<String>> = vec![None; victim];
    let mut recs: Vec<Option<String>> = vec![None; victim];
    while errs.iter().any(|e| e.is_none()) {
        let left = Duration::from_secs(30).saturating_sub(kill_at.elapsed());
        match job.lines.recv_timeout(left) {
            Ok((r, l)) if r < victim && l.starts_with("REC ") => {
                // Flushed before the failing call returned: before its ERR line.
                if errs[r].is_none() {
                    recs[r] = Some(l);
                }
            }
            Ok((r, l)) if r < victim && l.starts_with("ERR ") => errs[r] = Some(l),
            Ok(_) => {}
            Err(_) => break,
        }
    }
    let took = kill_at.elapsed();
    let mut survivors: Vec<Child> = job.children.drain(..victim).collect();
    let codes = wait_all(&mut survivors, Duration::from_secs(30));
    let _ = job.children[0].wait();
    assert!(
        codes.iter().all(|c| *c == Some(0)),
        "survivor exit codes {codes:?}: {errs:?}"
    );
    for (r, err) in errs.iter().enumerate() {
        let err = err.as_deref().unwrap_or_default();
        assert!(
            err.contains("RemoteError") && err.contains(&format!("rank {victim} (pid")),
            "rank {r}: {err:?}"
        );
    }
    assert!(
        took < Duration::from_secs(1),
        "survivors took {took:?} after the kill"
    );
    for (r, rec) in recs.iter().enumerate() {
        let own = if remote_to_victim(r) {
            "connection closed without a goodbye (process exited or link lost)"
        } else {
            "process exited"
        };
        // A rank not waiting on the victim learns of the loss from the rank that found
        // it (poison) and describes it by what it sees itself, if it sees it yet.
        let elsewhere = ccl_core::internal::desc::LOST_ELSEWHERE;
        let rec = rec.as_deref().unwrap_or_default();
        let head = format!("REC {r} PeerLost {victim} {} ", pids[victim]);
        assert!(
            [own, elsewhere].iter().any(|d| rec == format!("{head}{d}")),
            "rank {r}: the probe's FAILED record, delivered before the call returned: {rec:?}"
        );
    }
    // Each survivor logged a WARN line naming the dead peer (rank, pid, host) and the
    // operation before its call returned.
    for (r, pid) in pids.iter().enumerate().take(victim) {
        let log =
            std::fs::read_to_string(log_dir.join(format!("warn.{pid}.log"))).unwrap_or_default();
        assert!(
            log.lines().any(|l| l.contains("NCCL WARN")
                && l.contains("peer lost during AllReduce")
                && l.contains(&format!("rank {victim} (pid {}, host ", pids[victim]))
                && l.contains("exited")),
            "rank {r}: no WARN naming the dead peer in {log:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&log_dir);
    let left = shm_entries(&hash);
    assert!(left.is_empty(), "segments left in /dev/shm: {left:?}");
    let mine: Vec<String> =
        shm_entries(&format!("{}-", ccl_core::internal::channel::SEGMENT_PREFIX))
            .into_iter()
            .filter(|n| pids.iter().any(|p| n.ends_with(&format!("-{p}"))))
            .collect();
    assert!(
        mine.is_empty(),
        "segments of the job's processes left: {mine:?}"
    );
}

#[test]
fn an_inconsistent_call_fails_every_process_rank() {
    inconsistent_call_on(&[]);
}

/// The same across two "hosts" with every ring link remote: the detector's poison reaches
/// the other ranks over the control connections.
#[test]
fn an_inconsistent_call_fails_every_rank_across_hosts() {
    inconsistent_call_on(&["a", "b", "a", "b"]);
}

/// Every rank on its own host: no rank can read a Tree partner's current collective
/// through shared memory, so the rank running the Tree AllReduce asks its partner (which
/// runs a ring AllGather) through the control connection.
#[test]
fn an_inconsistent_call_fails_every_rank_on_four_hosts() {
    inconsistent_call_on(&["a", "b", "c", "d"]);
}

fn inconsistent_call_on(hosts: &[&str]) {
    let n = 4;
    let mut job = spawn_job_on(n, "mismatch", &[], hosts);
    let codes = wait_all(&mut job.children, Duration::from_secs(60));
    let lines: Vec<(usize, String)> = job.lines.try_iter().collect();
    assert!(
        codes.iter().all(|c| *c == Some(0)),
        "exit codes {codes:?} (5: a mismatched call returned success), output {lines:?}"
    );
    let errs: Vec<&(usize, String)> = lines
        .iter()
        .filter(|(_, l)| l.starts_with("ERR "))
        .collect();
    assert_eq!(errs.len(), n, "{lines:?}");
    let detectors: Vec<&&(usize, String)> = errs
        .iter()
        .filter(|(_, l)| l.starts_with("ERR InvalidUsage"))
        .collect();
    assert!(!detectors.is_empty(), "{errs:?}");
    for (r, l) in &detectors {
        assert!(
            l.contains("inconsistent call on comm")
                && l.contains("AllGather seq 1 count 256")
                && l.contains("AllReduce seq 1 count 1024"),
            "rank {r}: {l}"
        );
    }
    for (r, l) in &errs {
        assert!(
            l.starts_with("ERR InvalidUsage") || l.starts_with("ERR RemoteError"),
            "rank {r}: {l}"
        );
    }
}

/// Communicators of separate `ncclCommInitRank` calls, one rank of each per process, are one
/// rank's for the probe (PyTorch's process groups): rank 1's computation gaps on A leave
/// out the ~30 ms it waits in B for rank 0 before each AllReduce of A. Without the tie,
/// A's records carry `elsewhere` = 0 and the whole wait counts as rank 1's computation.
#[test]
fn communicators_of_separate_inits_in_one_process_per_rank_are_one_ranks() {
    let uid2 = hex(&get_unique_id().expect("unique id").0);
    let mut job = spawn_job_on(2, "groups", &[(ENV_UID2, uid2.as_str())], &[]);
    let codes = wait_all(&mut job.children, Duration::from_secs(60));
    let lines: Vec<(usize, String)> = job.lines.try_iter().collect();
    assert!(
        codes.iter().all(|c| *c == Some(0)),
        "exit codes {codes:?}, output {lines:?}"
    );
    let shared: Vec<Vec<&str>> = lines
        .iter()
        .filter_map(|(_, l)| l.strip_prefix("SHARED "))
        .map(|l| l.split(' ').collect())
        .collect();
    assert_eq!(shared.len(), 2, "{lines:?}");
    assert!(shared.iter().all(|s| s[0] == "true"), "{shared:?}");
    let comm_a = shared[0][1];
    // Rank 1's gaps on A: (gap, elsewhere) in ms.
    let gaps: Vec<(f64, f64)> = lines
        .iter()
        .filter_map(|(_, l)| l.strip_prefix("GAP "))
        .map(|l| l.split(' ').collect::<Vec<_>>())
        .filter(|f| f[0] == comm_a && f[1] == "1")
        .map(|f| {
            (
                f[2].parse::<f64>().unwrap() / 1e6,
                f[3].parse::<f64>().unwrap() / 1e6,
            )
        })
        .collect();
    let held = gaps.iter().filter(|(_, e)| *e >= 20.0).count();
    assert!(
        held >= 3,
        "rank 1's gaps on A (gap ms, elsewhere ms): {gaps:?}"
    );
    // The gap left is the rank's own time between the calls, far below the wait.
    assert!(
        gaps.iter().filter(|(g, e)| *e >= 20.0 && *g < 10.0).count() >= 3,
        "{gaps:?}"
    );
}
