//! Every `NCCL_*` and `CCLD_*` environment variable the project reads (and CUDA's
//! `CUDA_DEVICE_MAX_CONNECTIONS`, which device communicators read), declared once, as
//! NCCL's `misc/param.cc` does: name, type and bounds ([`Kind`]), default, one doc line.
//!
//! A leaf crate, so that the runtime (`ccl-core`, `ccl-ffi`) and the probe read through the
//! same declarations. Readers take a [`Param`] (`ccl_params::NCCL_BUFFSIZE`), never a
//! string: a variable that is not declared here cannot be read. A malformed value is a
//! [`ParamError`] that names the variable and what it accepts, never a silent default.
//!
//! Variables with a grammar of their own (`NCCL_PROTO`, `CCLD_INJECT`, ...) are
//! [`Kind::Text`]: this crate hands out the trimmed text and their reader parses it, naming
//! the variable in its errors. The README's table of variables is [`markdown_table`]; a
//! test keeps the two equal, and another that every variable name written in the library's
//! sources is declared here.

#![warn(unreachable_pub)]

use std::fmt;

/// What a variable holds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind {
    /// A non-negative integer in `min..=max`; with `suffixes`, a `K`/`M`/`G` suffix
    /// (1024-based) multiplies it.
    Int {
        /// Smallest accepted value.
        min: u64,
        /// Largest accepted value.
        max: u64,
        /// Whether `K`/`M`/`G` suffixes are accepted.
        suffixes: bool,
    },
    /// A finite number in `min..=max`.
    Real {
        /// Smallest accepted value.
        min: f64,
        /// Largest accepted value.
        max: f64,
    },
    /// `0` or `1`.
    Flag,
    /// Text with its own grammar, parsed by its reader.
    Text,
}

/// When a variable is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// By the library at run time.
    Runtime,
    /// By `kernels/build.rs` while building.
    Build,
    /// By the tests.
    Test,
}

/// One declared variable.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Param {
    /// The variable's name.
    pub name: &'static str,
    /// Type and bounds.
    pub kind: Kind,
    /// The default, as the README shows it.
    pub default: &'static str,
    /// What it does (the README's "Meaning").
    pub doc: &'static str,
    /// When it is read.
    pub scope: Scope,
    /// For an older name: the variable it stands in for (read when that one is unset).
    pub alias_of: Option<&'static str>,
}

impl fmt::Display for Param {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

/// A malformed value; the text names the variable and what it accepts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamError(pub String);

impl fmt::Display for ParamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ParamError {}

/// Looks a variable up: its trimmed value, `None` when unset or empty.
pub type Lookup<'a> = &'a dyn Fn(&str) -> Option<String>;

impl Param {
    /// The trimmed value in the process environment, `None` when unset or empty; a value
    /// that is not UTF-8 is an error.
    pub fn raw(&self) -> Result<Option<String>, ParamError> {
        match std::env::var(self.name) {
            Ok(v) if v.trim().is_empty() => Ok(None),
            Ok(v) => Ok(Some(v.trim().to_string())),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => {
                Err(ParamError(format!("{} is not valid UTF-8", self.name)))
            }
        }
    }

    /// The trimmed value `get` gives, `None` when unset or empty.
    pub fn raw_in(&self, get: Lookup<'_>) -> Option<String> {
        get(self.name)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    }

    /// Parses `raw` as this integer variable.
    pub fn parse_int(&self, raw: &str) -> Result<u64, ParamError> {
        let Kind::Int { min, max, suffixes } = self.kind else {
            return Err(self.misuse("an integer"));
        };
        let s = raw.trim();
        let (digits, mult) = match s.char_indices().last() {
            Some((i, 'K' | 'k')) if suffixes => (&s[..i], 1u64 << 10),
            Some((i, 'M' | 'm')) if suffixes => (&s[..i], 1u64 << 20),
            Some((i, 'G' | 'g')) if suffixes => (&s[..i], 1u64 << 30),
            _ => (s, 1),
        };
        match digits.parse::<u64>().ok().and_then(|v| v.checked_mul(mult)) {
            Some(v) if (min..=max).contains(&v) => Ok(v),
            _ if min == 0 && max == u64::MAX => Err(ParamError(format!(
                "{}={raw:?} is not a non-negative integer",
                self.name
            ))),
            _ => Err(ParamError(format!(
                "{}={raw:?} must be an integer between {min} and {max}",
                self.name
            ))),
        }
    }

    /// Parses `raw` as this real-valued variable.
    pub fn parse_real(&self, raw: &str) -> Result<f64, ParamError> {
        let Kind::Real { min, max } = self.kind else {
            return Err(self.misuse("a number"));
        };
        match raw.trim().parse::<f64>() {
            Ok(v) if v.is_finite() && v >= min && v <= max => Ok(v),
            _ => Err(ParamError(format!(
                "{}={raw:?} must be a number between {min} and {max}",
                self.name
            ))),
        }
    }

    /// Parses `raw` as this flag (`0` or `1`).
    pub fn parse_flag(&self, raw: &str) -> Result<bool, ParamError> {
        if self.kind != Kind::Flag {
            return Err(self.misuse("a flag"));
        }
        match raw.trim() {
            "0" => Ok(false),
            "1" => Ok(true),
            v => Err(ParamError(format!("{}={v:?} must be 0 or 1", self.name))),
        }
    }

