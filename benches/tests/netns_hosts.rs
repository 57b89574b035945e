//! Jobs across "hosts": network namespaces with their own host names and `/dev/shm`
//! (`benches::netns`), joined by a bridge, so that ranks of different hosts can only talk
//! over the socket transport. The ranks are NVIDIA-style processes (nccl-tests binaries
//! under `mpirun`-style launcher variables, the unique id through a rendezvous file, each
//! host's bootstrap address from `CCLD_BOOTSTRAP_IP`), started from outside; ranks of one
//! host share its namespace, hostname and `/dev/shm`, so they use shared memory.
//!
//! Every collective runs with `-c 1`: each rank's result is compared element-wise with the
//! expected values, and a wrong element fails the job (exit 7).
//!
//! Needs root for the namespaces: skips with the reason elsewhere, fails in CI (`CI` set).

use std::io::Read;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use benches::netns::Hosts;
use benches::real_faults::setup::{cargo_build, profile_dir};

/// Waits for `child` at most until `deadline`; kills it past that. (exited, output).
fn finish(mut child: Child, deadline: Instant) -> (Option<std::process::ExitStatus>, String) {
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(_) => break None,
        }
    };
    let mut text = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut text);
    }
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut text);
    }
    (status, text)
}

/// The test's hosts and built binaries.
struct Cluster {
    hosts: Hosts,
    bin: std::path::PathBuf,
    /// Ranks per host.
    per_host: Vec<usize>,
}

impl Cluster {
    /// `None` (after saying why) where namespaces cannot be made outside CI.
    fn new(per_host: &[usize], set: u8) -> Option<Cluster> {
        let hosts = Hosts::for_test(per_host.len(), set)?;
        let bin = profile_dir().expect("profile dir");
        cargo_build(&bin, &["-p", "ccl-ffi", "--lib"]).expect("build libnccl.so.2");
        cargo_build(&bin, &["-p", "nccl-tests-compat", "--bins"]).expect("build nccl-tests");
        Some(Cluster {
            hosts,
            bin,
            per_host: per_host.to_vec(),
        })
    }

    /// Runs `program args` on every rank with `env` set; returns each host's (status,
    /// output).
    fn run(
        &self,
        program: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Vec<(Option<std::process::ExitStatus>, String)> {
        let total: usize = self.per_host.iter().sum();
        let uid = self.bin.join(format!(
            "netns-uid-{}-{}",
            std::process::id(),
            self.hosts.namespace(0)
        ));
        let _ = std::fs::remove_file(&uid);
        let mut first = 0;
        let children: Vec<Child> = self
            .per_host
            .iter()
            .enumerate()
            .map(|(h, &k)| {
                first += k;
                self.hosts
                    .ranks_command(
                        h,
                        first - k..first,
                        total,
                        &self.bin.join(program),
                        args,
                        &uid,
                        &self.bin,
                    )
                    .envs(env.iter().copied())
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("start a host's ranks")
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(120);
        let out = children.into_iter().map(|c| finish(c, deadline)).collect();
        let _ = std::fs::remove_file(&uid);
        out
    }

    /// Every nccl-tests collective, results checked element-wise (`-c 1`), on this layout.
    fn every_collective(&self) {
        self.jobs_checked(&self.every_collective_jobs(), &[]);
    }

    fn every_collective_jobs(&self) -> Vec<(&'static str, Vec<&'static str>)> {
        let sizes = [
            "-b", "8", "-e", "1M", "-f", "32", "-c", "1", "-n", "2", "-w", "1",
        ];
        let mut jobs: Vec<(&str, Vec<&str>)> = [
            "all_reduce_perf",
            "all_gather_perf",
            "reduce_scatter_perf",
            "broadcast_perf",
            "reduce_perf",
            "alltoall_perf",
            "sendrecv_perf",
            "gather_perf",
            "scatter_perf",
            "hypercube_perf",
        ]
        .iter()
        .map(|p| (*p, sizes.to_vec()))
        .collect();
        // Every datatype and reduction once, small sizes.
        jobs.push((
            "all_reduce_perf",
            vec![
                "-b", "4", "-e", "4K", "-f", "32", "-c", "1", "-n", "1", "-w", "0", "-d", "all",
                "-o", "all",
            ],
        ));
        jobs
    }

    /// Runs `jobs` with `env`; each must pass its element-wise check on every host.
    fn jobs_checked(&self, jobs: &[(&str, Vec<&str>)], env: &[(&str, &str)]) {
        let t0 = Instant::now();
        for (program, args) in jobs {
            let results = self.run(program, args, env);
            let mut checked = false;
            for (h, (status, out)) in results.iter().enumerate() {
                let status = status.unwrap_or_else(|| {
                    panic!("{program} {args:?}: host {h} still ran after 120 s:\n{out}")
                });
                assert!(
                    status.success(),
                    "{program} {args:?} on {:?} ranks per host: host {h} failed ({status}):\n{out}",
                    self.per_host
                );
                checked |= out.contains("# Out of bounds values : 0 OK");
            }
            assert!(
                checked,
                "{program}: no host printed the result check:\n{results:?}"
            );
        }
        eprintln!(
            "{} jobs on {:?} ranks per host in {:?}",
            jobs.len(),
            self.per_host,
            t0.elapsed()
        );
    }
}

#[test]
fn two_hosts_of_two_ranks_run_every_collective() {
    if let Some(c) = Cluster::new(&[2, 2], 0) {
        c.every_collective();
    }
}

#[test]
fn four_hosts_of_one_rank_run_every_collective() {
    if let Some(c) = Cluster::new(&[1, 1, 1, 1], 1) {
        c.every_collective();
        // Striped streams (NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD = 4 sockets per
        // stream) between namespaced hosts: 4 MiB payloads go out in 64 KiB+ pieces.
        let big = vec![
            "-b", "1M", "-e", "16M", "-f", "4", "-c", "1", "-n", "2", "-w", "1",
        ];
        c.jobs_checked(
            &[
                ("all_reduce_perf", big.clone()),
                ("sendrecv_perf", big.clone()),
                ("all_gather_perf", big),
            ],
            &[
                ("NCCL_SOCKET_NTHREADS", "2"),
                ("NCCL_NSOCKS_PERTHREAD", "2"),
            ],
        );
    }
}

#[test]
fn three_hosts_with_uneven_ranks_run_every_collective() {
    if let Some(c) = Cluster::new(&[2, 1, 3], 2) {
        c.every_collective();
    }
}
