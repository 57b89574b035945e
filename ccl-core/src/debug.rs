//! NCCL-style logging: `NCCL_DEBUG`, `NCCL_DEBUG_SUBSYS` and `NCCL_DEBUG_FILE` mapped onto a
//! `tracing` subscriber.
//!
//! Events whose target is `nccl::<SUBSYS>` (for example `nccl::INIT`) are printed like NCCL
//! prints its own lines:
//!
//! ```text
//! host:pid:tid [rank] NCCL INFO message key=value
//! host:pid:tid [rank] NCCL WARN message
//! ```
//!
//! `[rank]` is the event's `rank` field, else the rank set for the thread with
//! [`set_thread_rank`], else `0`. Warnings are shown at every level from `WARN` up whatever
//! the subsystem mask; `INFO` lines need their subsystem in the mask; `TRACE` also shows
//! `debug!`/`trace!` events.
//!
//! [`init`] installs the subscriber once per process (the C API calls it lazily on its first
//! call); [`reload`] re-reads the variables. Setting logging up never fails: a malformed
//! value is reported as a warning line that names the variable and a default is used.

use parking_lot::{Mutex, RwLock};
use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::{Arc, Once, OnceLock};

use tracing::field::{Field, Visit};
use tracing::span;
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata};

/// Our version string, printed at `NCCL_DEBUG=VERSION` and above.
pub const VERSION_STRING: &str = "NCCL version 2.30.7+ccl-d";

/// Verbosity chosen by `NCCL_DEBUG` (ordered: each level includes the ones below it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum DebugLevel {
    /// Unset: nothing is printed.
    None,
    /// `VERSION`: only the version line.
    Version,
    /// `WARN`: the version line and warnings.
    Warn,
    /// `INFO` (and `ABORT`, which NCCL treats as INFO plus aborting on errors; we never
    /// abort): informational lines of the selected subsystems.
    Info,
    /// `TRACE`: also `debug!`/`trace!` events.
    Trace,
}

/// Subsystem names accepted in `NCCL_DEBUG_SUBSYS`, in bit order.
pub const SUBSYSTEMS: [&str; 16] = [
    "INIT",
    "COLL",
    "P2P",
    "SHM",
    "NET",
    "GRAPH",
    "TUNING",
    "ENV",
    "ALLOC",
    "CALL",
    "PROXY",
    "NVLS",
    "BOOTSTRAP",
    "REG",
    "PROFILE",
    "RAS",
];

/// A set of subsystems (bit i = `SUBSYSTEMS[i]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SubsysMask(pub u32);

impl SubsysMask {
    /// Every subsystem.
    pub const ALL: SubsysMask = SubsysMask((1 << SUBSYSTEMS.len()) - 1);

    /// NCCL's default: `INIT,BOOTSTRAP,ENV`.
    pub fn default_mask() -> Self {
        SubsysMask(bit("INIT") | bit("BOOTSTRAP") | bit("ENV"))
    }

    /// True when `subsys` (e.g. `"INIT"`) is in the set. Unknown names are only in `ALL`.
    pub fn contains(self, subsys: &str) -> bool {
        match SUBSYSTEMS
            .iter()
            .position(|s| s.eq_ignore_ascii_case(subsys))
        {
            Some(i) => self.0 & (1 << i) != 0,
            None => self == SubsysMask::ALL,
        }
    }
}

fn bit(name: &str) -> u32 {
    SUBSYSTEMS
        .iter()
        .position(|s| *s == name)
        .map_or(0, |i| 1 << i)
}

/// Parses `NCCL_DEBUG` (case-insensitive). `Err` carries the warning text.
pub fn parse_level(raw: Option<&str>) -> Result<DebugLevel, String> {
    let Some(raw) = raw.map(str::trim).filter(|s| !s.is_empty()) else {
        return Ok(DebugLevel::None);
    };
    match raw.to_ascii_uppercase().as_str() {
        "VERSION" => Ok(DebugLevel::Version),
        "WARN" => Ok(DebugLevel::Warn),
        "INFO" | "ABORT" => Ok(DebugLevel::Info),
        "TRACE" => Ok(DebugLevel::Trace),
        _ => Err(format!(
            "NCCL_DEBUG={raw:?} is not one of VERSION, WARN, INFO, ABORT, TRACE; using WARN"
        )),
    }
}

