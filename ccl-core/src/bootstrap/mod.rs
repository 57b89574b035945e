//! Bootstrap: unique ids, the root listener, and the rank-to-rank control network
//! (allgather, tagged point-to-point messages, barrier) used during init and split.
//!
//! How it works:
//! * [`get_unique_id`] binds a root listener (see [`advertise_ip`] for the address), starts
//!   the root thread and packs the address into the 128-byte id ([`id`] documents the
//!   layout). With `NCCL_COMM_ID=host:port` set, it returns the fixed-magic id of that
//!   address instead and rank 0 starts the root inside [`Bootstrap::init`].
//! * [`Bootstrap::init`] binds this rank's own listener on the local address that reaches
//!   the root, registers `{nranks, rank, listen address, pid, host}` with the root and gets
//!   back every rank's entry. The root serves exactly one communicator, then exits.
//! * Ranks then talk directly: one cached TCP connection per (sender, receiver) pair, frames
//!   tagged with a namespace (the communicator hash), the sender's rank, a kind and a tag.
//!   Split communicators reuse the parent's connections under their own namespace.
//! * Every connection starts with `{u64 magic, u32 type, u32 len}`; the magic is a hash of
//!   the unique id, so junk and connections of other jobs are dropped with a warning.

mod id;
pub mod ifaddr;
mod net;
#[cfg(test)]
mod props;
mod root;
mod wire;

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) use id::random_nonce;
pub use id::{
    build_id, hash64, parse_comm_id, parse_id, IdInfo, IdKind, UniqueId, COMM_ID_MAGIC, ID_MAGIC,
    UNIQUE_ID_BYTES,
};
pub use wire::{PeerInfo, MAX_FRAME_PAYLOAD};

use crate::error::{CclError, Result};
use net::Network;
use wire::{
    prepare, read_full, write_full, Frame, Header, ReadFail, Registration, Reply, ReplyError, Stop,
    HEADER_BYTES, MAX_REPLY_BODY, TYPE_REGISTER, TYPE_REPLY,
};

const T: &str = "nccl::BOOTSTRAP";

/// Env var: default bootstrap timeout in seconds (connect, registration, each recv).
pub const TIMEOUT_ENV: &ccl_params::Param = &ccl_params::CCLD_BOOTSTRAP_TIMEOUT_S;
/// Env var: IP address the root listener of `ncclGetUniqueId` binds and advertises.
pub const ADDR_ENV: &ccl_params::Param = &ccl_params::CCLD_BOOTSTRAP_IP;
/// Default of [`TIMEOUT_ENV`].
pub const DEFAULT_TIMEOUT_S: u64 = 120;
/// Largest communicator size accepted.
pub const MAX_RANKS: usize = 1 << 20;

const SEED_COMM: u64 = 1;
const SEED_CONN: u64 = 2;
const SEED_SPLIT: u64 = 3;
const SEED_HOST: u64 = 4;

const KIND_USER: u32 = 0;
const KIND_ALLGATHER: u32 = 1;
const KIND_BARRIER: u32 = 2;

/// `CCLD_BOOTSTRAP_TIMEOUT_S` (default 120 s); 0 or junk is an error naming the variable.
pub fn default_timeout() -> Result<Duration> {
    // At least 1 (the declaration's bound).
    let s = crate::env::u64_or(TIMEOUT_ENV, DEFAULT_TIMEOUT_S)?;
    Ok(Duration::from_secs(s))
}