    /// This integer variable from the process environment (`None`: unset).
    pub fn int(&self) -> Result<Option<u64>, ParamError> {
        self.raw()?.map(|v| self.parse_int(&v)).transpose()
    }

    /// This integer variable from `get` (`None`: unset).
    pub fn int_in(&self, get: Lookup<'_>) -> Result<Option<u64>, ParamError> {
        self.raw_in(get).map(|v| self.parse_int(&v)).transpose()
    }

    /// This real-valued variable from `get` (`None`: unset).
    pub fn real_in(&self, get: Lookup<'_>) -> Result<Option<f64>, ParamError> {
        self.raw_in(get).map(|v| self.parse_real(&v)).transpose()
    }

    /// This flag from the process environment (`None`: unset).
    pub fn flag(&self) -> Result<Option<bool>, ParamError> {
        self.raw()?.map(|v| self.parse_flag(&v)).transpose()
    }

    /// This flag from `get` (`None`: unset).
    pub fn flag_in(&self, get: Lookup<'_>) -> Result<Option<bool>, ParamError> {
        self.raw_in(get).map(|v| self.parse_flag(&v)).transpose()
    }

    /// A reader asked for the wrong type: a bug in the caller, reported as an error that
    /// names the variable rather than a panic.
    fn misuse(&self, want: &str) -> ParamError {
        ParamError(format!(
            "{} is declared as {:?}, read as {want} (a bug in its reader)",
            self.name, self.kind
        ))
    }
}

/// The declared variable called `name` (an older name included).
pub fn find(name: &str) -> Option<&'static Param> {
    ALL.iter().copied().find(|p| p.name == name)
}

/// The README's table of variables: every declared variable, older names next to the
/// name they stand in for, build-time and test variables marked so.
pub fn markdown_table() -> String {
    let mut t = String::from("| Variable | Default | Meaning |\n|---|---|---|\n");
    for p in ALL.iter().filter(|p| p.alias_of.is_none()) {
        let mut name = format!("`{}`", p.name);
        for a in ALL.iter().filter(|a| a.alias_of == Some(p.name)) {
            name.push_str(&format!(" (`{}`)", a.name));
        }
        t.push_str(&format!("| {name} | {} | {} |\n", p.default, p.doc));
    }
    t.push_str(
        "| `NCCL_TESTS_*` | | see [nccl-tests-compat/README.md](nccl-tests-compat/README.md) |\n",
    );
    t
}