/// Parses `NCCL_DEBUG_SUBSYS`: a comma list of subsystem names or `ALL`; a leading `^`
/// selects every subsystem except the listed ones. Unknown names are skipped; the returned
/// warnings name the variable and the bad token.
pub fn parse_subsys(raw: Option<&str>) -> (SubsysMask, Vec<String>) {
    let Some(raw) = raw.map(str::trim).filter(|s| !s.is_empty()) else {
        return (SubsysMask::default_mask(), Vec::new());
    };
    let (invert, list) = match raw.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, raw),
    };
    let mut mask = 0u32;
    let mut warnings = Vec::new();
    for tok in list.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        if tok.eq_ignore_ascii_case("ALL") {
            mask |= SubsysMask::ALL.0;
        } else if let Some(i) = SUBSYSTEMS.iter().position(|s| s.eq_ignore_ascii_case(tok)) {
            mask |= 1 << i;
        } else {
            warnings.push(format!(
                "NCCL_DEBUG_SUBSYS={raw:?}: unknown subsystem {tok:?} ignored (known: {}, ALL)",
                SUBSYSTEMS.join(",")
            ));
        }
    }
    let mask = if invert {
        SubsysMask::ALL.0 & !mask
    } else {
        mask
    };
    (SubsysMask(mask), warnings)
}

/// Expands `NCCL_DEBUG_FILE`: `%h` is the host name, `%p` the pid, `%%` a percent sign.
/// Other `%` sequences are kept as they are.
pub fn expand_file_pattern(pattern: &str, host: &str, pid: u32) -> String {
    let mut out = String::with_capacity(pattern.len() + 16);
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.peek() {
            Some('h') => {
                out.push_str(host);
                chars.next();
            }
            Some('p') => {
                let _ = write!(out, "{pid}");
                chars.next();
            }
            Some('%') => {
                out.push('%');
                chars.next();
            }
            _ => out.push('%'),
        }
    }
    out
}

/// Label of a line: `WARN`, `INFO` or `TRACE`.
pub fn level_label(level: Level) -> &'static str {
    if level <= Level::WARN {
        "WARN"
    } else if level == Level::INFO {
        "INFO"
    } else {
        "TRACE"
    }
}

/// One log line (with its newline) in NCCL's layout.
pub fn format_line(host: &str, pid: u32, tid: u64, rank: i64, label: &str, msg: &str) -> String {
    format!("{host}:{pid}:{tid} [{rank}] NCCL {label} {msg}\n")
}

/// Whether an event of `level` in subsystem `subsys` is printed under `cfg_level`/`mask`.
pub fn should_log(cfg_level: DebugLevel, mask: SubsysMask, level: Level, subsys: &str) -> bool {
    if level <= Level::WARN {
        cfg_level >= DebugLevel::Warn
    } else if level == Level::INFO {
        cfg_level >= DebugLevel::Info && mask.contains(subsys)
    } else {
        cfg_level >= DebugLevel::Trace && mask.contains(subsys)
    }
}

/// Where lines go.
enum Sink {
    Stdout,
    File(std::fs::File),
}

impl Sink {
    fn write_line(&mut self, line: &str) {
        // A failing log write must never fail or abort the caller: errors are dropped.
        let _ = match self {
            Sink::Stdout => {
                let mut out = std::io::stdout().lock();
                out.write_all(line.as_bytes()).and_then(|()| out.flush())
            }
            Sink::File(f) => f.write_all(line.as_bytes()),
        };
    }
}

struct Settings {
    level: DebugLevel,
    mask: SubsysMask,
}

struct Logger {
    settings: RwLock<Settings>,
    sink: Mutex<Sink>,
    host: String,
    pid: u32,
}

static LOGGER: OnceLock<Arc<Logger>> = OnceLock::new();
static INSTALL: Once = Once::new();
static VERSION_SHOWN: Once = Once::new();

