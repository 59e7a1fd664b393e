//! Every `rpcrdma-bench` subcommand, run for a fraction of a second with
//! `--json`: the document has the fields a reader relies on and the
//! figures are positive. Never a statement about speed.
//!
//! The workloads run over every available transport of [`transports`]:
//! `inproc` always, `tirpc` when the libtirpc peer was built (otherwise
//! `skipped: libtirpc not installed`, or a failure under
//! `RPCRDMA_REQUIRE_PEERS=1`), and `shm`, `tcp`, `roce` with their
//! embedded servers.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

mod support;

use support::{run_bench, BIN};

/// `--connect` URLs of the transports to smoke-test.
fn transports() -> Vec<&'static str> {
    let mut list = vec!["inproc", "shm", "tcp", "roce"];
    match bench::tirpc::binaries() {
        Ok(_) => list.push("tirpc"),
        Err(e) if std::env::var("RPCRDMA_REQUIRE_PEERS").as_deref() == Ok("1") => {
            panic!("{e}, and RPCRDMA_REQUIRE_PEERS=1")
        }
        Err(e) => println!("skipped: libtirpc not installed ({e})"),
    }
    list
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rpcrdma-bench-smoke-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Runs the bench with `args` plus `--json FILE`, checks it succeeded and
/// returns the document.
fn run(args: &[&str], json: &Path) -> Value {
    let mut argv = args.to_vec();
    argv.push("--no-pin");
    let (stdout, doc) = run_bench(&argv, json);
    assert!(
        stdout.contains("transp") || stdout.contains("floor"),
        "{stdout}"
    );
    doc
}

fn positive(v: &Value, field: &str) -> f64 {
    let x = v[field]
        .as_f64()
        .unwrap_or_else(|| panic!("{field} missing or not a number in {v}"));
    assert!(x > 0.0, "{field} = {x} in {v}");
    x
}

fn check_header(doc: &Value, command: &str) {
    assert_eq!(doc["tool"], "rpcrdma-bench");
    assert_eq!(doc["command"], command);
    assert!(doc["unix_time"].as_u64().unwrap() > 0);
    assert!(doc["machine"]["cpus"].as_u64().unwrap() >= 1);
}

/// The fields of one run result; `bulk` runs also move bytes.
fn check_result(r: &Value, transport: &str, op: &str, depth: u64, bulk: bool) {
    assert_eq!(r["transport"], transport, "{r}");
    assert_eq!(r["op"], op, "{r}");
    assert_eq!(r["depth"].as_u64(), Some(depth), "{r}");
    positive(r, "seconds");
    positive(r, "calls");
    positive(r, "calls_per_s");
    let lat = &r["latency"];
    for f in [
        "count", "min_ns", "mean_ns", "p50_ns", "p90_ns", "p99_ns", "p999_ns", "max_ns",
    ] {
        positive(lat, f);
    }
    let p = |f: &str| lat[f].as_u64().unwrap();
    assert!(p("min_ns") <= p("p50_ns") && p("p50_ns") <= p("p90_ns"));
    assert!(p("p90_ns") <= p("p99_ns") && p("p99_ns") <= p("p999_ns"));
    assert!(p("p999_ns") <= p("max_ns"));
    positive(&r["client_cpu"], "total_s");
    if transport == "tirpc" {
        // The embedded server is a local process: its CPU is measured (in
        // 10 ms ticks, so it may be 0 for a short run).
        assert!(r["server_cpu"]["total_s"].as_f64().unwrap() >= 0.0, "{r}");
    }
    if bulk {
        positive(r, "bytes");
        positive(r, "mb_per_s");
        positive(&r["client_cpu"], "s_per_gb");
    }
}

