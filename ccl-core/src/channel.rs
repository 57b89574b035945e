//! Connection setup over shared memory: per-rank doorbells, the ring links of every channel
//! (created at init) and per-peer p2p links (created lazily, on first use, and cached).
//!
//! Segments (all in `/dev/shm`, names from [`segment_name_for_pid`] with prefix
//! [`SEGMENT_PREFIX`], the communicator hash, `[kind, src, dst]` and the creator's pid):
//! - kind 1, "bell": one per rank, its doorbell; created by the rank, mapped by every peer.
//! - kind 2, "ring": one per directed ring edge `src -> dst = src+1`, created by the
//!   receiver, holding one FIFO per channel (`max_channels` FIFOs).
//! - kind 3, "p2p": one per directed pair, created by the receiver on first use, holding
//!   `p2p_channels` FIFOs (at most [`crate::comm::P2P_MAX_CHANNELS`]: p2p links to many
//!   peers must stay cheap).
//! - kind 4, "tree": one per directed pair of Tree partners ([`crate::tree`]), created at
//!   init by the receiver (unless `NCCL_ALGO` excludes Tree), holding one Simple FIFO and
//!   one LL FIFO ([`LL_LAYOUT`]).
//!
//! Every segment is unlinked by its creator as soon as the peers that need it have mapped it
//! (after a bootstrap barrier or acknowledgement), so a job that dies later (even by
//! SIGKILL) leaves nothing in `/dev/shm`. A segment whose setup fails is unlinked when its
//! creating handle drops.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::bootstrap::Bootstrap;
use crate::error::{CclError, Result};
use crate::transport::shm::{
    align_up, process_alive, segment_name_for_pid, Doorbell, FifoLayout, FifoReceiver, FifoSender,
    LlLayout, LlReceiver, LlSender, SharedWord, ShmRegion, CACHE_LINE,
};
use crate::transport::socket::frame::StreamId;
use crate::transport::socket::proxy::{Inbound, Outbound};
use crate::transport::socket::sendref::SendRefs;
use crate::transport::socket::Remote;

/// Byte offset of the poison word in each rank's doorbell segment (after the doorbell);
/// the descriptor check (`desc.rs`) stores a poison value there.
pub(crate) const POISON_OFFSET: usize = 8;

/// Prefix of every segment name of this library (`/dev/shm/ccld-<comm hash>-...`).
pub const SEGMENT_PREFIX: &str = "ccld";

/// Offset of the current-collective descriptor words in each rank's doorbell segment
/// (their own cache line, so that writing them never disturbs the doorbell's).
pub(crate) const CURRENT_OFFSET: usize = CACHE_LINE;

fn current_words(region: &Arc<ShmRegion>) -> Result<[SharedWord; 4]> {
    Ok([
        SharedWord::new(Arc::clone(region), CURRENT_OFFSET)?,
        SharedWord::new(Arc::clone(region), CURRENT_OFFSET + 8)?,
        SharedWord::new(Arc::clone(region), CURRENT_OFFSET + 16)?,
        SharedWord::new(Arc::clone(region), CURRENT_OFFSET + 24)?,
    ])
}

const KIND_BELL: u64 = 1;
const KIND_RING: u64 = 2;
const KIND_P2P: u64 = 3;
const KIND_TREE: u64 = 4;

/// Bootstrap tags of the lazy p2p handshake (user tags of the communicator's bootstrap).
const TAG_P2P_READY: u32 = 0x7032_7001;
const TAG_P2P_ACK: u32 = 0x7032_7002;
/// Bootstrap tags of the Tree links' handshake at init.
const TAG_TREE_READY: u32 = 0x7472_6501;
const TAG_TREE_ACK: u32 = 0x7472_6502;

/// Hashing of rank keys: the rank itself (looked up for every Tree message; SipHash
/// showed in the small-message profile).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RankHasher(u64);

impl std::hash::Hasher for RankHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) | u64::from(*b);
        }
    }
    fn write_usize(&mut self, v: usize) {
        self.0 = v as u64;
    }
}