/// The address the root of [`get_unique_id`] binds and writes into the id:
/// `CCLD_BOOTSTRAP_IP` when set (an IP literal of this host); else the first interface that
/// `NCCL_SOCKET_IFNAME` / `NCCL_SOCKET_FAMILY` select with NCCL's rules (default order:
/// `ib*`, anything but `docker*`/`lo*`, `docker*`, `lo*`; see [`ifaddr::pick_interface`]);
/// else `127.0.0.1`. Rank listeners bind the local address of their connection to the
/// root, so they are reachable wherever the root is.
pub fn advertise_ip() -> Result<IpAddr> {
    if let Some(v) = crate::env::var(ADDR_ENV)? {
        let ip: IpAddr = v
            .parse()
            .map_err(|_| CclError::arg(format!("{ADDR_ENV}={v:?} is not an IP address")))?;
        if ip.is_unspecified() || ip.is_multicast() {
            return Err(CclError::arg(format!(
                "{ADDR_ENV}={v:?} must be a unicast address of this host"
            )));
        }
        return Ok(ip);
    }
    let ifname = crate::env::var(&ccl_params::NCCL_SOCKET_IFNAME)?;
    let family = crate::env::var(&ccl_params::NCCL_SOCKET_FAMILY)?;
    let ifaces = match ifaddr::list_interfaces() {
        Ok(l) => l,
        Err(e) if ifname.is_none() && family.is_none() => {
            tracing::warn!(target: T, error = %e, "bootstrap: cannot list interfaces, using 127.0.0.1");
            return Ok(IpAddr::V4(Ipv4Addr::LOCALHOST));
        }
        Err(e) => return Err(e),
    };
    match ifaddr::pick_interface(&ifaces, ifname.as_deref(), family.as_deref())? {
        Some(i) => {
            tracing::debug!(target: T, iface = %i.name, addr = %i.addr, "bootstrap: root interface");
            Ok(i.addr)
        }
        None => Ok(IpAddr::V4(Ipv4Addr::LOCALHOST)),
    }
}

/// Connection magic of a job: a hash of its id. Every bootstrap connection of the job
/// starts with it (public for tools and wire-level tests).
pub fn connection_magic(id: &UniqueId) -> u64 {
    hash64(SEED_CONN, &id.0)
}

fn conn_magic(id: &UniqueId) -> u64 {
    connection_magic(id)
}

/// `ncclGetUniqueId`. With `NCCL_COMM_ID` set, returns [`unique_id_from_comm_id`] of it (no
/// root is started here; rank 0 starts it in init). Otherwise binds a listener on
/// [`advertise_ip`], starts the root thread (which exits once one communicator formed, or
/// after [`default_timeout`] without a new registration) and returns its id.
pub fn get_unique_id() -> Result<UniqueId> {
    if let Some(v) = crate::env::var(&ccl_params::NCCL_COMM_ID)? {
        return unique_id_from_comm_id(&v);
    }
    let idle = default_timeout()?;
    let ip = advertise_ip()?;
    let listener = TcpListener::bind((ip, 0))
        .map_err(|e| CclError::sys(&format!("bootstrap: binding the root listener on {ip}"), e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| CclError::sys("bootstrap: root listener address", e))?;
    let id = build_id(IdKind::Root, addr, 0, id::random_nonce());
    root::spawn(listener, conn_magic(&id), idle)?;
    Ok(id)
}

/// `NCCL_COMM_ID` mode: the id every rank builds from the same `host:port` / `[v6]:port`
/// string (fixed magic [`COMM_ID_MAGIC`], no nonce).
pub fn unique_id_from_comm_id(value: &str) -> Result<UniqueId> {
    let addr = parse_comm_id(value)?;
    Ok(build_id(IdKind::CommId, addr, 0, [0; 16]))
}

/// The contents of a small system file (`/proc/sys/...`) without surrounding white space;
/// `None` when it is unreadable or empty.
pub(crate) fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// This host's name, its identity hash (host name + boot id, [`host_hash`]) and its
/// machine hash ([`machine_hash`]).
fn host_identity() -> (String, u64, u64) {
    let name = read_trimmed("/proc/sys/kernel/hostname")
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into());
    let boot = read_trimmed("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    (
        name.clone(),
        host_hash(&name, &boot, host_id_override().as_deref()),
        machine_hash(&boot),
    )
}

/// `NCCL_HOSTID`, read leniently: a text variable, only empty counts as unset.
fn host_id_override() -> Option<String> {
    ccl_params::NCCL_HOSTID.raw().ok().flatten()
}

