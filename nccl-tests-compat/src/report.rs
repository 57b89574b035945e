//! The text nccl-tests prints (header, device lines, table header, rows, footer) and the
//! JSON report (-J). Pure string building; the engine writes them out.

use serde_json::{json, Map, Value};

use crate::args::Args;
use crate::cfmt::{c_g, fit};

/// The nccl-tests version whose interface and output this suite reproduces.
pub const TESTS_VERSION: &str = "2.19.6";
/// `"version"` of the JSON report.
pub const JSON_VERSION: i64 = 3;

/// The lines printed before the device list (each ends with '\n').
pub fn header(args: &Args, program: &str, lib_version: i32, headers_version: i32) -> String {
    let mut s = format!("# nccl-tests version {TESTS_VERSION} nccl-headers={headers_version} nccl-library={lib_version}\n");
    s += &format!("# Collective test starting: {program}\n");
    let (step, kind) = if args.step_factor > 1 {
        (args.step_factor, "factor")
    } else {
        (args.step_bytes, "bytes")
    };
    s += &format!(
        "# nThread {} nGpus {} minBytes {} maxBytes {} step: {}({}) warmup iters: {} iters: {} agg iters: {} validation: {} graph: {} unalign: {}\n",
        args.nthreads,
        args.ngpus,
        args.min_bytes,
        args.max_bytes,
        step,
        kind,
        args.warmup_iters,
        args.iters,
        args.agg_iters,
        args.check,
        args.cudagraph,
        args.unalign
    );
    if args.blocking == 1 || args.blocking == 3 {
        s += "# Blocking Enabled: wait for completion and barrier after each collective \n";
    }
    if args.blocking == 2 {
        s += "# Blocking Enabled: wait for completion after each collective (no barrier) \n";
    }
    if args.per_iter_timing != 0 {
        s += "# Per-Iteration Report: host wall-clock timing; i_* uses max over process rows \n";
    }
    if args.parallel_init != 0 {
        s += "# Parallel Init Enabled: threads call into NcclInitRank concurrently \n";
    }
    s += "#\n";
    s
}

/// One "Using devices" line (with '\n').
pub fn device_line(
    rank: usize,
    group: i32,
    pid: u32,
    host: &str,
    device: i32,
    pci: &str,
    info: &str,
) -> String {
    format!("#  Rank {rank:2} Group {group:2} Pid {pid:6} on {host:>10} device {device:2} [{pci}] {info}\n")
}

/// Parses a device line back into its fields (for the JSON "devices" list).
pub fn parse_device_line(line: &str) -> Option<Value> {
    let rest = line.strip_prefix("#  Rank ")?;
    let mut it = rest.split_whitespace();
    let rank: i64 = it.next()?.parse().ok()?;
    (it.next()? == "Group").then_some(())?;
    let group: i64 = it.next()?.parse().ok()?;
    (it.next()? == "Pid").then_some(())?;
    let pid: i64 = it.next()?.parse().ok()?;
    (it.next()? == "on").then_some(())?;
    let host = it.next()?.to_string();
    (it.next()? == "device").then_some(())?;
    let device: i64 = it.next()?.parse().ok()?;
    let hex = it
        .next()?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let info: Vec<&str> = it.collect();
    Some(json!({
        "rank": rank, "group": group, "pid": pid, "hostname": host,
        "device": device, "device_hex": hex, "device_info": info.join(" "),
    }))
}