/// [`RankHasher`]'s builder.
pub(crate) type RankHash = std::hash::BuildHasherDefault<RankHasher>;

/// One direction-pair of FIFOs (per channel) with one peer.
#[derive(Debug, Default)]
pub(crate) struct PeerLinks {
    /// Per channel: messages from the peer.
    pub rx: Vec<FifoReceiver>,
    /// Per channel: messages to the peer.
    pub tx: Vec<FifoSender>,
    /// LL messages from the peer (Tree links only).
    pub ll_rx: Option<LlReceiver>,
    /// LL messages to the peer (Tree links only).
    pub ll_tx: Option<LlSender>,
    /// Per channel, for a peer on another host: the references of by-reference sends on
    /// `tx` (`transport::socket::sendref`); empty over shared memory.
    pub tx_refs: Vec<Arc<SendRefs>>,
}

/// The LL FIFO of every Tree link, after its Simple FIFO in the link's segment: 4 messages
/// of up to 8 KiB (each takes twice that in LL words), 66 KiB per direction and partner.
pub(crate) const LL_LAYOUT: LlLayout = LlLayout {
    nslots: 4,
    cap: 8 << 10,
};

/// All shared-memory connections of one rank of one communicator.
#[derive(Debug)]
pub(crate) struct Transport {
    pub rank: usize,
    pub comm_hash: u64,
    /// Channels of every p2p link.
    pub p2p_channels: usize,
    pub layout: FifoLayout,
    /// This rank's doorbell (rung by peers when they commit to or release from our FIFOs).
    pub bell: Arc<Doorbell>,
    /// The (unlinked, still mapped) segment holding `bell`.
    bell_region: Arc<ShmRegion>,
    /// Peers' doorbells by rank (`None` for this rank).
    pub peer_bells: Vec<Option<Doorbell>>,
    /// This rank's poison word (next to its doorbell): non-zero once a peer detected an
    /// inconsistent call and failed ([`crate::desc::poison_value`]).
    pub poison: SharedWord,
    /// Peers' poison words by rank (`None` for this rank).
    pub peer_poison: Vec<Option<SharedWord>>,
    /// The descriptor of the collective this rank is running (all zero: none) and the CPU
    /// it started on, on the second line of its doorbell segment: ranks waiting for a Tree
    /// message compare the descriptor with theirs, and waiting ranks do not spin while a
    /// peer shares their CPU ([`CURRENT_OFFSET`]).
    pub current: [SharedWord; 4],
    /// Peers' current-collective words by rank (`None` for this rank). For a peer on
    /// another host they hold what it answered to the last query (`peer_query`).
    pub peer_current: Vec<Option<[SharedWord; 4]>>,
    /// For a peer on another host: the word that has the socket proxy ask it which
    /// collective it runs (set it, then ring the peer's doorbell, which wakes the proxy).
    pub peer_query: Vec<Option<SharedWord>>,
    /// Ring links (empty with one rank).
    pub ring: PeerLinks,
    /// Links of the Tree algorithm by partner (one Simple FIFO and one LL FIFO each way),
    /// made at init.
    pub tree: HashMap<usize, PeerLinks, RankHash>,
    /// Lazily created p2p links by peer.
    pub p2p: HashMap<usize, PeerLinks, RankHash>,
    /// Pids of all ranks (for liveness checks of ranks on this host).
    pub pids: Vec<u32>,
    /// The socket transport, when some peer is on another host (or shared memory is
    /// disabled): its proxy thread serves every link to such a peer.
    remote: Option<Remote>,
}

fn stride(layout: FifoLayout) -> Result<usize> {
    align_up(layout.bytes(), CACHE_LINE)
        .ok_or_else(|| CclError::arg("NCCL_BUFFSIZE too large: FIFO size overflows"))
}

