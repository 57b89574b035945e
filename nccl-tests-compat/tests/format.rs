//! Golden tests of the printed text: header, table header, rows (including the
//! number-formatting fallbacks) and footer, against strings written out from nccl-tests'
//! printf formats.

use nccl_tests_compat::args::{parse, Args, Parsed};
use nccl_tests_compat::report::{self, Half};

fn args(v: &[&str]) -> Args {
    match parse(v) {
        Parsed::Run(a) => *a,
        p => panic!("{p:?}"),
    }
}

#[test]
fn header_lines() {
    let a = args(&["-b", "8", "-e", "128M", "-f", "2"]);
    let h = report::header(&a, "all_reduce_perf", 23007, 23007);
    assert_eq!(
        h,
        "# nccl-tests version 2.19.6 nccl-headers=23007 nccl-library=23007\n\
         # Collective test starting: all_reduce_perf\n\
         # nThread 1 nGpus 1 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 1 iters: 20 agg iters: 1 validation: 1 graph: 0 unalign: 0\n\
         #\n"
    );
    let b = args(&[
        "-b", "1K", "-e", "4K", "-i", "1024", "-z", "1", "-p", "1", "-t", "2", "-g", "3",
    ]);
    let h = report::header(&b, "sendrecv_perf", 22703, 23007);
    assert!(h.contains("nccl-headers=23007 nccl-library=22703\n"));
    assert!(h.contains("# nThread 2 nGpus 3 minBytes 1024 maxBytes 4096 step: 1024(bytes) "));
    assert!(
        h.contains("# Blocking Enabled: wait for completion and barrier after each collective \n")
    );
    assert!(h.contains("# Parallel Init Enabled: threads call into NcclInitRank concurrently \n"));
    let c = args(&["-z", "2"]);
    assert!(report::header(&c, "x", 1, 1)
        .contains("# Blocking Enabled: wait for completion after each collective (no barrier) \n"));
}

#[test]
fn device_line_format() {
    let l = report::device_line(
        3,
        0,
        12345,
        "node7",
        3,
        "0000:07:00",
        "NVIDIA H100 80GB HBM3",
    );
    assert_eq!(l, "#  Rank  3 Group  0 Pid  12345 on      node7 device  3 [0000:07:00] NVIDIA H100 80GB HBM3\n");
    let v = report::parse_device_line(&l).unwrap();
    assert_eq!(v["rank"], 3);
    assert_eq!(v["hostname"], "node7");
    assert_eq!(v["device_hex"], "0000:07:00");
    assert_eq!(v["device_info"], "NVIDIA H100 80GB HBM3");
}

#[test]
fn table_header() {
    let a = Args::default();
    let want = "#\n\
#                                                              out-of-place                       in-place          \n\
#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong \n\
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)         \n";
    assert_eq!(report::table_header(&a), want);
    let c = args(&["-C", "1"]);
    assert!(report::table_header(&c).contains("    root  cputime  "));
    let s = args(&["-S", "1"]);
    let t = report::table_header(&s);
    assert!(t.contains("  #wrong           timestamp\n"), "{t}");
    assert!(t.contains(" %Y-%m-%d %H:%M:%S\n"), "{t}");
}

#[test]
fn rows_and_fallbacks() {
    assert_eq!(
        report::row_prefix(8, 2, "float", "sum", -1),
        "           8             2     float     sum      -1"
    );
    assert_eq!(
        report::row_prefix(134217728, 33554432, "bfloat16", "mulsum", 7),
        "   134217728      33554432  bfloat16  mulsum       7"
    );
    let h = Half {
        time_us: 34.671,
        algbw: 0.0002,
        busbw: 0.0003,
        wrong: Some(0),
    };
    assert_eq!(report::row_half(&h), "    34.67    0.00    0.00       0");
    let h = Half {
        time_us: 12345.6,
        algbw: 1234.56,
        busbw: 99999.0,
        wrong: Some(17),
    };
    assert_eq!(report::row_half(&h), "  12345.6  1234.6   99999      17");
    let h = Half {
        time_us: 123456.0,
        algbw: 5.0,
        busbw: 6.0,
        wrong: None,
    };
    assert_eq!(report::row_half(&h), "   123456    5.00    6.00    N/A");
    // Exponent fallbacks: 7-wide time "%.1e", 6-wide bandwidth "%.0e", #wrong "%6g".
    let h = Half {
        time_us: 12345678.0,
        algbw: 1234567.0,
        busbw: 2.5e9,
        wrong: Some(1234567),
    };
    assert_eq!(
        report::row_half(&h),
        "  1.2e+07   1e+06   2e+09  1.23457e+06"
    );
}

#[test]
fn footer_lines() {
    assert_eq!(
        report::footer(0, 123.456, None, "all_reduce_perf"),
        "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 123.456 \n#\n# Collective test concluded: all_reduce_perf\n"
    );
    let f = report::footer(3, 10.0, Some(20.0), "x");
    assert!(
        f.starts_with("# Out of bounds values : 3 FAILED\n# Avg bus bandwidth    : 10 FAILED\n")
    );
    let f = report::footer(0, 19.0, Some(20.0), "x");
    assert!(f.contains("# Avg bus bandwidth    : 19 OK\n"));
}

#[test]
fn memory_line() {
    assert_eq!(
        report::memory_line(&[("Send", 32 << 20), ("Recv", 1536)]),
        "# GPU memory usage     : Send 32.0 MB | Recv 1.50 KB | Total  32.0 MB\n"
    );
}

#[test]
fn json_schema_accepts_report_and_rejects_breakage() {
    let a = args(&["-b", "8", "-e", "16", "-f", "2"]);
    let mut j = report::JsonReport::new(
        "2026-01-01 00:00:00",
        &["all_reduce_perf".into()],
        &["A=B".into()],
        23007,
    );
    j.set_config(
        &a,
        &[report::device_line(
            0,
            0,
            1,
            "h",
            0,
            "0000:00:00",
            "host memory",
        )],
    );
    let h = Half {
        time_us: 1.0,
        algbw: 2.0,
        busbw: f64::NAN,
        wrong: Some(0),
    };
    let n = Half { wrong: None, ..h };
    j.add_result(8, 2, "float", "sum", -1, false, &h, &n, None);
    let doc = j.finish(0, 2.0, None, &[], "2026-01-01 00:00:01");
    assert_eq!(report::check_schema(&doc), Vec::<String>::new());
    assert_eq!(doc["version"], 3);
    assert_eq!(doc["results"][0]["root"], "    -1");
    assert_eq!(doc["results"][0]["out_of_place"]["bus_bw"], "nan");
    assert!(doc["results"][0]["in_place"]["nwrong"].is_null());
    assert_eq!(doc["average_bus_bandwidth"]["okay"], "unchecked");
    assert_eq!(doc["config"]["step_factor"], 2);
    assert_eq!(doc["config"]["devices"][0]["device_info"], "host memory");
    let mut broken = doc.clone();
    broken["config"]
        .as_object_mut()
        .unwrap()
        .remove("iterations");
    broken["results"][0]["size"] = serde_json::json!("8");
    broken["out_of_bounds"]["okay"] = serde_json::json!(true);
    let errs = report::check_schema(&broken);
    assert_eq!(errs.len(), 3, "{errs:?}");
}