/// The hash that decides which ranks share a host (and may share memory): of the host name
/// and boot id, or of `NCCL_HOSTID` alone when it is set (NVIDIA's rule).
fn host_hash(name: &str, boot_id: &str, host_id: Option<&str>) -> u64 {
    match host_id {
        Some(id) => hash64(SEED_HOST, format!("NCCL_HOSTID\n{id}").as_bytes()),
        None => hash64(SEED_HOST, format!("{name}\n{boot_id}").as_bytes()),
    }
}

/// The hash that decides which ranks share CPUs: of the boot id alone, so that ranks on
/// one running kernel count as one machine whatever their host names or `NCCL_HOSTID`
/// (containers, the network-namespace "hosts" of the tests). An unreadable boot id makes
/// every rank one machine: the cautious answer for the spin budget that reads it.
fn machine_hash(boot_id: &str) -> u64 {
    hash64(SEED_HOST, format!("machine\n{boot_id}").as_bytes())
}

/// One rank's handle on the bootstrap network of one communicator.
pub struct Bootstrap {
    net: Arc<Network>,
    ns: u64,
    rank: usize,
    /// Communicator rank -> network (top-level) rank.
    members: Vec<usize>,
    table: Arc<Vec<PeerInfo>>,
    abort: Arc<AtomicBool>,
    timeout: Duration,
}

impl std::fmt::Debug for Bootstrap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bootstrap")
            .field("comm_hash", &format_args!("{:#018x}", self.ns))
            .field("rank", &self.rank)
            .field("nranks", &self.members.len())
            .field("listen", &self.net.listen_addr())
            .finish()
    }
}

fn map_reply_error(kind: ReplyError, msg: String) -> CclError {
    match kind {
        ReplyError::Usage => CclError::InvalidUsage(msg),
        ReplyError::Argument => CclError::InvalidArgument(msg),
        ReplyError::Timeout => CclError::Timeout(msg),
    }
}