fn seg_bytes(layout: FifoLayout, channels: usize) -> Result<usize> {
    stride(layout)?
        .checked_mul(channels)
        .ok_or_else(|| CclError::arg("NCCL_BUFFSIZE x channels overflows"))
}

fn name(boot: &Bootstrap, kind: u64, src: usize, dst: usize, creator: usize) -> String {
    segment_name_for_pid(
        SEGMENT_PREFIX,
        boot.comm_hash(),
        &[kind, src as u64, dst as u64],
        boot.peer_pid(creator),
    )
}

fn receivers(region: &Arc<ShmRegion>, layout: FifoLayout, n: usize) -> Result<Vec<FifoReceiver>> {
    let s = stride(layout)?;
    (0..n)
        .map(|c| FifoReceiver::new(Arc::clone(region), c * s, layout))
        .collect()
}

fn senders(region: &Arc<ShmRegion>, layout: FifoLayout, n: usize) -> Result<Vec<FifoSender>> {
    let s = stride(layout)?;
    (0..n)
        .map(|c| FifoSender::new(Arc::clone(region), c * s, layout))
        .collect()
}

/// Which pairwise links [`connect_pairs`] makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PairKind {
    /// Send/Recv links: `nch` Simple FIFOs each way.
    P2p,
    /// Tree links: `nch` Simple FIFOs and one LL FIFO ([`LL_LAYOUT`]) each way.
    Tree,
}

/// Creates the inbound segment of every peer in `new` (sorted, distinct, not `me`), maps
/// the peers' ones, and unlinks ours once mapped: the handshake first posts all "ready"
/// messages, then waits, so any order of peers is deadlock-free. Every listed peer must
/// call this for `me` at the same point of its program.
fn connect_pairs(
    boot: &Bootstrap,
    new: &[usize],
    kind: PairKind,
    layout: FifoLayout,
    nch: usize,
    abort: &AtomicBool,
    mut rem: Option<&mut Remote>,
) -> Result<Vec<(usize, PeerLinks)>> {
    let me = boot.rank();
    let (seg_kind, ready, ack) = match kind {
        PairKind::P2p => (KIND_P2P, TAG_P2P_READY, TAG_P2P_ACK),
        PairKind::Tree => (KIND_TREE, TAG_TREE_READY, TAG_TREE_ACK),
    };
    // The Simple FIFOs, then (Tree) the LL FIFO.
    let ll_at = seg_bytes(layout, nch)?;
    let bytes = match kind {
        PairKind::P2p => ll_at,
        PairKind::Tree => ll_at
            .checked_add(LL_LAYOUT.bytes())
            .ok_or_else(|| CclError::arg("NCCL_BUFFSIZE x channels overflows"))?,
    };
    let ll = kind == PairKind::Tree;
    let is_remote =
        |p: usize, rem: &Option<&mut Remote>| rem.as_ref().is_some_and(|r| r.is_remote(p));
    let mut created = Vec::with_capacity(new.len());
    for &p in new {
        // A remote peer's messages arrive in private memory, filled by the proxy.
        let region = Arc::new(if is_remote(p, &rem) {
            ShmRegion::anonymous(bytes)?
        } else {
            ShmRegion::create(&name(boot, seg_kind, p, me, me), bytes)?
        });
        let rx = receivers(&region, layout, nch)?;
        let ll_rx = if ll {
            Some(LlReceiver::new(Arc::clone(&region), ll_at, LL_LAYOUT)?)
        } else {
            None
        };
        boot.send(p, ready, &[])?;
        created.push((p, region, rx, ll_rx));
    }
    let mut txs = Vec::with_capacity(new.len());
    for (p, in_region, _, _) in &created {
        let p = *p;
        recv_patiently(boot, p, ready, abort)?;
        let (region, tx_refs) = match rem.as_deref_mut() {
            Some(r) if r.is_remote(p) => {
                let out = Arc::new(ShmRegion::anonymous(bytes)?);
                let link = PairLink {
                    kind,
                    layout,
                    nch,
                    ll_at,
                };
                let refs = attach_pair(r, p, link, &out, in_region, abort)?;
                (out, refs)
            }
            _ => (
                Arc::new(ShmRegion::open(&name(boot, seg_kind, me, p, p))?),
                Vec::new(),
            ),
        };
        let ll_tx = if ll {
            Some(LlSender::new(Arc::clone(&region), ll_at, LL_LAYOUT)?)
        } else {
            None
        };
        txs.push((senders(&region, layout, nch)?, ll_tx, tx_refs));
        boot.send(p, ack, &[])?;
    }
    let mut out = Vec::with_capacity(new.len());
    for ((p, region, rx, ll_rx), (tx, ll_tx, tx_refs)) in created.into_iter().zip(txs) {
        recv_patiently(boot, p, ack, abort)?;
        if !is_remote(p, &rem) {
            region.unlink()?;
        }
        out.push((
            p,
            PeerLinks {
                rx,
                tx,
                ll_rx,
                ll_tx,
                tx_refs,
            },
        ));
    }
    Ok(out)
}