/// The three table header lines.
pub fn table_header(args: &Args) -> String {
    let time = if args.report_cputime != 0 {
        "cputime"
    } else {
        "time"
    };
    let (ts_lbl, ts_fmt) = if args.report_timestamps != 0 {
        ("timestamp", "%Y-%m-%d %H:%M:%S")
    } else {
        ("", "")
    };
    let tw = if args.report_timestamps != 0 { 19 } else { 0 };
    let mut s = String::from("#\n");
    if args.per_iter_timing != 0 {
        s += &format!("# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}              out-of-place (+ per-iteration)                                in-place (+ per-iteration)\n", "", "", "", "", "");
        let names = [
            "size", "count", "type", "redop", "root", time, "algbw", "busbw", "#wrong", "i_min",
            "i_max", "i_p99", "i_cv%", time, "algbw", "busbw", "#wrong", "i_min", "i_max", "i_p99",
            "i_cv%",
        ];
        let units = [
            "(B)",
            "(elements)",
            "",
            "",
            "",
            "(us)",
            "(GB/s)",
            "(GB/s)",
            "",
            "(us)",
            "(us)",
            "(us)",
            "(%)",
            "(us)",
            "(GB/s)",
            "(GB/s)",
            "",
            "(us)",
            "(us)",
            "(us)",
            "(%)",
        ];
        let widths = [
            10, 12, 8, 6, 6, 7, 6, 6, 6, 7, 7, 7, 7, 7, 6, 6, 6, 7, 7, 7, 7,
        ];
        for (cols, tail) in [(names, ts_lbl), (units, ts_fmt)] {
            let body: Vec<String> = cols
                .iter()
                .zip(widths)
                .map(|(c, w)| format!("{c:>w$}"))
                .collect();
            s += &format!("# {} {tail:>tw$}\n", body.join("  "));
        }
    } else {
        s += &format!("# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}           out-of-place                       in-place          \n", "", "", "", "", "");
        s += &format!(
            "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6} {ts_lbl:>tw$}\n",
            "size", "count", "type", "redop", "root", time, "algbw", "busbw", "#wrong", time, "algbw", "busbw", "#wrong"
        );
        s += &format!(
            "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6} {ts_fmt:>tw$}\n",
            "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""
        );
    }
    s
}

/// The start of a row: size, count, type, redop, root.
pub fn row_prefix(bytes: u64, count: u64, type_name: &str, op_name: &str, root: i64) -> String {
    let root_s = format!("{root:6}");
    format!("{bytes:12}  {count:12}  {type_name:>8}  {op_name:>6}  {root_s:>6}")
}

/// One placement's measurement.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Half {
    /// Microseconds.
    pub time_us: f64,
    /// GB/s.
    pub algbw: f64,
    /// GB/s.
    pub busbw: f64,
    /// Wrong elements summed over ranks; None when not checked (-c 0).
    pub wrong: Option<u64>,
}

/// Per-iteration statistics (-I), microseconds and percent.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct IterStats {
    /// Minimum.
    pub min: f64,
    /// Maximum.
    pub max: f64,
    /// Mean.
    pub avg: f64,
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Standard deviation.
    pub stdev: f64,
}

impl IterStats {
    /// Statistics of `times` (microseconds); None when empty.
    pub fn of(times: &[f64]) -> Option<IterStats> {
        if times.is_empty() {
            return None;
        }
        let mut v = times.to_vec();
        v.sort_by(|a, b| a.total_cmp(b));
        let n = v.len();
        let pct = |p: usize| v[((n * p).div_ceil(100)).saturating_sub(1).min(n - 1)];
        let avg = v.iter().sum::<f64>() / n as f64;
        let var = v.iter().map(|x| (x - avg) * (x - avg)).sum::<f64>() / n as f64;
        Some(IterStats {
            min: v[0],
            max: v[n - 1],
            avg,
            p50: v[n / 2],
            p95: pct(95),
            p99: pct(99),
            stdev: var.sqrt(),
        })
    }

    /// Coefficient of variation in percent.
    pub fn cv_pct(&self) -> f64 {
        if self.avg > 0.0 {
            self.stdev / self.avg * 100.0
        } else {
            0.0
        }
    }
}

/// One placement's columns: "  time  algbw  busbw  #wrong".
pub fn row_half(h: &Half) -> String {
    let t = fit(h.time_us, 7);
    let a = fit(h.algbw, 6);
    let b = fit(h.busbw, 6);
    match h.wrong {
        Some(w) => format!("  {t}  {a}  {b}  {:>6}", c_g(w as f64)),
        None => format!("  {t}  {a}  {b}    N/A"),
    }
}