#[test]
fn lat_rate_read_write_report_positive_figures() {
    for t in transports() {
        let json = scratch(&format!("{t}-lat.json"));
        let doc = run(&["--connect", t, "--duration", "0.2", "lat"], &json);
        check_header(&doc, "lat");
        check_result(&doc["results"][0], t, "null", 1, false);

        let doc = run(
            &[
                "--connect",
                t,
                "--duration",
                "0.2",
                "lat",
                "--size",
                "4k",
                "--check",
            ],
            &json,
        );
        check_result(&doc["results"][0], t, "echo", 1, true);
        assert_eq!(doc["results"][0]["check"]["ok"], true);

        let json = scratch(&format!("{t}-rate.json"));
        let doc = run(
            &["--connect", t, "--duration", "0.2", "rate", "--depth", "4"],
            &json,
        );
        check_header(&doc, "rate");
        check_result(&doc["results"][0], t, "null", 4, false);

        let json = scratch(&format!("{t}-read.json"));
        let doc = run(
            &[
                "--connect",
                t,
                "--duration",
                "0.2",
                "read",
                "--size",
                "64k",
                "--depth",
                "2",
                "--check",
            ],
            &json,
        );
        check_header(&doc, "read");
        check_result(&doc["results"][0], t, "read", 2, true);
        assert_eq!(doc["results"][0]["check"]["ok"], true);

        let json = scratch(&format!("{t}-write.json"));
        let doc = run(
            &[
                "--connect",
                t,
                "--duration",
                "0.2",
                "write",
                "--size",
                "64k",
                "--depth",
                "2",
            ],
            &json,
        );
        check_header(&doc, "write");
        check_result(&doc["results"][0], t, "write", 2, true);
    }
}

#[test]
fn sweep_writes_results_for_every_point_and_plots() {
    let list = transports().join(",");
    let json = scratch("sweep.json");
    let plots = scratch("plots");
    let doc = run(
        &[
            "--duration",
            "0.05",
            "sweep",
            "--transports",
            &format!("{list},nosuch"),
            "--sizes",
            "512,4k",
            "--depths",
            "1,2",
            "--reps",
            "2",
            "--plots",
            plots.to_str().unwrap(),
        ],
        &json,
    );
    check_header(&doc, "sweep");
    let n = list.split(',').count();
    let results = doc["results"].as_array().unwrap();
    assert_eq!(
        results.len(),
        2 * n * 2 * 2 * 2,
        "rounds x transports x ops x sizes x depths"
    );
    // Every point is the median and range of its two repetitions.
    let points = doc["points"].as_array().unwrap();
    assert_eq!(points.len(), n * 2 * 2 * 2);
    for p in points {
        assert_eq!(p["reps"], 2, "{p}");
        let same = |r: &serde_json::Value| {
            r["transport"] == p["transport"]
                && r["op"] == p["op"]
                && r["size"] == p["size"]
                && r["depth"] == p["depth"]
        };
        let mut mb: Vec<f64> = results
            .iter()
            .filter(|r| same(r))
            .map(|r| r["mb_per_s"].as_f64().unwrap())
            .collect();
        mb.sort_by(f64::total_cmp);
        assert_eq!(mb.len(), 2, "{p}");
        // serde_json's float parsing may be off by an ulp: compare
        // within a relative 1e-12.
        let near = |got: &serde_json::Value, want: f64| {
            let got = got.as_f64().unwrap();
            (got - want).abs() <= 1e-12 * want.abs().max(1.0)
        };
        let spread = &p["mb_per_s"];
        assert!(near(&spread["min"], mb[0]), "{p}");
        assert!(near(&spread["max"], mb[1]), "{p}");
        assert!(near(&spread["median"], (mb[0] + mb[1]) / 2.0), "{p}");
    }
    // A transport that does not open is reported, not fatal.
    let skipped = doc["skipped"].as_array().unwrap();
    assert!(
        skipped.iter().any(|s| s["transport"] == "nosuch"),
        "{skipped:?}"
    );
    let written = doc["plots"].as_array().unwrap();
    for name in [
        "read-cpu-vs-throughput.svg",
        "write-cpu-per-gb.svg",
        "read-throughput-depth1.svg",
        "write-throughput-depth2.svg",
    ] {
        let path = plots.join(name);
        let svg = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            svg.starts_with("<svg") && svg.contains("<polyline"),
            "{name}"
        );
        assert!(written.iter().any(|w| w.as_str() == path.to_str()));
    }
    // RDMA and TCP on one set of axes: every transport is in the legend.
    let svg = std::fs::read_to_string(plots.join("read-throughput-depth1.svg")).unwrap();
    for t in list.split(',') {
        assert!(
            svg.lines().any(|l| l.trim() == t),
            "{t} missing from the figure's legend"
        );
    }
}