thread_local! {
    static THREAD_RANK: std::cell::Cell<Option<i64>> = const { std::cell::Cell::new(None) };
    static THREAD_TID: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Sets the rank printed for events of this thread that carry no `rank` field.
pub fn set_thread_rank(rank: Option<i64>) {
    THREAD_RANK.with(|r| r.set(rank));
}

/// The kernel thread id (as NCCL prints it), cached per thread. Falls back to a small
/// per-process counter where `/proc/thread-self` is not available.
fn thread_id() -> u64 {
    THREAD_TID.with(|t| {
        if t.get() == 0 {
            let tid = std::fs::read_link("/proc/thread-self")
                .ok()
                .and_then(|p| p.file_name()?.to_str()?.parse::<u64>().ok())
                .unwrap_or_else(|| {
                    static NEXT: std::sync::atomic::AtomicU64 =
                        std::sync::atomic::AtomicU64::new(1);
                    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                });
            t.set(tid);
        }
        t.get()
    })
}

/// Host name up to the first dot, as NCCL prints it.
fn host_name() -> String {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".to_string());
    let h = raw.trim();
    let h = h.split('.').next().unwrap_or(h);
    if h.is_empty() {
        "localhost".to_string()
    } else {
        h.to_string()
    }
}

/// The raw (untrimmed) value of the declared variable `p`.
fn env_str(p: &ccl_params::Param) -> Result<Option<String>, String> {
    let name = p.name;
    match std::env::var(name) {
        Ok(v) => Ok(Some(v)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(format!("{name} is not valid UTF-8")),
    }
}

/// Reads the variables; returns the settings, the sink and the warnings to print.
fn read_env(host: &str, pid: u32) -> (Settings, Sink, Vec<String>) {
    let mut warnings = Vec::new();
    let level = match env_str(&ccl_params::NCCL_DEBUG).and_then(|v| parse_level(v.as_deref())) {
        Ok(l) => l,
        Err(w) => {
            warnings.push(w);
            DebugLevel::Warn
        }
    };
    let mask = match env_str(&ccl_params::NCCL_DEBUG_SUBSYS) {
        Ok(v) => {
            let (m, w) = parse_subsys(v.as_deref());
            warnings.extend(w);
            m
        }
        Err(w) => {
            warnings.push(w);
            SubsysMask::default_mask()
        }
    };
    let sink = match env_str(&ccl_params::NCCL_DEBUG_FILE) {
        Ok(Some(p)) if !p.trim().is_empty() && level > DebugLevel::None => {
            let path = expand_file_pattern(p.trim(), host, pid);
            match std::fs::File::create(&path) {
                Ok(f) => Sink::File(f),
                Err(e) => {
                    warnings.push(format!(
                        "NCCL_DEBUG_FILE={p:?}: cannot create {path:?} ({e}); logging to stdout"
                    ));
                    Sink::Stdout
                }
            }
        }
        Ok(_) => Sink::Stdout,
        Err(w) => {
            warnings.push(w);
            Sink::Stdout
        }
    };
    (Settings { level, mask }, sink, warnings)
}

impl Logger {
    fn new() -> Self {
        let host = host_name();
        let pid = std::process::id();
        let (settings, sink, warnings) = read_env(&host, pid);
        let logger = Logger {
            settings: RwLock::new(settings),
            sink: Mutex::new(sink),
            host,
            pid,
        };
        logger.print_warnings(&warnings);
        logger
    }

    fn reload(&self) {
        let (settings, sink, warnings) = read_env(&self.host, self.pid);
        *self.settings.write() = settings;
        *self.sink.lock() = sink;
        // The level may have changed: recompute the global maximum ([`max_level_hint`]).
        tracing::callsite::rebuild_interest_cache();
        self.print_warnings(&warnings);
    }

    /// Configuration warnings are always shown (they explain why logging looks wrong).
    fn print_warnings(&self, warnings: &[String]) {
        for w in warnings {
            let line = format_line(&self.host, self.pid, thread_id(), 0, "WARN", w);
            self.sink.lock().write_line(&line);
        }
    }

    fn level(&self) -> DebugLevel {
        self.settings.read().level
    }

    fn allows(&self, level: Level, subsys: &str) -> bool {
        let s = self.settings.read();
        should_log(s.level, s.mask, level, subsys)
    }

    fn write(&self, line: &str) {
        self.sink.lock().write_line(line);
    }
}

/// Collects an event's message, its `rank` field and the other fields.
#[derive(Default)]
struct Fields {
    message: String,
    rank: Option<i64>,
    extra: String,
}

impl Visit for Fields {
    fn record_i64(&mut self, field: &Field, value: i64) {
        if field.name() == "rank" {
            self.rank = Some(value);
        } else {
            let _ = write!(self.extra, " {}={value}", field.name());
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "rank" {
            self.rank = i64::try_from(value).ok();
        } else {
            let _ = write!(self.extra, " {}={value}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.extra, " {}={value}", field.name());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.extra, " {}={value:?}", field.name());
        }
    }
}

/// The `tracing` subscriber that prints NCCL-style lines.
struct NcclSubscriber {
    logger: Arc<Logger>,
}

fn subsystem_of(target: &str) -> Option<&str> {
    target.strip_prefix("nccl::")
}

impl tracing::Subscriber for NcclSubscriber {
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
        // `sometimes`: the decision depends on settings that `reload` may change.
        if meta.is_event() && subsystem_of(meta.target()).is_some() {
            Interest::sometimes()
        } else {
            Interest::never()
        }
    }

    /// The most verbose level `NCCL_DEBUG` lets through: `tracing` compares every event's
    /// level with it before anything else, so that with logging off (the default) a call
    /// site costs one load and compare, not a call of [`Self::enabled`].
    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        use tracing::level_filters::LevelFilter;
        Some(match self.logger.level() {
            DebugLevel::None | DebugLevel::Version => LevelFilter::OFF,
            DebugLevel::Warn => LevelFilter::WARN,
            DebugLevel::Info => LevelFilter::INFO,
            DebugLevel::Trace => LevelFilter::TRACE,
        })
    }

    fn enabled(&self, meta: &Metadata<'_>) -> bool {
        meta.is_event()
            && subsystem_of(meta.target()).is_some_and(|sub| self.logger.allows(*meta.level(), sub))
    }

    fn new_span(&self, _span: &span::Attributes<'_>) -> span::Id {
        // Spans are never enabled; an id is still required by the trait.
        span::Id::from_u64(1)
    }

    fn record(&self, _span: &span::Id, _values: &span::Record<'_>) {}

    fn record_follows_from(&self, _span: &span::Id, _follows: &span::Id) {}

    fn event(&self, event: &Event<'_>) {
        let meta = event.metadata();
        let Some(sub) = subsystem_of(meta.target()) else {
            return;
        };
        if !self.logger.allows(*meta.level(), sub) {
            return;
        }
        let mut f = Fields::default();
        event.record(&mut f);
        let rank = f
            .rank
            .or_else(|| THREAD_RANK.with(|r| r.get()))
            .unwrap_or(0);
        let msg = format!("{}{}", f.message, f.extra);
        let line = format_line(
            &self.logger.host,
            self.logger.pid,
            thread_id(),
            rank,
            level_label(*meta.level()),
            &msg,
        );
        self.logger.write(&line);
    }

    fn enter(&self, _span: &span::Id) {}

    fn exit(&self, _span: &span::Id) {}
}

/// Installs the NCCL-style subscriber as the process's global `tracing` dispatcher (once;
/// later calls do nothing). If another global subscriber is already installed, that one is
/// kept and only configuration warnings are printed by ours.
pub fn init() {
    INSTALL.call_once(|| {
        let logger = LOGGER.get_or_init(|| Arc::new(Logger::new())).clone();
        let sub = NcclSubscriber { logger };
        // Fails only if the host program installed its own subscriber first: keep theirs.
        let _ = tracing::subscriber::set_global_default(sub);
    });
}

/// Re-reads `NCCL_DEBUG*` (`ncclResetDebugInit`).
pub fn reload() {
    init();
    if let Some(l) = LOGGER.get() {
        l.reload();
    }
}

/// Prints the version line once per process, like NCCL at its first communicator init:
/// a bare line at `VERSION`/`WARN`, an `INFO` line at `INFO` and above.
pub fn show_version() {
    init();
    let Some(logger) = LOGGER.get() else {
        return;
    };
    VERSION_SHOWN.call_once(|| match logger.level() {
        DebugLevel::None => {}
        DebugLevel::Version | DebugLevel::Warn => logger.write(&format!("{VERSION_STRING}\n")),
        DebugLevel::Info | DebugLevel::Trace => {
            let line = format_line(
                &logger.host,
                logger.pid,
                thread_id(),
                THREAD_RANK.with(|r| r.get()).unwrap_or(0),
                "INFO",
                VERSION_STRING,
            );
            logger.write(&line);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels() {
        assert_eq!(parse_level(None), Ok(DebugLevel::None));
        assert_eq!(parse_level(Some("  ")), Ok(DebugLevel::None));
        assert_eq!(parse_level(Some("version")), Ok(DebugLevel::Version));
        assert_eq!(parse_level(Some("WARN")), Ok(DebugLevel::Warn));
        assert_eq!(parse_level(Some("Info")), Ok(DebugLevel::Info));
        assert_eq!(parse_level(Some("ABORT")), Ok(DebugLevel::Info));
        assert_eq!(parse_level(Some("trace")), Ok(DebugLevel::Trace));
        let e = parse_level(Some("LOUD")).unwrap_err();
        assert!(e.contains("NCCL_DEBUG") && e.contains("LOUD"), "{e}");
    }

    #[test]
    fn subsys_lists() {
        let (m, w) = parse_subsys(None);
        assert!(w.is_empty());
        assert_eq!(m, SubsysMask::default_mask());
        assert!(m.contains("INIT") && m.contains("BOOTSTRAP") && m.contains("ENV"));
        assert!(!m.contains("COLL"));

        let (m, _) = parse_subsys(Some("COLL,p2p"));
        assert!(m.contains("COLL") && m.contains("P2P"));
        assert!(!m.contains("INIT"));

        let (m, _) = parse_subsys(Some("ALL"));
        assert_eq!(m, SubsysMask::ALL);
        assert!(m.contains("SOMETHING_NEW"));

        let (m, w) = parse_subsys(Some("^INIT,NET"));
        assert!(w.is_empty());
        assert!(!m.contains("INIT") && !m.contains("NET"));
        assert!(m.contains("COLL") && m.contains("BOOTSTRAP"));

        let (m, w) = parse_subsys(Some("INIT,BOGUS"));
        assert!(m.contains("INIT"));
        assert_eq!(w.len(), 1);
        assert!(w[0].contains("NCCL_DEBUG_SUBSYS") && w[0].contains("BOGUS"));

        let (m, _) = parse_subsys(Some("^ALL"));
        assert_eq!(m.0, 0);
    }

    #[test]
    fn file_patterns() {
        assert_eq!(
            expand_file_pattern("/tmp/nccl.%h.%p.log", "node1", 42),
            "/tmp/nccl.node1.42.log"
        );
        assert_eq!(expand_file_pattern("a%%b%x%", "h", 1), "a%b%x%");
        assert_eq!(expand_file_pattern("plain", "h", 1), "plain");
    }

    #[test]
    fn line_layout() {
        assert_eq!(
            format_line("node1", 12, 34, 3, "INFO", "connected ring"),
            "node1:12:34 [3] NCCL INFO connected ring\n"
        );
        assert_eq!(level_label(Level::ERROR), "WARN");
        assert_eq!(level_label(Level::WARN), "WARN");
        assert_eq!(level_label(Level::INFO), "INFO");
        assert_eq!(level_label(Level::DEBUG), "TRACE");
    }

    #[test]
    fn filtering() {
        let def = SubsysMask::default_mask();
        // Warnings ignore the mask but need WARN or above.
        assert!(should_log(
            DebugLevel::Warn,
            SubsysMask(0),
            Level::WARN,
            "COLL"
        ));
        assert!(!should_log(DebugLevel::Version, def, Level::WARN, "INIT"));
        assert!(!should_log(DebugLevel::None, def, Level::ERROR, "INIT"));
        // INFO needs INFO and the subsystem.
        assert!(should_log(DebugLevel::Info, def, Level::INFO, "INIT"));
        assert!(!should_log(DebugLevel::Info, def, Level::INFO, "COLL"));
        assert!(!should_log(DebugLevel::Warn, def, Level::INFO, "INIT"));
        // debug/trace need TRACE.
        assert!(!should_log(DebugLevel::Info, def, Level::DEBUG, "INIT"));
        assert!(should_log(DebugLevel::Trace, def, Level::TRACE, "INIT"));
    }

    #[test]
    fn fields_collect_rank_and_extras() {
        // Drive the visitor through a real event under a local dispatcher.
        type Seen = Arc<Mutex<Vec<(Option<i64>, String)>>>;
        struct Capture(Seen);
        impl tracing::Subscriber for Capture {
            fn enabled(&self, _: &Metadata<'_>) -> bool {
                true
            }
            fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
                span::Id::from_u64(1)
            }
            fn record(&self, _: &span::Id, _: &span::Record<'_>) {}
            fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}
            fn event(&self, e: &Event<'_>) {
                let mut f = Fields::default();
                e.record(&mut f);
                self.0
                    .lock()
                    .push((f.rank, format!("{}{}", f.message, f.extra)));
            }
            fn enter(&self, _: &span::Id) {}
            fn exit(&self, _: &span::Id) {}
        }
        let seen = Arc::new(Mutex::new(Vec::new()));
        tracing::subscriber::with_default(Capture(seen.clone()), || {
            tracing::info!(target: "nccl::INIT", rank = 5, peers = 3, "connected {}", "ring");
            tracing::warn!(target: "nccl::NET", "no rank here");
        });
        let v = seen.lock();
        assert_eq!(v[0], (Some(5), "connected ring peers=3".to_string()));
        assert_eq!(v[1], (None, "no rank here".to_string()));
    }

    #[test]
    fn host_and_tid_are_sane() {
        let h = host_name();
        assert!(!h.is_empty() && !h.contains('.'));
        let a = thread_id();
        assert_eq!(a, thread_id());
        let b = std::thread::spawn(thread_id).join().unwrap();
        assert_ne!(a, b);
    }
}