/// The per-iteration columns (-I).
pub fn row_iter_stats(s: &IterStats) -> String {
    format!(
        "  {}  {}  {}  {}",
        fit(s.min, 7),
        fit(s.max, 7),
        fit(s.p99, 7),
        fit(s.cv_pct(), 7)
    )
}

/// The footer lines (each ends with '\n'); `min_bw` is NCCL_TESTS_MIN_BW if set.
pub fn footer(oob: u64, avg_bw: f64, min_bw: Option<f64>, program: &str) -> String {
    let status = match min_bw {
        None => "",
        Some(m) if avg_bw < m * 0.9 => "FAILED",
        Some(_) => "OK",
    };
    let mut s = format!(
        "# {:<20} : {} {}\n",
        "Out of bounds values",
        oob,
        if oob != 0 { "FAILED" } else { "OK" }
    );
    s += &format!(
        "# {:<20} : {} {}\n",
        "Avg bus bandwidth",
        c_g(avg_bw),
        status
    );
    s += "#\n";
    s += &format!("# Collective test concluded: {program}\n");
    s
}

/// `"# GPU memory usage : ..."` (-M), nccl-tests' unit and precision rules.
pub fn memory_line(items: &[(&str, u64)]) -> String {
    fn mem(amount: f64) -> String {
        let (v, unit) = if amount >= 1024.0 * 1024.0 * 1024.0 {
            (amount / (1024.0 * 1024.0 * 1024.0), " GB")
        } else if amount >= 1024.0 * 1024.0 {
            (amount / (1024.0 * 1024.0), " MB")
        } else if amount >= 1024.0 {
            (amount / 1024.0, " KB")
        } else {
            (amount, " B")
        };
        let prec = if v < 10.0 {
            2
        } else if v < 100.0 {
            1
        } else {
            0
        };
        format!("{v:.prec$}{unit}")
    }
    let mut body = String::new();
    let mut total = 0u64;
    for (k, (name, amount)) in items.iter().enumerate() {
        body += &format!("{name} {} ", mem(*amount as f64));
        if k + 1 < items.len() {
            body += "| ";
        }
        total += amount;
    }
    body += &format!("| Total  {}", mem(total as f64));
    format!("# {:<20} : {body}\n", "GPU memory usage")
}

/// A JSON number the way nccl-tests writes doubles ("nan" as a string).
pub fn jnum(v: f64) -> Value {
    if v.is_nan() {
        Value::String("nan".into())
    } else {
        serde_json::Number::from_f64(v)
            .map(Value::Number)
            .unwrap_or(Value::Null)
    }
}

fn jbool(b: bool) -> Value {
    Value::String(if b { "true" } else { "false" }.into())
}

/// The JSON document, built up while the test runs.
#[derive(Clone, Debug)]
pub struct JsonReport {
    root: Map<String, Value>,
    results: Vec<Value>,
}

impl JsonReport {
    /// Starts the document: version, start time, argv, environment, library version.
    pub fn new(start_time: &str, argv: &[String], env: &[String], nccl_version: i32) -> JsonReport {
        let mut root = Map::new();
        root.insert("version".into(), json!(JSON_VERSION));
        root.insert("start_time".into(), json!(start_time));
        root.insert("args".into(), json!(argv));
        root.insert("env".into(), json!(env));
        root.insert("nccl_version".into(), json!(nccl_version));
        JsonReport {
            root,
            results: Vec::new(),
        }
    }