/// The shape of a pairwise link: its kind, FIFO layout, channels and where its LL FIFO
/// starts (Tree links).
#[derive(Clone, Copy, Debug)]
struct PairLink {
    kind: PairKind,
    layout: FifoLayout,
    nch: usize,
    ll_at: usize,
}

/// Hands the proxy its ends of a pairwise link with remote `peer`: it reads what this rank
/// commits to `out` and fills `inb` with what the peer sends, one stream per channel (and
/// one for the LL FIFO of a Tree link). Returns the channels' by-reference tables.
fn attach_pair(
    rem: &mut Remote,
    peer: usize,
    link: PairLink,
    out: &Arc<ShmRegion>,
    inb: &Arc<ShmRegion>,
    abort: &AtomicBool,
) -> Result<Vec<Arc<SendRefs>>> {
    let outs = receivers(out, link.layout, link.nch)?;
    let ins = senders(inb, link.layout, link.nch)?;
    let mut refs = Vec::with_capacity(link.nch);
    for (c, (o, i)) in outs.into_iter().zip(ins).enumerate() {
        let id = match link.kind {
            PairKind::P2p => StreamId::p2p(c),
            PairKind::Tree => StreamId::tree(c),
        };
        let r = Arc::new(SendRefs::new(link.layout.nslots));
        refs.push(Arc::clone(&r));
        rem.attach(
            peer,
            id,
            Some(Outbound::Fifo(o, r)),
            Some(Inbound::Fifo(i)),
            abort,
        )?;
    }
    if link.kind == PairKind::Tree {
        let o = LlReceiver::new(Arc::clone(out), link.ll_at, LL_LAYOUT)?;
        let i = LlSender::new(Arc::clone(inb), link.ll_at, LL_LAYOUT)?;
        rem.attach(
            peer,
            StreamId::tree_ll(),
            Some(Outbound::Ll(o)),
            Some(Inbound::Ll(i)),
            abort,
        )?;
    }
    Ok(refs)
}

/// Hands the proxy its ends of the ring's remote links: what this rank commits to `next`
/// (when remote) and what `prev` sends (when remote), one stream per channel. With two
/// ranks both are the same peer and share each channel's stream. Returns the by-reference
/// tables of the channels to `next` (none when `next` is on this host).
fn attach_ring(
    rem: &mut Remote,
    (prev, inb): (usize, &Arc<ShmRegion>),
    (next, out): (usize, &Arc<ShmRegion>),
    layout: FifoLayout,
    nch: usize,
) -> Result<Vec<Arc<SendRefs>>> {
    let never = AtomicBool::new(false);
    let mut outs = if rem.is_remote(next) {
        receivers(out, layout, nch)?
    } else {
        Vec::new()
    }
    .into_iter();
    let mut ins = if rem.is_remote(prev) {
        senders(inb, layout, nch)?
    } else {
        Vec::new()
    }
    .into_iter();
    let mut refs = Vec::new();
    for c in 0..nch {
        let o = outs.next().map(|f| {
            let r = Arc::new(SendRefs::new(layout.nslots));
            refs.push(Arc::clone(&r));
            Outbound::Fifo(f, r)
        });
        let i = ins.next().map(Inbound::Fifo);
        let id = StreamId::ring(c);
        match (rem.is_remote(next), rem.is_remote(prev)) {
            (true, true) if next == prev => rem.attach(next, id, o, i, &never)?,
            (to_next, from_prev) => {
                if to_next {
                    rem.attach(next, id, o, None, &never)?;
                }
                if from_prev {
                    rem.attach(prev, id, None, i, &never)?;
                }
            }
        }
    }
    Ok(refs)
}

