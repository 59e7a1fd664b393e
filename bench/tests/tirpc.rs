//! The libtirpc baseline peer end to end: the rpcgen-built server and client
//! over loopback TCP. Correctness is checked byte for byte; the workloads are
//! only checked to report sane, positive figures (benchmarks are never timed
//! tests; docs/TESTING.md).
//!
//! Real-peer rule: when the peer could not be built (rpcgen or libtirpc
//! missing), the tests fail under `RPCRDMA_REQUIRE_PEERS=1` and otherwise
//! print `skipped: libtirpc not installed` and pass.

use bench::tirpc::{self, Proc, TirpcResult, TirpcServer, Workload};

/// The server, or `None` (after printing the skip line) when the peer was
/// not built and peers are not required.
fn server() -> Option<TirpcServer> {
    match tirpc::binaries() {
        Ok(_) => Some(TirpcServer::start(0).expect("start the libtirpc server")),
        Err(e) if std::env::var("RPCRDMA_REQUIRE_PEERS").as_deref() == Ok("1") => {
            panic!("{e}, and RPCRDMA_REQUIRE_PEERS=1")
        }
        Err(e) => {
            println!("skipped: libtirpc not installed ({e})");
            None
        }
    }
}

#[test]
fn verify_is_byte_exact_across_sizes_and_sigterm_stops_cleanly() {
    let Some(server) = server() else { return };
    assert_ne!(server.port(), 0);
    for size in [0, 1, 4095, 4096, 4097, 65536, 1 << 20] {
        match tirpc::run_client(server.port(), &Workload::Verify { size }) {
            Ok(TirpcResult::Verify(v)) => {
                assert!(v.ok);
                assert_eq!(v.size, u64::from(size));
            }
            other => panic!("verify {size}: {other:?}"),
        }
    }
    let status = server.stop().expect("stop the server");
    assert!(status.success(), "server exit after SIGTERM: {status}");
}

#[test]
fn latency_reports_positive_percentiles() {
    let Some(server) = server() else { return };
    for (proc, size) in [(Proc::Null, 0), (Proc::Echo, 4096), (Proc::Source, 4096)] {
        let run = server
            .run(&Workload::Lat {
                proc,
                size,
                iterations: 300,
                warmup: 10,
            })
            .unwrap();
        let TirpcResult::Lat(lat) = run.result else {
            panic!("not a latency report: {:?}", run.result)
        };
        assert_eq!(lat.proc, proc.name());
        assert_eq!(lat.count, 300);
        assert_eq!(lat.size, u64::from(size));
        assert!(lat.seconds > 0.0);
        assert!(lat.min_ns > 0);
        assert!(lat.min_ns <= lat.p50_ns);
        assert!(lat.p50_ns <= lat.p90_ns);
        assert!(lat.p90_ns <= lat.p99_ns);
        assert!(lat.p99_ns <= lat.p999_ns);
        assert!(lat.p999_ns <= lat.max_ns);
        assert!(lat.mean_ns >= lat.min_ns && lat.mean_ns <= lat.max_ns);
        assert!(lat.client_cpu_s > 0.0);
        assert!(run.server_cpu.total_s() >= 0.0);
    }
    assert!(server.stderr_text().is_empty(), "{}", server.stderr_text());
}

#[test]
fn rate_read_and_write_report_positive_throughput() {
    let Some(server) = server() else { return };
    let workloads = [
        Workload::Rate {
            depth: 1,
            seconds: 0.2,
        },
        Workload::Rate {
            depth: 4,
            seconds: 0.2,
        },
        Workload::Read {
            size: 256 << 10,
            depth: 2,
            seconds: 0.2,
        },
        Workload::Write {
            size: 256 << 10,
            depth: 2,
            seconds: 0.2,
        },
        Workload::Read {
            size: 1 << 20,
            depth: 1,
            seconds: 0.2,
        },
    ];
    for w in &workloads {
        let run = server.run(w).unwrap();
        let (TirpcResult::Rate(t) | TirpcResult::Read(t) | TirpcResult::Write(t)) = &run.result
        else {
            panic!("not a throughput report: {:?}", run.result)
        };
        let (depth, size) = match *w {
            Workload::Rate { depth, .. } => (depth, 0),
            Workload::Read { depth, size, .. } | Workload::Write { depth, size, .. } => {
                (depth, size)
            }
            _ => unreachable!(),
        };
        assert_eq!(t.depth, depth, "{w:?}");
        assert_eq!(t.size, u64::from(size), "{w:?}");
        assert!(t.calls > 0, "{w:?}: {t:?}");
        assert_eq!(t.bytes, t.calls * u64::from(size));
        assert!(t.seconds > 0.0 && t.calls_per_s > 0.0, "{t:?}");
        assert_eq!(t.mb_per_s > 0.0, size > 0, "{t:?}");
        assert!(t.client_cpu_s > 0.0, "{t:?}");
        assert!(run.server_cpu.total_s() >= 0.0);
    }
}

#[test]
fn a_port_in_use_is_reported_with_the_servers_message() {
    let Some(first) = server() else { return };
    let err = TirpcServer::start(first.port()).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("bind 127.0.0.1:"), "{text}");
}

#[test]
fn a_dead_server_makes_the_client_fail_with_its_message() {
    let Some(server) = server() else { return };
    let port = server.port();
    drop(server);
    let err = tirpc::run_client(port, &Workload::Verify { size: 1 }).unwrap_err();
    assert!(
        matches!(err, tirpc::TirpcError::ClientFailed { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("connect"), "{err}");
}