    /// The "config" object, devices parsed from the printed device lines.
    pub fn set_config(&mut self, args: &Args, device_lines: &[String]) {
        let mut c = Map::new();
        c.insert("nthreads".into(), json!(args.nthreads));
        c.insert("ngpus".into(), json!(args.ngpus));
        c.insert("minimum_bytes".into(), json!(args.min_bytes));
        c.insert("maximum_bytes".into(), json!(args.max_bytes));
        if args.step_factor > 1 {
            c.insert("step_factor".into(), json!(args.step_factor));
        } else {
            c.insert("step_bytes".into(), json!(args.step_bytes));
        }
        c.insert("warmup_iters".into(), json!(args.warmup_iters));
        c.insert("iterations".into(), json!(args.iters));
        c.insert("aggregated_iterations".into(), json!(args.agg_iters));
        c.insert("validation".into(), json!(args.check));
        c.insert("graph".into(), json!(args.cudagraph));
        c.insert("blocking_collectives".into(), jbool(args.blocking != 0));
        c.insert("parallel_init".into(), jbool(args.parallel_init != 0));
        let devices: Vec<Value> = device_lines
            .iter()
            .filter_map(|l| parse_device_line(l))
            .collect();
        c.insert("devices".into(), Value::Array(devices));
        self.root.insert("config".into(), Value::Object(c));
    }

    /// Adds one table row.
    #[allow(clippy::too_many_arguments)]
    pub fn add_result(
        &mut self,
        bytes: u64,
        count: u64,
        type_name: &str,
        op_name: &str,
        root: i64,
        cputime: bool,
        oop: &Half,
        ip: &Half,
        iter_stats: Option<(IterStats, IterStats)>,
    ) {
        let half = |h: &Half| {
            let mut m = Map::new();
            m.insert(
                if cputime { "cpu_time" } else { "time" }.into(),
                jnum(h.time_us),
            );
            m.insert("alg_bw".into(), jnum(h.algbw));
            m.insert("bus_bw".into(), jnum(h.busbw));
            m.insert(
                "nwrong".into(),
                h.wrong.map(|w| jnum(w as f64)).unwrap_or(Value::Null),
            );
            Value::Object(m)
        };
        let mut r = Map::new();
        r.insert("size".into(), json!(bytes));
        r.insert("count".into(), json!(count));
        r.insert("type".into(), json!(type_name));
        r.insert("redop".into(), json!(op_name));
        r.insert("root".into(), json!(format!("{root:6}")));
        r.insert("out_of_place".into(), half(oop));
        r.insert("in_place".into(), half(ip));
        if let Some((a, b)) = iter_stats {
            let st = |s: &IterStats| {
                json!({"min_us": jnum(s.min), "max_us": jnum(s.max), "avg_us": jnum(s.avg), "p50_us": jnum(s.p50),
                       "p95_us": jnum(s.p95), "p99_us": jnum(s.p99), "stdev_us": jnum(s.stdev), "cv_pct": jnum(s.cv_pct())})
            };
            r.insert("out_of_place_per_iter".into(), st(&a));
            r.insert("in_place_per_iter".into(), st(&b));
        }
        self.results.push(Value::Object(r));
    }

    /// Finishes the document.
    pub fn finish(
        mut self,
        oob: u64,
        avg_bw: f64,
        min_bw: Option<f64>,
        errors: &[String],
        end_time: &str,
    ) -> Value {
        self.root
            .insert("results".into(), Value::Array(self.results));
        self.root.insert(
            "out_of_bounds".into(),
            json!({"count": oob, "okay": jbool(oob == 0)}),
        );
        let okay = match min_bw {
            None => Value::String("unchecked".into()),
            Some(m) => jbool(avg_bw >= m * 0.9),
        };
        self.root.insert(
            "average_bus_bandwidth".into(),
            json!({"bandwidth": jnum(avg_bw), "okay": okay}),
        );
        self.root.insert("errors".into(), json!(errors));
        self.root.insert("end_time".into(), json!(end_time));
        Value::Object(self.root)
    }
}