/// Waits for a handshake message without a deadline: like a send in NCCL, a p2p operation
/// waits for its peer however late the peer is. It ends on abort (the communicator's flag,
/// checked every 100 ms, and the bootstrap's own) and when the peer's bootstrap connection
/// breaks (the peer died).
fn recv_patiently(boot: &Bootstrap, peer: usize, tag: u32, abort: &AtomicBool) -> Result<Vec<u8>> {
    const SLICE: Duration = Duration::from_millis(100);
    let mut waited = Duration::ZERO;
    loop {
        if abort.load(Ordering::Acquire) {
            return Err(CclError::Aborted(format!(
                "ncclCommAbort called while waiting for rank {peer} to connect"
            )));
        }
        match boot.recv_timeout(peer, tag, SLICE) {
            Err(CclError::Timeout(_)) => {
                waited += SLICE;
                if waited.as_millis().is_multiple_of(60_000) {
                    tracing::info!(target: "nccl::P2P", rank = boot.rank(),
                        "still waiting for rank {peer} to post its matching p2p operation ({} s)",
                        waited.as_secs());
                }
            }
            other => return other,
        }
    }
}

impl Transport {
    /// Collective over the communicator: creates this rank's doorbell and inbound ring
    /// segment, maps every peer's doorbell and the next rank's ring segment, then unlinks
    /// its own segments. Peers on another host (all peers with `sockets_in_host`) are
    /// reached through the socket transport instead ([`Remote`]).
    pub(crate) fn connect(
        boot: &Bootstrap,
        max_channels: usize,
        p2p_channels: usize,
        layout: FifoLayout,
        sockets_in_host: bool,
    ) -> Result<Self> {
        let n = boot.nranks();
        let me = boot.rank();
        let prev = (me + n - 1) % n;
        let next = (me + 1) % n;
        let my_host = boot.peer_host_hash(me);
        let remote: Vec<bool> = (0..n)
            .map(|p| p != me && (sockets_in_host || boot.peer_host_hash(p) != my_host))
            .collect();
        let my_bell_region = Arc::new(ShmRegion::create(
            &name(boot, KIND_BELL, me, me, me),
            2 * CACHE_LINE,
        )?);
        let current = current_words(&my_bell_region)?;
        let bell = Arc::new(Doorbell::new(Arc::clone(&my_bell_region), 0)?);
        let poison = SharedWord::new(Arc::clone(&my_bell_region), POISON_OFFSET)?;
        let ring_bytes = seg_bytes(layout, max_channels)?;
        let ring_in = if n > 1 {
            Some(Arc::new(if remote[prev] {
                ShmRegion::anonymous(ring_bytes)?
            } else {
                ShmRegion::create(&name(boot, KIND_RING, prev, me, me), ring_bytes)?
            }))
        } else {
            None
        };
        let mut ring = PeerLinks::default();
        if let Some(r) = &ring_in {
            ring.rx = receivers(r, layout, max_channels)?;
        }
        boot.barrier()?;
        // Every rank agrees on whether any pair is remote (the hosts and the flag are the
        // same everywhere), so every rank joins this collective step or none.
        let mut rem = if remote.iter().any(|r| *r) {
            let my_poison = SharedWord::new(Arc::clone(&my_bell_region), POISON_OFFSET)?;
            Some(Remote::connect(
                boot,
                remote.clone(),
                Arc::clone(&bell),
                my_poison,
                current_words(&my_bell_region)?,
            )?)
        } else {
            None
        };
        let mut peer_bells = Vec::with_capacity(n);
        let mut peer_poison = Vec::with_capacity(n);
        let mut peer_current = Vec::with_capacity(n);
        let mut peer_query = Vec::with_capacity(n);
        for p in 0..n {
            if p == me {
                peer_bells.push(None);
                peer_poison.push(None);
                peer_current.push(None);
                peer_query.push(None);
                continue;
            }
            if let Some(r) = rem.as_ref().filter(|r| r.is_remote(p)) {
                peer_bells.push(Some(r.peer_bell()?));
                peer_poison.push(Some(r.poison_word(p)?));
                peer_current.push(Some(r.peer_current(p)?));
                peer_query.push(Some(r.query_word(p)?));
                continue;
            }
            peer_query.push(None);
            let region = Arc::new(ShmRegion::open(&name(boot, KIND_BELL, p, p, p))?);
            peer_current.push(Some(current_words(&region)?));
            peer_poison.push(Some(SharedWord::new(Arc::clone(&region), POISON_OFFSET)?));
            peer_bells.push(Some(Doorbell::new(region, 0)?));
        }
        let mut ring_out = None;
        if n > 1 {
            let region = Arc::new(if remote[next] {
                ShmRegion::anonymous(ring_bytes)?
            } else {
                ShmRegion::open(&name(boot, KIND_RING, me, next, next))?
            });
            ring.tx = senders(&region, layout, max_channels)?;
            ring_out = Some(region);
        }
        boot.barrier()?;
        my_bell_region.unlink()?;
        if let (Some(r), false) = (&ring_in, remote[prev]) {
            r.unlink()?;
        }
        if let (Some(r), Some(inb), Some(out)) = (rem.as_mut(), &ring_in, &ring_out) {
            ring.tx_refs = attach_ring(r, (prev, inb), (next, out), layout, max_channels)?;
        }
        tracing::info!(target: "nccl::SHM", rank = me,
            "comm {:#018x} ring {prev} -> {me} -> {next}: {max_channels} channel(s) x {} slots of {} bytes, segments unlinked",
            boot.comm_hash(), layout.nslots, layout.slot_bytes);
        let mut t = Transport {
            rank: me,
            comm_hash: boot.comm_hash(),
            p2p_channels,
            layout,
            bell,
            bell_region: my_bell_region,
            peer_bells,
            poison,
            peer_poison,
            current,
            peer_current,
            peer_query,
            ring,
            tree: HashMap::default(),
            p2p: HashMap::default(),
            pids: (0..n).map(|r| boot.peer_pid(r)).collect(),
            remote: rem,
        };
        // The Tree algorithm's links are made here, by every rank at the same point, and
        // not on first use: ranks that disagree on an operation (an inconsistent call) may
        // disagree on its algorithm too, and a lazy handshake with a rank that runs a ring
        // would block before any descriptor check could see the mismatch.
        let sel = crate::hostalgo::Selection::parse(
            crate::env::var(crate::hostalgo::ENV_ALGO)?.as_deref(),
            crate::env::var(crate::proto::ENV_PROTO)?.as_deref(),
        )?;
        if sel.algos.tree && n > 1 {
            let mut peers = crate::tree::peers(me, n);
            peers.sort_unstable();
            peers.dedup();
            let links = connect_pairs(
                boot,
                &peers,
                PairKind::Tree,
                layout,
                1,
                &AtomicBool::new(false),
                t.remote.as_mut(),
            )?;
            t.tree.extend(links);
        }
        Ok(t)
    }