/// `NCCL_DEBUG`.
pub const NCCL_DEBUG: Param = Param {
    name: "NCCL_DEBUG",
    kind: Kind::Text,
    default: "unset (off)",
    doc: "`VERSION`, `WARN`, `INFO`, `TRACE` (`ABORT` = `INFO`): NCCL-style log lines `host:pid:tid [rank] NCCL INFO ...`",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `NCCL_DEBUG_SUBSYS`.
pub const NCCL_DEBUG_SUBSYS: Param = Param {
    name: "NCCL_DEBUG_SUBSYS",
    kind: Kind::Text,
    default: "`INIT,BOOTSTRAP,ENV`",
    doc: "comma list of `INIT,COLL,P2P,SHM,NET,BOOTSTRAP,ENV,ALLOC,CALL,...`, `ALL`; `^` negates",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `NCCL_DEBUG_FILE`.
pub const NCCL_DEBUG_FILE: Param = Param {
    name: "NCCL_DEBUG_FILE",
    kind: Kind::Text,
    default: "stdout",
    doc: "log file; `%h` host, `%p` pid",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `NCCL_COMM_ID`.
pub const NCCL_COMM_ID: Param = Param {
    name: "NCCL_COMM_ID",
    kind: Kind::Text,
    default: "unset",
    doc: "`host:port` / `[v6]:port`: rank 0 hosts the bootstrap root inside init; `ncclGetUniqueId` returns the fixed id",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `NCCL_SOCKET_IFNAME`.
pub const NCCL_SOCKET_IFNAME: Param = Param {
    name: "NCCL_SOCKET_IFNAME",
    kind: Kind::Text,
    default: "NCCL's order (`ib*`, others, `docker*`, `lo*`)",
    doc: "interface for the bootstrap root, and so for each rank's bootstrap and socket-transport listeners; `^` excludes, `=` exact",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `NCCL_SOCKET_FAMILY`.
pub const NCCL_SOCKET_FAMILY: Param = Param {
    name: "NCCL_SOCKET_FAMILY",
    kind: Kind::Text,
    default: "any",
    doc: "`AF_INET` or `AF_INET6`",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `NCCL_COMM_BLOCKING`.
pub const NCCL_COMM_BLOCKING: Param = Param {
    name: "NCCL_COMM_BLOCKING",
    kind: Kind::Flag,
    default: "1",
    doc: "0: `ncclCommInitRank*` return `ncclInProgress` and finish in the background (`config.blocking` wins)",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `NCCL_MIN_CTAS`.
pub const NCCL_MIN_CTAS: Param = Param {
    name: "NCCL_MIN_CTAS",
    kind: Kind::Int {
        min: 0,
        max: u64::MAX,
        suffixes: true,
    },
    default: "1",
    doc: "minimum channels per operation; overrides `config.minCTAs`",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `NCCL_MIN_NCHANNELS`.
pub const NCCL_MIN_NCHANNELS: Param = Param {
    name: "NCCL_MIN_NCHANNELS",
    kind: Kind::Int {
        min: 0,
        max: u64::MAX,
        suffixes: true,
    },
    default: "1",
    doc: "older name of `NCCL_MIN_CTAS` (read when that is unset)",
    scope: Scope::Runtime,
    alias_of: Some("NCCL_MIN_CTAS"),
};

/// `NCCL_MAX_CTAS`.
pub const NCCL_MAX_CTAS: Param = Param {
    name: "NCCL_MAX_CTAS",
    kind: Kind::Int { min: 0, max: u64::MAX, suffixes: true },
    default: "4 (host)",
    doc: "maximum channels (1..32); overrides `config.maxCTAs`; also the probe frame's channel capacity",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `NCCL_MAX_NCHANNELS`.
pub const NCCL_MAX_NCHANNELS: Param = Param {
    name: "NCCL_MAX_NCHANNELS",
    kind: Kind::Int {
        min: 0,
        max: u64::MAX,
        suffixes: true,
    },
    default: "4 (host)",
    doc: "older name of `NCCL_MAX_CTAS` (read when that is unset)",
    scope: Scope::Runtime,
    alias_of: Some("NCCL_MAX_CTAS"),
};

/// `NCCL_BUFFSIZE`.
pub const NCCL_BUFFSIZE: Param = Param {
    name: "NCCL_BUFFSIZE",
    kind: Kind::Int {
        min: 512,
        max: 1 << 30,
        suffixes: true,
    },
    default: "1 MiB (host)",
    doc: "FIFO bytes per channel and link, split into 8 slots (512 B .. 1 GiB)",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `NCCL_P2P_DISABLE`.
pub const NCCL_P2P_DISABLE: Param = Param {
    name: "NCCL_P2P_DISABLE",
    kind: Kind::Flag,
    default: "0",
    doc: "1: no peer-to-peer/IPC between GPUs (NVIDIA's meaning). Device backend: ranks of other processes are reached through host-staged shared memory (pinned `/dev/shm` FIFOs) instead of CUDA IPC. Host backend: together with `NCCL_SHM_DISABLE=1`, ranks of one host talk over the socket transport, as NCCL falls back to its network transport when both are off",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `NCCL_SHM_DISABLE`.
pub const NCCL_SHM_DISABLE: Param = Param {
    name: "NCCL_SHM_DISABLE",
    kind: Kind::Flag,
    default: "0",
    doc: "1: no shared-memory transport (NVIDIA's meaning). Host backend: together with `NCCL_P2P_DISABLE=1`, ranks of one host talk over the socket transport; alone it changes nothing (in-host links stay peer-to-peer, as in NCCL). Every rank must set the same value",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `NCCL_HOSTID`.
pub const NCCL_HOSTID: Param = Param {
    name: "NCCL_HOSTID",
    kind: Kind::Text,
    default: "host name and boot id",
    doc: "what identifies this host (NVIDIA's meaning): ranks with the same value share memory, others talk over sockets",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `NCCL_SOCKET_NTHREADS`.
pub const NCCL_SOCKET_NTHREADS: Param = Param {
    name: "NCCL_SOCKET_NTHREADS",
    kind: Kind::Int {
        min: 1,
        max: 16,
        suffixes: false,
    },
    default: "1",
    doc: "socket transport: with `NCCL_NSOCKS_PERTHREAD`, the sockets of each stream (a channel of a link between hosts): `NCCL_SOCKET_NTHREADS` x `NCCL_NSOCKS_PERTHREAD`, at most 64 (past it the sockets per thread shrink, as NVIDIA's do, with a `WARN`); a payload over 64 KiB is striped over them in pieces of at least 64 KiB (the last may be shorter). Every rank must use the same product (checked at init). NVIDIA's helper threads are not separate threads here: the communicator's one proxy thread serves every socket with non-blocking I/O",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `NCCL_NSOCKS_PERTHREAD`.
pub const NCCL_NSOCKS_PERTHREAD: Param = Param {
    name: "NCCL_NSOCKS_PERTHREAD",
    kind: Kind::Int {
        min: 1,
        max: 64,
        suffixes: false,
    },
    default: "1",
    doc: "socket transport, NVIDIA's meaning: sockets per helper thread; see `NCCL_SOCKET_NTHREADS` for the sockets per stream they make",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `CUDA_DEVICE_MAX_CONNECTIONS` (CUDA's own; read, never set).
pub const CUDA_DEVICE_MAX_CONNECTIONS: Param = Param {
    name: "CUDA_DEVICE_MAX_CONNECTIONS",
    kind: Kind::Int {
        min: 1,
        max: 32,
        suffixes: false,
    },
    default: "8 (CUDA's)",
    doc: "CUDA's hardware work queues per context; read by device communicators only, to warn at init when the communicators of one process on one device (2 streams each) need more queues than this. Then kernels of different ranks can be serialized and hang: set it to 32 before CUDA starts (docs/device-backend.md). The library never sets it",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `NCCL_ALGO`.
pub const NCCL_ALGO: Param = Param {
    name: "NCCL_ALGO",
    kind: Kind::Text,
    default: "automatic",
    doc: "NVIDIA's syntax (comma list, `^` excludes). Host backend: `Ring` (every collective) and `Tree` (recursive doubling, AllReduce); unset: AllReduce of at most 8 KiB per rank runs Tree, the rest Ring (over sockets: up to 128 KiB on 2 ranks, 32 KiB on more; docs/host-backend.md, \"Algorithms and protocols\"); other NCCL names accepted and ignored, unknown names fail init. Device backend: Ring (P2P for point-to-point), read only to warn",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `NCCL_PROTO`.
pub const NCCL_PROTO: Param = Param {
    name: "NCCL_PROTO",
    kind: Kind::Text,
    default: "all",
    doc: "NVIDIA's syntax: comma-separated, case-insensitive `LL`, `LL128`, `Simple`; a leading `^` = all except those. Device communicators: an operation uses LL when allowed and each rank's send buffer is at most 64 KiB, else Simple when allowed, else LL; Send/Recv groups use Simple when allowed (both ends must agree), else LL. `LL128` is accepted but not implemented (never chosen, one warning); a set without `LL` and `Simple` (e.g. `LL128`) fails init; unknown names fail init naming the variable. Host communicators: Ring runs Simple (a warning when the set excludes it; junk fails init there too), Tree runs Simple when allowed, LL when only LL is",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `CCLD_BACKEND`.
pub const CCLD_BACKEND: Param = Param {
    name: "CCLD_BACKEND",
    kind: Kind::Text,
    default: "`auto`",
    doc: "`auto`: the device backend when a device is usable (CUDA, or the emulator with `CCLD_DEVICE_EMULATION=1`), else the host backend, except that CUDA failing while the system shows an NVIDIA GPU fails init (a set `CUDA_VISIBLE_DEVICES` falls back with a WARN); `host` or `device` force one (`device` without a usable device fails init); all ranks must agree. Anything else fails init naming the variable (docs/device-backend.md)",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `CCLD_DEVICE_EMULATION`.
pub const CCLD_DEVICE_EMULATION: Param = Param {
    name: "CCLD_DEVICE_EMULATION",
    kind: Kind::Flag,
    default: "0",
    doc: "1: the device backend runs on the CPU emulator of the device (a testing aid: every launched plan runs the kernel source on the host)",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `CCLD_EMU_KERNEL`.
pub const CCLD_EMU_KERNEL: Param = Param {
    name: "CCLD_EMU_KERNEL",
    kind: Kind::Text,
    default: "`source`",
    doc: "with `CCLD_DEVICE_EMULATION=1`: `source` runs the kernel source compiled for the CPU, `rust` the emulator's Rust re-implementation (without the descriptor check); anything else fails the launch naming the variable",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `CCLD_BOOTSTRAP_TIMEOUT_S`.
pub const CCLD_BOOTSTRAP_TIMEOUT_S: Param = Param {
    name: "CCLD_BOOTSTRAP_TIMEOUT_S",
    kind: Kind::Int { min: 1, max: u64::MAX, suffixes: true },
    default: "120",
    doc: "how long init/split wait for peers and the root; also the idle lifetime of a root started by `ncclGetUniqueId`",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `CCLD_BOOTSTRAP_IP`.
pub const CCLD_BOOTSTRAP_IP: Param = Param {
    name: "CCLD_BOOTSTRAP_IP",
    kind: Kind::Text,
    default: "interface choice above",
    doc: "IP the bootstrap root and rank listeners bind and advertise (tests use `127.0.0.1`)",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `CCLD_SPIN_US`.
pub const CCLD_SPIN_US: Param = Param {
    name: "CCLD_SPIN_US",
    kind: Kind::Int { min: 0, max: u64::MAX, suffixes: true },
    default: "200 when each rank has a core: the communicator's ranks on this machine (one kernel, whatever the host names or `NCCL_HOSTID`), and their socket proxies, fit the process's cores, or the process is bound to one CPU and has no proxy; 0 otherwise",
    doc: "host backend: how long (microseconds) an operation waiting for a peer spins before it yields and then sleeps on its doorbell; 0 = no spinning: it yields for `CCLD_YIELD_US`, then sleeps. No spinning while a peer last ran on the waiting rank's CPU (bind ranks to CPUs: `ccl-run` does by default)",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `CCLD_YIELD_US`.
pub const CCLD_YIELD_US: Param = Param {
    name: "CCLD_YIELD_US",
    kind: Kind::Int { min: 0, max: u64::MAX, suffixes: true },
    default: "1000",
    doc: "host backend: how long (microseconds) an operation waiting for a peer that does not spin (`CCLD_SPIN_US` 0, the default when the ranks outnumber the cores, or a peer on its CPU) keeps polling between `sched_yield` calls before it sleeps on its doorbell: the peer it waits for gets the core, and no futex wake-up is needed; 0 = 8 yields, then sleep",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `CCLD_SOCKET_SEND_BY_REF`.
pub const CCLD_SOCKET_SEND_BY_REF: Param = Param {
    name: "CCLD_SOCKET_SEND_BY_REF",
    kind: Kind::Int { min: 0, max: u64::MAX, suffixes: true },
    default: "32K",
    doc: "socket transport: a message of at least this many bytes to a peer on another host leaves from the operation's own buffer (the proxy writes it from there, and the operation completes once the kernel has every such message) instead of a copy in the send slot; 0 = always copy, as over shared memory",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `CCLD_SOCKET_BUFFER`.
pub const CCLD_SOCKET_BUFFER: Param = Param {
    name: "CCLD_SOCKET_BUFFER",
    kind: Kind::Int { min: 0, max: 1 << 30, suffixes: true },
    default: "4M when the communicator's ranks on this machine (one kernel, whatever the host names) are no more than the process's cores; 0 otherwise",
    doc: "socket transport: the send and receive buffer (`SO_SNDBUF`, `SO_RCVBUF`) set on each connection between hosts, when the system allows that much of both (`net.core.wmem_max`, `net.core.rmem_max`); otherwise, or with 0, the kernel's autotuning, which starts small and grows over the first operations' round trips",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `CCLD_PEER_CHECK_MS`.
pub const CCLD_PEER_CHECK_MS: Param = Param {
    name: "CCLD_PEER_CHECK_MS",
    kind: Kind::Int { min: 1, max: u64::MAX, suffixes: true },
    default: "200",
    doc: "how often a waiting operation checks that the peers it waits on are alive: a dead peer makes the survivors waiting on it fail with `ncclRemoteError` within this bound + 5 ms, and the others as soon as the poison they are sent reaches them (host backend); on the device backend the watch thread checks at this period while operations are in flight (kernel faults and the descriptor check's poison board too): `ncclCommGetAsyncError` and the next call report a dead peer within 2 x this bound + one period",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `CCLD_DEVICE_PLANS`.
pub const CCLD_DEVICE_PLANS: Param = Param {
    name: "CCLD_DEVICE_PLANS",
    kind: Kind::Text,
    default: "`device`",
    doc: "device backend: where kernels read their plan arrays. `device`: a copy in device memory made on the stream before the kernel (once per cached plan shape); `mapped`: the mapped host memory the runtime wrote (read over PCIe; kept to measure the difference, GPU suite part p). Anything else fails init naming the variable",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `CCLD_DISABLE`.
pub const CCLD_DISABLE: Param = Param {
    name: "CCLD_DISABLE",
    kind: Kind::Flag,
    default: "0",
    doc: "1 turns probing off (no frame updates, no diagnostic thread)",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `CCLD_ANALYZER`.
pub const CCLD_ANALYZER: Param = Param {
    name: "CCLD_ANALYZER",
    kind: Kind::Text,
    default: "`embedded`",
    doc: "`embedded`: analyzer inside the job: communicators whose ranks all live in one process are analysed there; a communicator spanning processes makes its ranks agree at init on the job's analyzer hubs: a primary in the process of its rank 0 and a standby in the process of the lowest rank living elsewhere (each bound to its bootstrap IP, ephemeral port, both logged), to which every process then reports (sub-communicators reuse them; each hub takes its engine settings `CCLD_HANG_TIMEOUT_S` .. `CCLD_SILENT_S` from its own process); the standby reports once the primary has not answered for 1 s; `off`: no diagnostic thread; `host:port[,host:port...]`: analyzer shards (records go to the communicator's owner, failover in hash order)",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `CCLD_REPORT`.
pub const CCLD_REPORT: Param = Param {
    name: "CCLD_REPORT",
    kind: Kind::Text,
    default: "`stderr`",
    doc: "where the process hosting the active analyzer (the local engine, or the job's active hub) reports each new incident, once: `stderr`: one plain line (root rank, pid, host, class, operation, `ccld anomalies --server` of the job's hubs); `off`: nothing; a path ending in `.jsonl`: one JSON object per line appended to that file, flushed per line (fields: `id`, `class`, `exited`, `comm_id`, `collective`, `op`, `roots[]` with `rank`, `pid`, `host`, `reason`, `exited`, `chain`, `summary`, `detected_at_ns`, `onset_ns`); anything else, or a file that cannot be opened, fails init naming the variable",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `CCLD_SAMPLE_US`.
pub const CCLD_SAMPLE_US: Param = Param {
    name: "CCLD_SAMPLE_US",
    kind: Kind::Int { min: 10, max: 10_000_000, suffixes: false },
    default: "10000 (host backend), 1000 (a device communicator in the process)",
    doc: "diagnostic thread sampling period (10 us .. 10 s) while an operation runs longer than it; otherwise the period doubles every 4 ticks up to 50 ms. On the host backend every core runs communication, so the default is 10 ms there; with a device communicator the host is idle and the paper's 1 ms applies",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `CCLD_RECORD_US`.
pub const CCLD_RECORD_US: Param = Param {
    name: "CCLD_RECORD_US",
    kind: Kind::Int { min: 0, max: 60_000_000, suffixes: false },
    default: "5000",
    doc: "record thinning: a communicator reports the completions of about one round per this interval per rank, the same pseudo-random rounds on every rank (0 .. 60 s; `0`: every operation). Never thinned: the first 32 operations, failures, in-flight snapshots and the rounds before a suspected hang. Read at every communicator init; use the same value on every rank ([docs/diagnosis.md](docs/diagnosis.md) §1)",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `CCLD_INFLIGHT_MS`.
pub const CCLD_INFLIGHT_MS: Param = Param {
    name: "CCLD_INFLIGHT_MS",
    kind: Kind::Int {
        min: 1,
        max: 3_600_000,
        suffixes: false,
    },
    default: "1000",
    doc: "in-flight snapshot period of an operation still running",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `CCLD_HEARTBEAT_MS`.
pub const CCLD_HEARTBEAT_MS: Param = Param {
    name: "CCLD_HEARTBEAT_MS",
    kind: Kind::Int {
        min: 1,
        max: 3_600_000,
        suffixes: false,
    },
    default: "1000",
    doc: "process heartbeat period",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `CCLD_SPOOL_DIR`.
pub const CCLD_SPOOL_DIR: Param = Param {
    name: "CCLD_SPOOL_DIR",
    kind: Kind::Text,
    default: "`$TMPDIR/ccld-spool`",
    doc: "where batches wait (file `spool-<pid>-<start>.bin`, start = the process start time, so a recycled pid never replays another process's batches; files of exited processes are deleted) while no analyzer shard (or embedded hub) is reachable; replayed afterwards by the same process",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `CCLD_SPOOL_MAX_MB`.
pub const CCLD_SPOOL_MAX_MB: Param = Param {
    name: "CCLD_SPOOL_MAX_MB",
    kind: Kind::Int {
        min: 1,
        max: 1 << 20,
        suffixes: false,
    },
    default: "64",
    doc: "spool bound; beyond it batches are dropped and counted (heartbeat `records_dropped`)",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `CCLD_HANG_TIMEOUT_S`.
pub const CCLD_HANG_TIMEOUT_S: Param = Param {
    name: "CCLD_HANG_TIMEOUT_S",
    kind: Kind::Real {
        min: 0.01,
        max: 1e6,
    },
    default: "300",
    doc: "embedded analyzer: hang threshold (seconds, fractional allowed)",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `CCLD_SLOW_WINDOW_S`.
pub const CCLD_SLOW_WINDOW_S: Param = Param {
    name: "CCLD_SLOW_WINDOW_S",
    kind: Kind::Real {
        min: 0.01,
        max: 1e6,
    },
    default: "60",
    doc: "embedded analyzer: slow detection window",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `CCLD_SLOW_THETA`.
pub const CCLD_SLOW_THETA: Param = Param {
    name: "CCLD_SLOW_THETA",
    kind: Kind::Real {
        min: 0.01,
        max: 1e6,
    },
    default: "3",
    doc: "embedded analyzer: slowdown ratio R threshold",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `CCLD_SLOW_REPEAT`.
pub const CCLD_SLOW_REPEAT: Param = Param {
    name: "CCLD_SLOW_REPEAT",
    kind: Kind::Int {
        min: 1,
        max: 1000,
        suffixes: false,
    },
    default: "2",
    doc: "embedded analyzer: consecutive slow windows before location",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `CCLD_SLOW_CALIBRATE`.
pub const CCLD_SLOW_CALIBRATE: Param = Param {
    name: "CCLD_SLOW_CALIBRATE",
    kind: Kind::Flag,
    default: "1",
    doc: "embedded analyzer: 1 = self-calibrated slow rule per communicator once it has 64 clean rounds (docs/diagnosis.md §3a); 0 = the paper's fixed rule only",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `CCLD_T_BASE_INIT_MS`.
pub const CCLD_T_BASE_INIT_MS: Param = Param {
    name: "CCLD_T_BASE_INIT_MS",
    kind: Kind::Int {
        min: 1,
        max: 86_400_000,
        suffixes: false,
    },
    default: "10000",
    doc: "embedded analyzer: static baseline T_base(init)",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `CCLD_BASELINE_S`.
pub const CCLD_BASELINE_S: Param = Param {
    name: "CCLD_BASELINE_S",
    kind: Kind::Real { min: 0.01, max: 1e6 },
    default: "120",
    doc: "embedded analyzer: span whose rounds form the dynamic baseline (m = min(100, rounds in it))",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `CCLD_SILENT_S`.
pub const CCLD_SILENT_S: Param = Param {
    name: "CCLD_SILENT_S",
    kind: Kind::Real {
        min: 0.01,
        max: 1e6,
    },
    default: "60",
    doc:
        "embedded analyzer: a rank without records/heartbeats this long is silent (stopped or dead)",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `CCLD_INJECT`.
pub const CCLD_INJECT: Param = Param {
    name: "CCLD_INJECT",
    kind: Kind::Text,
    default: "unset",
    doc: "fault injection (host and device backends), e.g. `s1:rank=2,ops=100..,delay=20ms`; grammar in [docs/diagnosis.md](docs/diagnosis.md)",
    scope: Scope::Runtime,
    alias_of: None,
};

/// `CCLD_NO_NVCC`.
pub const CCLD_NO_NVCC: Param = Param {
    name: "CCLD_NO_NVCC",
    kind: Kind::Flag,
    default: "0",
    doc: "build time (`kernels/build.rs`): 1 builds the host-only variant even where nvcc exists",
    scope: Scope::Build,
    alias_of: None,
};

/// `CCLD_SIM_THREADS`.
pub const CCLD_SIM_THREADS: Param = Param {
    name: "CCLD_SIM_THREADS",
    kind: Kind::Int { min: 1, max: 1024, suffixes: false },
    default: "2",
    doc: "build time: threads per block of the kernel source built for the host (the emulated device)",
    scope: Scope::Build,
    alias_of: None,
};

/// `CCLD_KERNEL_TSAN`.
pub const CCLD_KERNEL_TSAN: Param = Param {
    name: "CCLD_KERNEL_TSAN",
    kind: Kind::Flag,
    default: "0",
    doc: "build time: 1 builds the host kernel with ThreadSanitizer (`scripts/kernel-tsan.sh`)",
    scope: Scope::Build,
    alias_of: None,
};

/// `CCLD_KERNEL_COVERAGE`.
pub const CCLD_KERNEL_COVERAGE: Param = Param {
    name: "CCLD_KERNEL_COVERAGE",
    kind: Kind::Flag,
    default: "0",
    doc: "build time: 1 builds the host kernel with gcov (`scripts/kernel-coverage.sh`)",
    scope: Scope::Build,
    alias_of: None,
};

/// `CCLD_EXPECT_CUDA`.
pub const CCLD_EXPECT_CUDA: Param = Param {
    name: "CCLD_EXPECT_CUDA",
    kind: Kind::Flag,
    default: "0",
    doc: "tests: 1 makes the kernels' tests fail when the build fell back to host-only (CI)",
    scope: Scope::Test,
    alias_of: None,
};

/// `CCLD_TEST_FROZEN_CHILD_MS`.
pub const CCLD_TEST_FROZEN_CHILD_MS: Param = Param {
    name: "CCLD_TEST_FROZEN_CHILD_MS",
    kind: Kind::Int {
        min: 0,
        max: u64::MAX,
        suffixes: false,
    },
    default: "unset",
    doc: "tests: set by `probe`'s frozen-time test for the child process it stops and resumes",
    scope: Scope::Test,
    alias_of: None,
};

/// `CCLD_LINGER_TEST`.
pub const CCLD_LINGER_TEST: Param = Param {
    name: "CCLD_LINGER_TEST",
    kind: Kind::Text,
    default: "unset",
    doc: "tests: set by `probe`'s linger tests for the child process that exits with records in flight",
    scope: Scope::Test,
    alias_of: None,
};

/// Every parameter, in the README table's order.
pub const ALL: &[&Param] = &[
    &NCCL_DEBUG,
    &NCCL_DEBUG_SUBSYS,
    &NCCL_DEBUG_FILE,
    &NCCL_COMM_ID,
    &NCCL_SOCKET_IFNAME,
    &NCCL_SOCKET_FAMILY,
    &NCCL_COMM_BLOCKING,
    &NCCL_MIN_CTAS,
    &NCCL_MIN_NCHANNELS,
    &NCCL_MAX_CTAS,
    &NCCL_MAX_NCHANNELS,
    &NCCL_BUFFSIZE,
    &NCCL_P2P_DISABLE,
    &NCCL_SHM_DISABLE,
    &NCCL_HOSTID,
    &NCCL_SOCKET_NTHREADS,
    &NCCL_NSOCKS_PERTHREAD,
    &CUDA_DEVICE_MAX_CONNECTIONS,
    &NCCL_ALGO,
    &NCCL_PROTO,
    &CCLD_BACKEND,
    &CCLD_DEVICE_EMULATION,
    &CCLD_EMU_KERNEL,
    &CCLD_BOOTSTRAP_TIMEOUT_S,
    &CCLD_BOOTSTRAP_IP,
    &CCLD_SPIN_US,
    &CCLD_YIELD_US,
    &CCLD_SOCKET_SEND_BY_REF,
    &CCLD_SOCKET_BUFFER,
    &CCLD_PEER_CHECK_MS,
    &CCLD_DEVICE_PLANS,
    &CCLD_DISABLE,
    &CCLD_ANALYZER,
    &CCLD_REPORT,
    &CCLD_SAMPLE_US,
    &CCLD_RECORD_US,
    &CCLD_INFLIGHT_MS,
    &CCLD_HEARTBEAT_MS,
    &CCLD_SPOOL_DIR,
    &CCLD_SPOOL_MAX_MB,
    &CCLD_HANG_TIMEOUT_S,
    &CCLD_SLOW_WINDOW_S,
    &CCLD_SLOW_THETA,
    &CCLD_SLOW_REPEAT,
    &CCLD_SLOW_CALIBRATE,
    &CCLD_T_BASE_INIT_MS,
    &CCLD_BASELINE_S,
    &CCLD_SILENT_S,
    &CCLD_INJECT,
    &CCLD_NO_NVCC,
    &CCLD_SIM_THREADS,
    &CCLD_KERNEL_TSAN,
    &CCLD_KERNEL_COVERAGE,
    &CCLD_EXPECT_CUDA,
    &CCLD_TEST_FROZEN_CHILD_MS,
    &CCLD_LINGER_TEST,
];

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::path::Path;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
    }

    #[test]
    fn names_are_unique_and_older_names_point_at_declared_ones() {
        let mut seen = HashSet::new();
        for p in ALL {
            assert!(seen.insert(p.name), "{} declared twice", p.name);
            // Ours, or CUDA's one that device communicators read (never set).
            assert!(
                p.name.starts_with("NCCL_")
                    || p.name.starts_with("CCLD_")
                    || p.name == "CUDA_DEVICE_MAX_CONNECTIONS",
                "{}",
                p.name
            );
            if let Some(a) = p.alias_of {
                let target = find(a).unwrap_or_else(|| panic!("{} stands in for {a}", p.name));
                assert_eq!((target.kind, target.alias_of), (p.kind, None), "{}", p.name);
            }
            // A numeric default shown plainly is inside the declared bounds.
            if let Ok(d) = p.default.parse::<f64>() {
                match p.kind {
                    Kind::Int { .. } => assert!(p.parse_int(p.default).is_ok(), "{}", p.name),
                    Kind::Real { .. } => assert!(p.parse_real(p.default).is_ok(), "{}", p.name),
                    Kind::Flag => assert!(d == 0.0 || d == 1.0, "{}", p.name),
                    Kind::Text => {}
                }
            }
        }
    }

    #[test]
    fn integers_take_suffixes_where_declared_and_bounds_always() {
        assert_eq!(NCCL_BUFFSIZE.parse_int("4M"), Ok(4 << 20));
        assert_eq!(NCCL_BUFFSIZE.parse_int(" 1G "), Ok(1 << 30));
        let e = NCCL_BUFFSIZE.parse_int("2G").unwrap_err().0;
        assert!(
            e.contains("NCCL_BUFFSIZE") && e.contains("512") && e.contains("1073741824"),
            "{e}"
        );
        assert!(NCCL_BUFFSIZE.parse_int("100").is_err());
        // No suffixes for a variable that does not declare them.
        assert!(CCLD_SAMPLE_US.parse_int("1K").is_err());
        assert_eq!(CCLD_SAMPLE_US.parse_int("1000"), Ok(1000));
        let e = CCLD_SAMPLE_US.parse_int("5").unwrap_err().0;
        assert_eq!(
            e,
            "CCLD_SAMPLE_US=\"5\" must be an integer between 10 and 10000000"
        );
        let e = CCLD_SPIN_US.parse_int("-1").unwrap_err().0;
        assert_eq!(e, "CCLD_SPIN_US=\"-1\" is not a non-negative integer");
        assert!(CCLD_SPIN_US.parse_int("99999999999999999999").is_err());
        assert!(CCLD_SPIN_US.parse_int("16777216T").is_err());
    }

    #[test]
    fn reals_flags_and_lookups() {
        assert_eq!(CCLD_SLOW_THETA.parse_real("2.5"), Ok(2.5));
        for bad in ["nan", "inf", "0", "x", "1e7"] {
            let e = CCLD_SLOW_THETA.parse_real(bad).unwrap_err().0;
            assert!(e.starts_with("CCLD_SLOW_THETA="), "{e}");
        }
        assert_eq!(CCLD_DISABLE.parse_flag("1"), Ok(true));
        assert_eq!(CCLD_DISABLE.parse_flag(" 0"), Ok(false));
        assert_eq!(
            CCLD_DISABLE.parse_flag("yes").unwrap_err().0,
            "CCLD_DISABLE=\"yes\" must be 0 or 1"
        );
        let get = env(&[("CCLD_SLOW_REPEAT", " 3 "), ("CCLD_SLOW_THETA", "  ")]);
        assert_eq!(CCLD_SLOW_REPEAT.int_in(&get), Ok(Some(3)));
        assert_eq!(
            CCLD_SLOW_THETA.real_in(&get),
            Ok(None),
            "blank reads as unset"
        );
        assert_eq!(CCLD_SILENT_S.real_in(&get), Ok(None));
        // Reading a variable as the wrong type is an error naming it, not a panic.
        assert!(NCCL_PROTO
            .parse_int("1")
            .unwrap_err()
            .0
            .contains("NCCL_PROTO"));
        assert_eq!(
            find("NCCL_MIN_NCHANNELS").map(|p| p.alias_of),
            Some(Some("NCCL_MIN_CTAS"))
        );
        assert!(find("NCCL_NOT_A_VARIABLE").is_none());
    }

    fn repo() -> &'static Path {
        Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
    }

    #[test]
    fn the_readme_table_is_the_registry() {
        let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
        let start = readme
            .find("| Variable | Default | Meaning |")
            .expect("README has the table of variables");
        let end = readme[start..]
            .find("\n\n")
            .map_or(readme.len(), |e| start + e + 1);
        let want = markdown_table();
        assert!(
            readme[start..end] == want,
            "README.md's table of variables differs from the registry; replace it with:\n\n{want}"
        );
    }

    /// Every `"NCCL_..."`/`"CCLD_..."` string literal in the Rust sources under `path`.
    fn names_in(path: &Path, out: &mut Vec<(String, String)>) {
        let entries: Vec<_> = if path.is_dir() {
            std::fs::read_dir(path)
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect()
        } else {
            vec![path.to_path_buf()]
        };
        for p in entries {
            if p.is_dir() {
                names_in(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let text = std::fs::read_to_string(&p).unwrap();
                for (i, _) in text.match_indices('"') {
                    let rest = &text[i + 1..];
                    if !(rest.starts_with("NCCL_") || rest.starts_with("CCLD_")) {
                        continue;
                    }
                    let name: String = rest
                        .chars()
                        .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                        .collect();
                    if rest[name.len()..].starts_with('"') {
                        out.push((name, p.display().to_string()));
                    }
                }
            }
        }
    }

    #[test]
    fn every_variable_named_in_the_library_is_declared() {
        let mut found = Vec::new();
        for d in [
            "ccl-core/src",
            "ccl-ffi/src",
            "probe/src",
            "kernels/src",
            "kernels/build.rs",
        ] {
            names_in(&repo().join(d), &mut found);
        }
        let undeclared: Vec<String> = found
            .iter()
            .filter(|(n, _)| find(n).is_none())
            .map(|(n, f)| format!("{n} ({f})"))
            .collect();
        assert!(
            found.len() > 20,
            "the scan found the library's variables: {found:?}"
        );
        assert!(undeclared.is_empty(), "not in ccl-params: {undeclared:?}");
    }
}