/// Structural check of a report against the documented schema: every key present with
/// the right JSON type. Returns the problems found (empty = valid).
pub fn check_schema(doc: &Value) -> Vec<String> {
    fn need(errs: &mut Vec<String>, v: &Value, path: &str, key: &str, ok: fn(&Value) -> bool) {
        match v.get(key) {
            None => errs.push(format!("{path}.{key} missing")),
            Some(x) if !ok(x) => errs.push(format!("{path}.{key} has the wrong type: {x}")),
            _ => {}
        }
    }
    let mut errs = Vec::new();
    let int = |v: &Value| v.is_i64() || v.is_u64();
    let num = |v: &Value| v.is_number() || v.as_str() == Some("nan");
    let string = |v: &Value| v.is_string();
    let boolstr = |v: &Value| matches!(v.as_str(), Some("true") | Some("false"));
    let strs = |v: &Value| {
        v.as_array()
            .is_some_and(|a| a.iter().all(|x| x.is_string()))
    };
    need(&mut errs, doc, "$", "version", int);
    need(&mut errs, doc, "$", "start_time", string);
    need(&mut errs, doc, "$", "end_time", string);
    need(&mut errs, doc, "$", "args", strs);
    need(&mut errs, doc, "$", "env", strs);
    need(&mut errs, doc, "$", "nccl_version", int);
    need(&mut errs, doc, "$", "errors", strs);
    need(&mut errs, doc, "$", "config", |v| v.is_object());
    need(&mut errs, doc, "$", "results", |v| v.is_array());
    need(&mut errs, doc, "$", "out_of_bounds", |v| v.is_object());
    need(&mut errs, doc, "$", "average_bus_bandwidth", |v| {
        v.is_object()
    });
    if let Some(c) = doc.get("config") {
        for k in [
            "nthreads",
            "ngpus",
            "minimum_bytes",
            "maximum_bytes",
            "warmup_iters",
            "iterations",
            "aggregated_iterations",
            "validation",
            "graph",
        ] {
            need(&mut errs, c, "$.config", k, int);
        }
        if c.get("step_factor").is_none() && c.get("step_bytes").is_none() {
            errs.push("$.config needs step_factor or step_bytes".into());
        }
        need(&mut errs, c, "$.config", "blocking_collectives", boolstr);
        need(&mut errs, c, "$.config", "parallel_init", boolstr);
        need(&mut errs, c, "$.config", "devices", |v| v.is_array());
        for (i, d) in c
            .get("devices")
            .and_then(|d| d.as_array())
            .into_iter()
            .flatten()
            .enumerate()
        {
            let p = format!("$.config.devices[{i}]");
            for k in ["rank", "group", "pid", "device"] {
                need(&mut errs, d, &p, k, int);
            }
            for k in ["hostname", "device_hex", "device_info"] {
                need(&mut errs, d, &p, k, string);
            }
        }
    }
    for (i, r) in doc
        .get("results")
        .and_then(|d| d.as_array())
        .into_iter()
        .flatten()
        .enumerate()
    {
        let p = format!("$.results[{i}]");
        need(&mut errs, r, &p, "size", int);
        need(&mut errs, r, &p, "count", int);
        need(&mut errs, r, &p, "type", string);
        need(&mut errs, r, &p, "redop", string);
        need(&mut errs, r, &p, "root", string);
        for place in ["out_of_place", "in_place"] {
            need(&mut errs, r, &p, place, |v| v.is_object());
            if let Some(h) = r.get(place) {
                let hp = format!("{p}.{place}");
                if h.get("time").is_none() && h.get("cpu_time").is_none() {
                    errs.push(format!("{hp}.time missing"));
                }
                need(&mut errs, h, &hp, "alg_bw", num);
                need(&mut errs, h, &hp, "bus_bw", num);
                need(&mut errs, h, &hp, "nwrong", |v| {
                    v.is_null() || v.is_number()
                });
            }
        }
    }
    if let Some(o) = doc.get("out_of_bounds") {
        need(&mut errs, o, "$.out_of_bounds", "count", int);
        need(&mut errs, o, "$.out_of_bounds", "okay", boolstr);
    }
    if let Some(o) = doc.get("average_bus_bandwidth") {
        need(&mut errs, o, "$.average_bus_bandwidth", "bandwidth", num);
        need(&mut errs, o, "$.average_bus_bandwidth", "okay", |v| {
            matches!(v.as_str(), Some("true" | "false" | "unchecked"))
        });
    }
    errs
}