impl Bootstrap {
    /// Joins the job described by `id` as `rank` of `nranks`. Blocks until every rank has
    /// registered with the root, `timeout` passes (`Remote` if the root was never reached,
    /// `Timeout` if the others did not come) or `abort` is set (`Aborted`).
    pub fn init(
        id: &UniqueId,
        nranks: usize,
        rank: usize,
        abort: Arc<AtomicBool>,
        timeout: Duration,
    ) -> Result<Bootstrap> {
        let info = parse_id(id)?;
        if nranks == 0 || nranks > MAX_RANKS {
            return Err(CclError::arg(format!(
                "nranks {nranks} is not in 1..={MAX_RANKS}"
            )));
        }
        if rank >= nranks {
            return Err(CclError::arg(format!(
                "rank {rank} is out of range for nranks {nranks}"
            )));
        }
        if info.nranks != 0 && info.nranks as usize != nranks {
            return Err(CclError::arg(format!(
                "nranks {nranks} differs from the {} stored in the unique id",
                info.nranks
            )));
        }
        let magic = conn_magic(id);
        let root_addr = info.root;
        let deadline = Instant::now() + timeout;
        if info.kind == IdKind::CommId && rank == 0 {
            let l = TcpListener::bind(root_addr).map_err(|e| {
                CclError::sys(
                    &format!("bootstrap: rank 0 cannot bind NCCL_COMM_ID address {root_addr}"),
                    e,
                )
            })?;
            root::spawn(l, magic, timeout.max(Duration::from_secs(1)))?;
        }
        let stop = Stop {
            abort: Some(&abort),
            deadline: Some(deadline),
            what: "connecting to the root",
        };
        let mut s = net::connect_retry(root_addr, &stop, timeout).map_err(|e| match e {
            CclError::Remote(m) => CclError::Remote(format!("bootstrap root: {m}")),
            other => other,
        })?;
        prepare(&s).map_err(|e| CclError::sys("bootstrap: configuring root connection", e))?;
        // Listen on the local address that reaches the root (keeps an IPv6 scope id).
        let mut local = s
            .local_addr()
            .map_err(|e| CclError::sys("bootstrap: local address of root connection", e))?;
        local.set_port(0);
        let listener = TcpListener::bind(local).map_err(|e| {
            CclError::sys(&format!("bootstrap: binding rank listener on {local}"), e)
        })?;
        let my_addr = listener
            .local_addr()
            .map_err(|e| CclError::sys("bootstrap: rank listener address", e))?;
        let (host, host_hash, machine_hash) = host_identity();
        let reg = Registration {
            nranks: nranks as u32,
            rank: rank as u32,
            info: PeerInfo {
                addr: my_addr,
                pid: std::process::id(),
                host_hash,
                machine_hash,
                host,
            },
        };
        let body = reg.encode();
        let mut msg = Header {
            magic,
            ty: TYPE_REGISTER,
            len: body.len() as u32,
        }
        .encode()
        .to_vec();
        msg.extend_from_slice(&body);
        let what = format!("registering with the root at {root_addr}");
        let stop = Stop {
            what: &what,
            ..stop
        };
        let check = || stop.check();
        let io_err = |e: ReadFail, doing: &str| {
            match e {
            ReadFail::Stop(e) => e,
            ReadFail::Eof { got } => CclError::Remote(format!(
                "bootstrap: the root at {root_addr} closed the connection while {doing} (after {got} bytes)"
            )),
            ReadFail::Io(e) => {
                CclError::Remote(format!("bootstrap: root at {root_addr}: {e} while {doing}"))
            }
        }
        };
        write_full(&mut s, &msg, &check).map_err(|e| io_err(e, "registering"))?;
        tracing::debug!(target: T, rank, nranks, root = %root_addr, listen = %my_addr, "bootstrap: registered, waiting for the other ranks");
        let what =
            format!("waiting for all {nranks} ranks to register with the root at {root_addr}");
        let stop = Stop {
            what: &what,
            ..stop
        };
        let check = || stop.check();
        let mut hb = [0u8; HEADER_BYTES];
        read_full(&mut s, &mut hb, &check).map_err(|e| io_err(e, "waiting for the peer table"))?;
        let h = Header::decode(&hb);
        if h.magic != magic || h.ty != TYPE_REPLY || h.len > MAX_REPLY_BODY {
            return Err(CclError::Remote(format!(
                "bootstrap: malformed reply from the root at {root_addr} (magic {:#018x}, type {}, {} bytes)",
                h.magic, h.ty, h.len
            )));
        }
        let mut body = vec![0u8; h.len as usize];
        read_full(&mut s, &mut body, &check).map_err(|e| io_err(e, "reading the peer table"))?;
        let table = match Reply::decode(&body) {
            Some(Reply::Table(t)) => t,
            Some(Reply::Error(kind, m)) => {
                tracing::warn!(target: T, rank, "bootstrap: root refused the job: {m}");
                return Err(map_reply_error(kind, m));
            }
            None => {
                return Err(CclError::Remote(format!(
                    "bootstrap: undecodable peer table from the root at {root_addr}"
                )))
            }
        };
        if table.len() != nranks || table[rank].addr != my_addr {
            return Err(CclError::Remote(format!(
                "bootstrap: inconsistent peer table from the root at {root_addr} ({} entries)",
                table.len()
            )));
        }
        let addrs = table.iter().map(|p| p.addr).collect();
        let net = Network::start(listener, magic, rank, addrs)?;
        let ns = hash64(SEED_COMM, &id.0);
        tracing::info!(target: T, rank, nranks, comm_hash = format_args!("{ns:#018x}"), "bootstrap: job formed");
        Ok(Bootstrap {
            net: Arc::new(net),
            ns,
            rank,
            members: (0..nranks).collect(),
            table: Arc::new(table),
            abort,
            timeout,
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the communicator.
    pub fn nranks(&self) -> usize {
        self.members.len()
    }

    /// 64-bit communicator id: hash of the unique id, and for split communicators of the
    /// parent's hash, the lineage and the member list. Identical on all ranks.
    pub fn comm_hash(&self) -> u64 {
        self.ns
    }

    /// The timeout every blocking call of this bootstrap uses.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The abort flag shared with the caller (and with split children).
    pub fn abort_flag(&self) -> &Arc<AtomicBool> {
        &self.abort
    }

    /// Where this rank's bootstrap listener accepts connections.
    pub fn listen_addr(&self) -> SocketAddr {
        self.net.listen_addr()
    }

    fn info(&self, rank: usize) -> Option<&PeerInfo> {
        self.members.get(rank).and_then(|&m| self.table.get(m))
    }

    /// Process id of `rank` (0 when out of range).
    pub fn peer_pid(&self, rank: usize) -> u32 {
        self.info(rank).map_or(0, |p| p.pid)
    }

    /// Host name of `rank` ("" when out of range).
    pub fn peer_host(&self, rank: usize) -> &str {
        self.info(rank).map_or("", |p| p.host.as_str())
    }

    /// Host identity hash (host name + boot id) of `rank`: equal means same host. 0 when out
    /// of range.
    pub fn peer_host_hash(&self, rank: usize) -> u64 {
        self.info(rank).map_or(0, |p| p.host_hash)
    }

    /// Machine hash (boot id) of `rank`: equal means the same running kernel, and so the
    /// same CPUs, even across host hashes. 0 when out of range.
    pub fn peer_machine_hash(&self, rank: usize) -> u64 {
        self.info(rank).map_or(0, |p| p.machine_hash)
    }

    /// How many ranks of this communicator run on this rank's machine
    /// ([`Bootstrap::peer_machine_hash`]), itself included: the ranks that share its CPUs.
    pub fn ranks_on_this_machine(&self) -> usize {
        let me = self.peer_machine_hash(self.rank());
        (0..self.nranks())
            .filter(|&r| self.peer_machine_hash(r) == me)
            .count()
    }

    /// Bootstrap listener address of `rank`.
    pub fn peer_addr(&self, rank: usize) -> Option<SocketAddr> {
        self.info(rank).map(|p| p.addr)
    }

    fn stop<'a>(&'a self, what: &'a str, timeout: Duration) -> Stop<'a> {
        Stop {
            abort: Some(&self.abort),
            deadline: Some(Instant::now() + timeout),
            what,
        }
    }

    fn check_peer(&self, peer: usize) -> Result<usize> {
        self.members.get(peer).copied().ok_or_else(|| {
            CclError::arg(format!(
                "bootstrap peer {peer} is out of range for nranks {}",
                self.members.len()
            ))
        })
    }

    fn send_kind(
        &self,
        peer: usize,
        kind: u32,
        tag: u32,
        data: &[u8],
        stop: &Stop<'_>,
    ) -> Result<()> {
        let net_peer = self.check_peer(peer)?;
        if data.len() > MAX_FRAME_PAYLOAD {
            return Err(CclError::arg(format!(
                "bootstrap message of {} bytes exceeds the {MAX_FRAME_PAYLOAD}-byte limit",
                data.len()
            )));
        }
        let frame = Frame {
            ns: self.ns,
            src: self.rank as u32,
            kind,
            tag,
            len: data.len() as u32,
        };
        self.net.send(net_peer, frame, data, stop)
    }

    fn recv_kind(&self, peer: usize, kind: u32, tag: u32, stop: &Stop<'_>) -> Result<Vec<u8>> {
        let net_peer = self.check_peer(peer)?;
        self.net
            .recv((self.ns, kind, peer as u32, tag), net_peer, stop)
    }

    /// Sends `data` to `peer` under `tag`. Messages to one peer with one tag arrive in order.
    pub fn send(&self, peer: usize, tag: u32, data: &[u8]) -> Result<()> {
        let what = format!("sending to rank {peer} (tag {tag})");
        self.send_kind(peer, KIND_USER, tag, data, &self.stop(&what, self.timeout))
    }

    /// Receives the next message `peer` sent under `tag`, waiting up to [`Self::timeout`].
    pub fn recv(&self, peer: usize, tag: u32) -> Result<Vec<u8>> {
        self.recv_timeout(peer, tag, self.timeout)
    }

    /// [`Self::recv`] with an explicit timeout.
    pub fn recv_timeout(&self, peer: usize, tag: u32, timeout: Duration) -> Result<Vec<u8>> {
        let what = format!("waiting for a message from rank {peer} (tag {tag})");
        self.recv_kind(peer, KIND_USER, tag, &self.stop(&what, timeout))
    }

    fn ring_allgather(&self, kind: u32, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let n = self.nranks();
        let r = self.rank;
        let mut out: Vec<Vec<u8>> = vec![Vec::new(); n];
        out[r] = mine.to_vec();
        if n == 1 {
            return Ok(out);
        }
        let next = (r + 1) % n;
        let prev = (r + n - 1) % n;
        let what = format!("in a bootstrap allgather (rank {r} of {n})");
        let stop = self.stop(&what, self.timeout);
        for step in 0..n - 1 {
            let send_idx = (r + n - step) % n;
            let recv_idx = (r + n - step - 1) % n;
            let mut msg = Vec::with_capacity(4 + out[send_idx].len());
            msg.extend_from_slice(&(send_idx as u32).to_le_bytes());
            msg.extend_from_slice(&out[send_idx]);
            self.send_kind(next, kind, 0, &msg, &stop)?;
            let got = self.recv_kind(prev, kind, 0, &stop)?;
            let idx = got
                .get(..4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize);
            if idx != Some(recv_idx) {
                return Err(CclError::Remote(format!(
                    "bootstrap allgather: rank {prev} sent block {idx:?} at step {step}, expected {recv_idx} (mismatched collective calls?)"
                )));
            }
            out[recv_idx] = got[4..].to_vec();
        }
        Ok(out)
    }

    /// Every rank contributes `mine`; `result[i]` is rank i's bytes (sizes may differ).
    pub fn allgather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        if mine.len() > MAX_FRAME_PAYLOAD - 4 {
            return Err(CclError::arg(format!(
                "bootstrap allgather contribution of {} bytes is too large",
                mine.len()
            )));
        }
        self.ring_allgather(KIND_ALLGATHER, mine)
    }

    /// Returns once every rank has entered the barrier.
    pub fn barrier(&self) -> Result<()> {
        self.ring_allgather(KIND_BARRIER, &[]).map(|_| ())
    }

    /// Child bootstrap for `ncclCommSplit`. `members` lists the parent ranks of the new
    /// communicator in new-rank order and must contain this rank; all members pass the
    /// same `members` and `lineage` (e.g. the parent's split counter). Reuses the parent's
    /// connections under a new namespace, so no root and no communication is needed.
    pub fn split(&self, members: &[usize], lineage: u64) -> Result<Bootstrap> {
        let n = self.nranks();
        if members.is_empty() {
            return Err(CclError::arg("split: empty member list"));
        }
        let mut seen = vec![false; n];
        for &m in members {
            if m >= n {
                return Err(CclError::arg(format!(
                    "split: member {m} is out of range for nranks {n}"
                )));
            }
            if std::mem::replace(&mut seen[m], true) {
                return Err(CclError::arg(format!("split: member {m} is listed twice")));
            }
        }
        let rank = members
            .iter()
            .position(|&m| m == self.rank)
            .ok_or_else(|| {
                CclError::arg(format!(
                    "split: this rank ({}) is not among the members",
                    self.rank
                ))
            })?;
        let mut key = Vec::with_capacity(16 + 8 * members.len());
        key.extend_from_slice(&self.ns.to_le_bytes());
        key.extend_from_slice(&lineage.to_le_bytes());
        for &m in members {
            key.extend_from_slice(&(m as u64).to_le_bytes());
        }
        let ns = hash64(SEED_SPLIT, &key);
        tracing::debug!(target: T, rank = self.rank, new_rank = rank, nranks = members.len(), comm_hash = format_args!("{ns:#018x}"), "bootstrap: split");
        Ok(Bootstrap {
            net: Arc::clone(&self.net),
            ns,
            rank,
            members: members.iter().map(|&m| self.members[m]).collect(),
            table: Arc::clone(&self.table),
            abort: Arc::clone(&self.abort),
            timeout: self.timeout,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    fn t() -> Duration {
        Duration::from_secs(20)
    }

    fn form(n: usize) -> Vec<Bootstrap> {
        let id = get_unique_id().unwrap();
        let hs: Vec<_> = (0..n)
            .map(|r| {
                std::thread::spawn(move || {
                    Bootstrap::init(&id, n, r, Arc::new(AtomicBool::new(false)), t()).unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn nccl_hostid_alone_decides_the_host() {
        let a = host_hash("node-a", "boot-1", None);
        assert_ne!(a, host_hash("node-b", "boot-1", None));
        assert_ne!(a, host_hash("node-a", "boot-2", None));
        assert_eq!(
            host_hash("node-a", "boot-1", Some("rack7")),
            host_hash("node-b", "boot-2", Some("rack7"))
        );
        assert_ne!(
            host_hash("node-a", "boot-1", Some("rack7")),
            host_hash("node-a", "boot-1", Some("rack8"))
        );
    }

    #[test]
    fn the_machine_is_the_boot_id_whatever_the_host_name_or_host_id() {
        assert_eq!(machine_hash("boot-1"), machine_hash("boot-1"));
        assert_ne!(machine_hash("boot-1"), machine_hash("boot-2"));
        // Two "hosts" of one kernel (network namespaces with host names of their own, or
        // NCCL_HOSTID): different hosts, one machine.
        assert_ne!(
            host_hash("ns-a", "boot-1", None),
            host_hash("ns-b", "boot-1", None)
        );
        let (_, host, machine) = host_identity();
        assert_ne!(host, machine, "the two hashes are seeded apart");
    }

    #[test]
    fn every_rank_of_one_process_is_on_this_machine() {
        let bs = form(3);
        for b in &bs {
            assert_eq!(b.ranks_on_this_machine(), 3);
            assert_eq!(b.peer_machine_hash(0), b.peer_machine_hash(2));
            assert_ne!(b.peer_machine_hash(1), 0);
        }
        assert_eq!(bs[0].peer_machine_hash(3), 0, "out of range");
    }

    #[test]
    fn single_rank_job() {
        let b = form(1).pop().unwrap();
        assert_eq!((b.rank(), b.nranks()), (0, 1));
        assert_eq!(b.allgather(b"x").unwrap(), vec![b"x".to_vec()]);
        b.barrier().unwrap();
        b.send(0, 5, b"self").unwrap();
        assert_eq!(b.recv(0, 5).unwrap(), b"self");
        assert_eq!(b.peer_pid(0), std::process::id());
        assert_eq!(b.peer_pid(1), 0);
        assert_eq!(b.peer_host(9), "");
    }

    #[test]
    fn argument_checks() {
        let id = get_unique_id().unwrap();
        let a = Arc::new(AtomicBool::new(false));
        for (n, r) in [(0, 0), (2, 2), (MAX_RANKS + 1, 0)] {
            let e = Bootstrap::init(&id, n, r, a.clone(), t()).unwrap_err();
            assert!(matches!(e, CclError::InvalidArgument(_)), "{e}");
        }
        let b = form(2);
        assert!(matches!(
            b[0].send(2, 0, b""),
            Err(CclError::InvalidArgument(_))
        ));
        assert!(matches!(b[0].recv(7, 0), Err(CclError::InvalidArgument(_))));
        assert!(b[0].split(&[], 0).is_err());
        assert!(b[0].split(&[1], 0).is_err());
        assert!(b[0].split(&[0, 0], 0).is_err());
        assert!(b[0].split(&[0, 2], 0).is_err());
    }

    #[test]
    fn recv_times_out_and_aborts() {
        let b = form(2);
        let e = b[0]
            .recv_timeout(1, 3, Duration::from_millis(100))
            .unwrap_err();
        assert!(matches!(e, CclError::Timeout(_)), "{e}");
        b[0].abort_flag().store(true, Ordering::Release);
        assert!(matches!(b[0].recv(1, 3), Err(CclError::Aborted(_))));
    }

    #[test]
    fn bootstrap_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Bootstrap>();
    }

    #[test]
    fn default_timeout_reads_env_default() {
        // The test environment does not set the variable.
        if std::env::var(TIMEOUT_ENV.name).is_err() {
            assert_eq!(
                default_timeout().unwrap(),
                Duration::from_secs(DEFAULT_TIMEOUT_S)
            );
        }
    }
}
