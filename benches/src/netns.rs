//! Network namespaces as "hosts", for tests that need several machines (issue 14): one
//! namespace per host, each joined by a veth pair to a bridge that lives in a namespace of
//! its own (nothing is attached to this machine's network: traffic stays inside), with
//! addresses `10.231.<net>.<host + 1>/24`. A process of host `h` runs under
//! `ip netns exec <ns> unshare --mount --uts` with its own hostname (`ccldhost<h>`) and a
//! private `/dev/shm` (a fresh tmpfs), so that nothing can pass between "hosts" through
//! shared memory and the library sees different hosts. Everything is removed when the
//! [`Hosts`] value drops, also after a failed assertion.
//!
//! Needs root (CI runs as root) and iproute2; [`Hosts::create`] fails with the reason
//! otherwise, and a test skips on it only outside CI.

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;

/// A set of namespaced "hosts" joined by one bridge.
#[derive(Debug)]
pub struct Hosts {
    /// Prefix of this set's namespace and interface names (unique per process and set).
    prefix: String,
    /// Third octet of the set's subnet.
    net: u8,
    /// Namespaces created so far (hosts, then the bridge's), removed on drop.
    namespaces: Vec<String>,
    n: usize,
}

/// Runs `ip ARGS`, failing with its stderr.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run ip (iproute2): {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Hosts {
    /// Creates `n` hosts (at most 250). `set` (0..=9) tells apart the sets one process
    /// creates at the same time.
    pub fn create(n: usize, set: u8) -> Result<Hosts, String> {
        if n == 0 || n > 250 || set > 9 {
            return Err(format!(
                "Hosts::create({n}, {set}): 1..=250 hosts, set 0..=9"
            ));
        }
        let pid = std::process::id();
        // Interface names have at most 15 bytes: "cd" + 5 digits + set + 'v'/'w' + index.
        let prefix = format!("cd{:05}{set}", pid % 100_000);
        let net = ((pid as usize * 10 + set as usize) % 250) as u8;
        let mut h = Hosts {
            prefix,
            net,
            namespaces: Vec::new(),
            n,
        };
        h.build()?;
        Ok(h)
    }

    /// [`Hosts::create`] for a test: `None`, after saying why, where namespaces cannot be
    /// made outside CI; in CI (`CI` set to `true` or `1`), which must not skip, it panics.
    pub fn for_test(n: usize, set: u8) -> Option<Hosts> {
        match Hosts::create(n, set) {
            Ok(h) => Some(h),
            Err(why) if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") => {
                panic!("network namespaces are needed in CI: {why}")
            }
            Err(why) => {
                eprintln!("skipped: cannot create network namespaces here: {why}");
                None
            }
        }
    }

    fn build(&mut self) -> Result<(), String> {
        let br = format!("{}b", self.prefix);
        ip(&["netns", "add", &br])?;
        self.namespaces.push(br.clone());
        ip(&["-n", &br, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &br, "link", "set", "br0", "up"])?;
        for i in 0..self.n {
            let ns = self.namespace(i);
            ip(&["netns", "add", &ns])?;
            self.namespaces.push(ns.clone());
            let (v, w) = (
                format!("{}v{i}", self.prefix),
                format!("{}w{i}", self.prefix),
            );
            // Both ends are created in the bridge's namespace, then one moves to the host:
            // nothing appears in this machine's own namespace.
            ip(&[
                "-n", &br, "link", "add", &w, "type", "veth", "peer", "name", &v,
            ])?;
            ip(&["-n", &br, "link", "set", &v, "netns", &ns])?;
            ip(&["-n", &br, "link", "set", &w, "master", "br0", "up"])?;
            let addr = format!("{}/24", self.addr(i));
            ip(&["-n", &ns, "addr", "add", &addr, "dev", &v])?;
            ip(&["-n", &ns, "link", "set", &v, "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(())
    }

    /// Number of hosts.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Whether the set has no host (never: `create` refuses 0).
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Namespace of host `h`.
    pub fn namespace(&self, h: usize) -> String {
        format!("{}h{h}", self.prefix)
    }

    /// Address of host `h`.
    pub fn addr(&self, h: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, 231, self.net, h as u8 + 1)
    }

    /// Host name the processes of host `h` see.
    pub fn hostname(&self, h: usize) -> String {
        format!("ccldhost{h}")
    }

    /// The host's end of its veth pair (inside its namespace): where a test shapes or cuts
    /// the host's link.
    pub fn link(&self, h: usize) -> String {
        format!("{}v{h}", self.prefix)
    }

    /// Runs `ip ARGS` inside host `h`'s namespace (`ip -n NS ARGS`), failing with its
    /// stderr: e.g. `["qdisc", "add", "dev", &link, "root", "tbf", ...]`.
    pub fn ip(&self, h: usize, args: &[&str]) -> Result<(), String> {
        let ns = self.namespace(h);
        let mut all = vec!["-n", ns.as_str()];
        all.extend_from_slice(args);
        ip(&all)
    }

    /// A command that starts ranks `ranks` (global numbers) of a job of `total` ranks on
    /// host `h`, each running `program args` with the `mpirun`-style variables
    /// `OMPI_COMM_WORLD_SIZE`/`_RANK`/`_LOCAL_RANK`, the host's bootstrap address
    /// (`CCLD_BOOTSTRAP_IP`) and `LD_LIBRARY_PATH=lib_dir`; the unique id goes through the
    /// rendezvous file `uid` (`NCCL_TESTS_UID_FILE`). The launcher prints `@@PID <rank>
    /// <pid>` for each rank it starts and exits with the last failing rank's status.
    #[allow(clippy::too_many_arguments)]
    pub fn ranks_command(
        &self,
        h: usize,
        ranks: std::ops::Range<usize>,
        total: usize,
        program: &Path,
        args: &[&str],
        uid: &Path,
        lib_dir: &Path,
    ) -> Command {
        let mut c = self.command(h, Path::new("/bin/sh"));
        c.args(["-c", HOST_LAUNCHER, "sh"])
            .args(ranks.map(|r| r.to_string()))
            .env("PROG", program)
            .env("ARGS", args.join(" "))
            .env("OMPI_COMM_WORLD_SIZE", total.to_string())
            .env("NCCL_TESTS_UID_FILE", uid)
            .env("CCLD_BOOTSTRAP_IP", self.addr(h).to_string())
            .env("LD_LIBRARY_PATH", lib_dir)
            .env_remove("NCCL_HOSTID")
            .env_remove("NCCL_COMM_ID");
        c
    }

    /// A command that runs `program` on host `h`: in its network namespace, with its own
    /// host name and a private `/dev/shm`. Arguments and environment are the caller's.
    pub fn command(&self, h: usize, program: &Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.namespace(h)])
            .args(["unshare", "--mount", "--uts", "--propagation", "private"])
            .args(["sh", "-c"])
            .arg("hostname \"$1\" && mount -t tmpfs -o mode=1777 tmpfs /dev/shm && shift && exec \"$@\"")
            .arg("sh")
            .arg(self.hostname(h))
            .arg(program);
        c
    }
}

/// Starts the ranks given as arguments on one host (see [`Hosts::ranks_command`]).
const HOST_LAUNCHER: &str = r#"rc=0; pids=""; i=0
for r in "$@"; do
  OMPI_COMM_WORLD_RANK=$r OMPI_COMM_WORLD_LOCAL_RANK=$i "$PROG" $ARGS &
  echo "@@PID $r $!"; pids="$pids $!"; i=$((i+1))
done
for p in $pids; do wait $p || rc=$?; done
exit $rc"#;

impl Drop for Hosts {
    fn drop(&mut self) {
        // Deleting a namespace deletes its interfaces (and so both ends of each veth).
        for ns in self.namespaces.iter().rev() {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}