    /// The wire-time counter of ring channel `ch`'s messages from `prev` when `prev` is
    /// reached over sockets (see the socket proxy's `DataStream::wire`), else `None`.
    pub(crate) fn ring_wire(&self, prev: usize, ch: usize) -> Option<Arc<AtomicU64>> {
        self.remote
            .as_ref()?
            .wire_ns(prev, StreamId::ring(ch))
            .cloned()
    }

    /// The wire-time counters of the Tree's messages from `prev` (its Simple and its LL
    /// stream) when `prev` is reached over sockets; none otherwise.
    pub(crate) fn tree_wire(&self, prev: usize) -> Vec<Arc<AtomicU64>> {
        let Some(r) = self.remote.as_ref() else {
            return Vec::new();
        };
        [StreamId::tree(0), StreamId::tree_ll()]
            .into_iter()
            .filter_map(|id| r.wire_ns(prev, id).cloned())
            .collect()
    }

    /// Whether some peer is reached through the socket transport.
    pub(crate) fn uses_sockets(&self) -> bool {
        self.remote.is_some()
    }

    /// A waiting executor runs a round of the socket proxy itself (see
    /// [`crate::transport::socket::proxy::Proxy::drive`]); whether anything moved. False
    /// without sockets.
    pub(crate) fn drive_sockets(&self) -> bool {
        self.remote.as_ref().is_some_and(Remote::drive)
    }