#[test]
fn floor_reports_ping_pongs_exchange_rate_and_memcpy_bandwidth() {
    let json = scratch("floor.json");
    let doc = run(
        &[
            "--duration",
            "0.05",
            "floor",
            "--iters",
            "2000",
            "--memcpy-size",
            "4m",
        ],
        &json,
    );
    check_header(&doc, "floor");
    let f = &doc["floor"];
    for s in ["raw_pingpong", "shm_write_pingpong", "shm_send_pingpong"] {
        positive(&f[s], "median_ns");
        positive(&f[s], "p99_ns");
        positive(&f[s], "mean_ns");
    }
    // Every one of the 2000 pipelined exchanges completed (the run would
    // have failed on its deadline otherwise), in a measured time.
    positive(f, "shm_send_exchanges_per_s");
    positive(&f["memcpy"], "best_gb_per_s");
    positive(&f["memcpy"], "mean_gb_per_s");
    positive(&f["memcpy"], "buffer_bytes");
}

#[test]
fn targets_reports_every_target_with_a_verdict() {
    let json = scratch("targets.json");
    let doc = run(
        &[
            "--duration",
            "0.1",
            "targets",
            "--iters",
            "2000",
            "--memcpy-size",
            "4m",
            "--rounds",
            "2",
        ],
        &json,
    );
    check_header(&doc, "targets");
    let t = &doc["targets"];
    positive(&t["floor"]["raw_pingpong"], "median_ns");
    positive(&t["floor"]["memcpy"], "best_gb_per_s");
    positive(&t["memcpy_working_set"], "best_gb_per_s");
    positive(&t["floor_after"]["raw_pingpong"], "median_ns");
    assert_eq!(t["memcpy_working_set"]["blocks"], 8);
    let tirpc = bench::tirpc::binaries().is_ok();
    let runs = t["runs"].as_array().expect("runs");
    // Per round: shm NULL, rate, READ spin + adaptive; tcp READ spin +
    // adaptive; roce NULL, READ spin + adaptive, tcp NULL; libtirpc NULL
    // when built.
    assert_eq!(t["rounds"], 2);
    assert_eq!(t["raw_pingpong_ns"].as_array().map(Vec::len), Some(2));
    assert_eq!(runs.len(), 2 * (10 + usize::from(tirpc)), "{runs:?}");
    for r in runs {
        positive(r, "calls_per_s");
        positive(&r["latency"], "p50_ns");
    }
    let rows = t["targets"].as_array().expect("targets");
    // Seven shm and libtirpc rows, four roce against TCP.
    assert_eq!(rows.len(), 11, "{rows:?}");
    for row in rows {
        let verdict = &row["verdict"];
        let tirpc_row = row["target"].as_str().unwrap().contains("libtirpc");
        if tirpc_row && !tirpc {
            assert_eq!(verdict, "not_measured", "{row}");
            continue;
        }
        positive(row, "measured");
        positive(row, "goal");
        // The median of one ratio per round.
        assert_eq!(row["rounds"].as_array().map(Vec::len), Some(2), "{row}");
        // Met, or missed by a factor above 1.
        assert!(
            verdict == "met" || verdict["missed"]["by"].as_f64().unwrap() > 1.0,
            "{row}"
        );
    }
}

/// `lat --gap-us` pauses between a reply and the next call: a run of
/// 0.2 s with 5 ms gaps makes at most 41 measured calls however fast the
/// transport (each call waits for the gap before it), and reports them
/// as usual.
#[test]
fn lat_with_a_gap_waits_between_calls() {
    let json = scratch("shm-gap.json");
    let doc = run(
        &[
            "--connect",
            "shm",
            "--duration",
            "0.2",
            "lat",
            "--gap-us",
            "5000",
        ],
        &json,
    );
    let r = &doc["results"][0];
    check_result(r, "shm", "null", 1, false);
    let calls = r["calls"].as_u64().unwrap();
    assert!((1..=41).contains(&calls), "{calls} calls: {r}");
}