    /// Runs `f` while no round of the socket proxy runs (see
    /// [`crate::transport::socket::proxy::Proxy::while_idle`]); at once without sockets.
    pub(crate) fn while_proxy_idle(&self, f: impl FnOnce()) {
        match &self.remote {
            Some(r) => r.while_proxy_idle(f),
            None => f(),
        }
    }

    /// A job ended: its last socket work is done on this thread, and the proxy's thread
    /// takes over when the lease runs out, unless something is left to write (see
    /// [`crate::transport::socket::proxy::Proxy::settle`]).
    pub(crate) fn settle_sockets(&self) {
        if let Some(r) = &self.remote {
            r.settle();
        }
    }

    /// The executor stops waiting: the socket proxy's thread takes over at once.
    pub(crate) fn release_sockets(&self) {
        if let Some(r) = &self.remote {
            r.release();
        }
    }

    /// Why `peer` can no longer take part (its process exited, or its connection was
    /// lost), `None` while it can. Ranks of this process are never checked.
    pub(crate) fn peer_gone(&self, peer: usize) -> Option<String> {
        if let Some(r) = self.remote.as_ref().filter(|r| r.is_remote(peer)) {
            return r.lost(peer);
        }
        let pid = *self.pids.get(peer)?;
        (pid != std::process::id() && !process_alive(pid)).then(|| "process exited".to_string())
    }

    /// The segment of this rank's doorbell (to make more handles on it).
    pub(crate) fn bell_region(&self) -> &Arc<ShmRegion> {
        &self.bell_region
    }

    /// Makes sure a p2p link exists with every peer in `peers` (both directions). Every
    /// listed peer must call this for this rank at the same point of its program (its
    /// matching send/recv in the same group): the handshake first posts all "ready"
    /// messages, then waits, so any order of peers is deadlock-free.
    pub(crate) fn ensure_p2p(
        &mut self,
        boot: &Bootstrap,
        peers: &[usize],
        abort: &AtomicBool,
    ) -> Result<()> {
        let missing = |p: &usize| *p != self.rank && !self.p2p.contains_key(p);
        // Every operation asks; after the first of a kind the links exist (no allocation).
        if !peers.iter().any(missing) {
            return Ok(());
        }
        let mut new: Vec<usize> = peers.iter().copied().filter(missing).collect();
        new.sort_unstable();
        new.dedup();
        let me = self.rank;
        let links = connect_pairs(
            boot,
            &new,
            PairKind::P2p,
            self.layout,
            self.p2p_channels,
            abort,
            self.remote.as_mut(),
        )?;
        self.p2p.extend(links);
        tracing::debug!(target: "nccl::P2P", rank = me,
            "comm {:#018x}: connected p2p with {new:?}", self.comm_hash);
        Ok(())
    }
}