#[test]
fn an_unknown_transport_fails_with_one_line_naming_the_known_ones() {
    let out = Command::new(BIN)
        .args(["--connect", "nosuch://x", "lat", "--duration", "0.01"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    for known in ["shm", "tcp", "roce", "tirpc", "inproc"] {
        assert!(stderr.contains(known), "{stderr}");
    }
}

#[test]
fn without_connect_the_bench_runs_rpc_over_shm() {
    let json = scratch("default.json");
    let out = Command::new(BIN)
        .args(["--duration", "0.1", "--no-pin", "lat", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.starts_with("shm: RPC over RDMA"), "{stdout}");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    check_result(&doc["results"][0], "shm", "null", 1, false);
    // The embedded worker is a thread of the bench: its CPU is measured.
    assert!(doc["results"][0]["server_cpu"]["total_s"].as_f64().unwrap() >= 0.0);
}

/// `--extensions all` over shm: the client and the embedded server offer
/// every extension, and the set the bench reports negotiated is exactly
/// what the engine advertises (the engine, not this test, says whether
/// that includes message continuation); the data still checks out.
#[test]
fn extensions_all_over_shm_negotiates_what_the_engine_advertises() {
    use dataplane::engine::{self, Connection, Extensions};
    use dataplane::extension_names::{parse_list, Names};

    let advertised = Connection::new(engine::Config {
        extensions: Extensions::ALL,
        ..engine::Config::default()
    })
    .unwrap()
    .advertised_extensions();
    let json = scratch("shm-extensions.json");
    let argv = [
        "--connect",
        "shm",
        "--extensions",
        "all",
        "--duration",
        "0.2",
        "--no-pin",
        "read",
        "--size",
        "64k",
        "--depth",
        "2",
        "--check",
    ];
    let (stdout, doc) = run_bench(&argv, &json);
    let lines: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("shm: extensions negotiated: "))
        .collect();
    assert_eq!(lines.len(), 1, "reported once:\n{stdout}");
    let names = lines[0]
        .strip_prefix("shm: extensions negotiated: ")
        .and_then(|rest| rest.split(' ').next())
        .unwrap();
    let negotiated = parse_list(names).unwrap();
    assert_eq!(negotiated, advertised, "{stdout}");
    assert_eq!(
        negotiated.contains(Extensions::MESSAGE_CONTINUATION),
        advertised.contains(Extensions::MESSAGE_CONTINUATION)
    );
    assert!(
        lines[0].contains(&format!("advertised: {})", Names(advertised))),
        "{stdout}"
    );
    assert_eq!(doc["extensions"], Names(Extensions::ALL).to_string());
    let described = doc["transports"][0].as_str().unwrap();
    assert!(
        described.ends_with(&format!("extensions negotiated: {}", Names(advertised))),
        "{described}"
    );
    let r = &doc["results"][0];
    check_result(r, "shm", "read", 2, true);
    assert_eq!(r["check"]["ok"], true, "{r}");
}

#[test]
fn an_unknown_extension_fails_naming_the_known_ones() {
    let out = Command::new(BIN)
        .args([
            "--extensions",
            "remote_invalidate,nosuch",
            "lat",
            "--duration",
            "0.01",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("unknown extension `nosuch`"), "{stderr}");
}

/// `extensions` compares plain Version One with message continuation in
/// one run: an 8 KiB ECHO (its argument and result DDP-eligible) takes
/// two round trips plain (the server pulls the argument by RDMA Read) and
/// one with continuation (call and reply in Sends); a directed READ takes
/// one either way. Counts from the client engine, not timing.
#[test]
fn extensions_compares_round_trips_with_and_without_continuation() {
    let json = scratch("extensions.json");
    let (stdout, doc) = run_bench(
        &[
            "--duration",
            "0.05",
            "--no-pin",
            "extensions",
            "--sizes",
            "8k",
            "--transports",
            "shm",
        ],
        &json,
    );
    assert!(stdout.contains("trips plain"), "{stdout}");
    check_header(&doc, "extensions");
    let rows = doc["extensions_compared"]["rows"].as_array().unwrap();
    let row = |op: &str| {
        rows.iter()
            .find(|r| r["op"] == op)
            .unwrap_or_else(|| panic!("no {op} row in {rows:?}"))
    };
    let echo = row("echo");
    assert_eq!(echo["trips_plain"].as_f64(), Some(2.0), "{echo}");
    assert_eq!(echo["trips_ext"].as_f64(), Some(1.0), "{echo}");
    assert_eq!(echo["goal_applies"], true);
    let read = row("read");
    assert_eq!(read["trips_plain"].as_f64(), Some(1.0), "{read}");
    assert_eq!(read["trips_ext"].as_f64(), Some(1.0), "{read}");
    assert!(echo["p50_plain_ns"].as_u64().unwrap() > 0);
    assert!(echo["p50_ext_ns"].as_u64().unwrap() > 0);
}
