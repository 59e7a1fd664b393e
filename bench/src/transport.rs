//! What a benchmark run is, what it reports, and the transports that run
//! it. The run's types are defined in [`crate::spec`] (below the drivers)
//! and re-exported here.
//!
//! A run is a [`RunSpec`] (operation, size, depth, duration, idle policy,
//! whether to check reply bytes) handed to a [`Transport`], which returns a
//! [`RunResult`]. Dispatch through `dyn Transport` happens once per run;
//! the timed loop inside is the transport's own, monomorphised code:
//!
//! * in-process clients (RPC over RDMA over `shm`, RPC over TCP, the
//!   [`inproc`](crate::inproc) reference) implement
//!   [`RpcDriver`](crate::driver::RpcDriver) and are wrapped in
//!   [`Driven`](crate::driver::Driven), whose generic loop
//!   ([`drive`](crate::driver::drive)) keeps `depth` calls in flight,
//!   timestamps each, and records latencies into an HdrHistogram with no
//!   allocation and no dynamic dispatch per call;
//! * the libtirpc baseline ([`TirpcTransport`]) runs its loop in the C
//!   client process and reports the same figures.
//!
//! [`open`] maps a `--connect` URL (or none: the embedded default) to a
//! transport: `shm` and `roce` are [`RdmaDriver`](crate::rdma::RdmaDriver)s,
//! `tcp` a [`TcpDriver`](crate::tcp::TcpDriver), each with an embedded
//! server when the URL names no address. How to plug another one in is in
//! the [`driver`](crate::driver) module doc.

use dataplane::verbs::roce::Roce;
use dataplane::verbs::shm::Shm;

use crate::driver::Driven;
use crate::rdma::RdmaDriver;
use crate::tcp::TcpDriver;
use crate::tirpc::{self, CpuTimes, Proc, TirpcResult, TirpcServer, Workload};

// The run's types live in `spec`, below the drivers, so that this module
// (the factory) depends on the drivers and they do not depend on it. They
// are re-exported here, where callers have always found them.
pub use crate::spec::{
    fnv1a64, new_histogram, pattern_hash, record_latency, BenchError, CheckReport, Cores,
    CpuReport, Idle, LatencySummary, Op, OpenOptions, RunResult, RunSpec, Transport,
    HISTOGRAM_MAX_NS,
};

/// `transport.max_message` of an `rpcrdmad` left at its default (1 MiB of
/// data plus 4 KiB of headers): the bench cannot learn a server's limit
/// over the wire (CONF_RDMA carries inline sizes only), so an error names
/// the default and the key to raise.
pub const RPCRDMAD_DEFAULT_MAX_MESSAGE: u32 = (1 << 20) + 4096;

/// Turns the bare failure of a call that is larger than a default server
/// takes (ERR_CHUNK over RDMA, RFC 8166 s4.5; a closed connection over
/// TCP) into one line naming both sizes and the server's key. Other
/// errors, and calls within the default, pass unchanged.
pub fn explain_size_limit(err: BenchError, spec: &RunSpec) -> BenchError {
    let BenchError::Call { transport, reason } = &err else {
        return err;
    };
    let refused = reason.contains("PeerChunkError")
        || reason.contains("reset by peer")
        || reason.contains("closed");
    // ECHO's reply is as large as its call; READ's reply, WRITE's call.
    let message = u64::from(spec.size) + 256;
    if !refused || spec.op == Op::Null || message <= u64::from(RPCRDMAD_DEFAULT_MAX_MESSAGE) {
        return err;
    }
    BenchError::Call {
        transport,
        reason: format!(
            "the server refused the {} call of {} bytes ({reason}): a message of about {message} bytes \
             exceeds the server's transport.max_message ({RPCRDMAD_DEFAULT_MAX_MESSAGE} bytes \
             unless configured otherwise); raise transport.max_message in the server's \
             configuration or use a smaller --size",
            spec.op.name().to_uppercase(),
            spec.size,
        ),
    }
}

/// The transports this bench knows, for `sweep` and the help text:
/// (scheme, what it is, why it is missing or `None` when available).
pub const TRANSPORTS: &[(&str, &str, Option<&str>)] = &[
    (
        "shm",
        "RPC over RDMA over the shm soft provider (embedded server on a pinned core)",
        None,
    ),
    (
        "tcp",
        "RPC over TCP (dataplane::tcp; embedded server thread on a pinned core)",
        None,
    ),
    (
        "tirpc",
        "libtirpc over loopback TCP (rpcgen server process, C client process)",
        None,
    ),
    (
        "roce",
        "RPC over RDMA over the RoCEv2 soft provider (embedded server on a loopback address)",
        None,
    ),
    (
        "inproc",
        "the bench service called in-process, no transport (XDR + dispatch cost)",
        None,
    ),
];

/// The transport the bench uses without `--connect`: RPC over RDMA over
/// `shm`, with an embedded one-worker server on the server core.
pub fn embedded_default() -> &'static str {
    "shm"
}

/// Opens the transport `url` names, or the embedded default for `None`.
///
/// URL forms: `tirpc` / `tirpc://` (embedded libtirpc server started here),
/// `tirpc://IPV4:PORT` (a running `bench_prog_server`), `inproc`; `shm`,
/// `tcp`, `roce` (embedded servers started here) and `shm://PATH`,
/// `tcp://IP:PORT`, `roce://IP:PORT` (a running server, e.g. `rpcrdmad`).
///
/// # Errors
/// [`BenchError::BadUrl`], and the transport's set-up errors (e.g.
/// [`TirpcError::Unavailable`](crate::tirpc::TirpcError::Unavailable) without libtirpc, an embedded server that
/// cannot start).
pub fn open(url: Option<&str>, options: &OpenOptions) -> Result<Box<dyn Transport>, BenchError> {
    let url: &str = match url {
        Some(u) => u,
        None => embedded_default(),
    };
    let (scheme, rest) = match url.split_once("://") {
        Some((s, r)) => (s, r),
        None => (url, ""),
    };
    match scheme {
        "tirpc" if rest.is_empty() => Ok(Box::new(TirpcTransport::embedded(options)?)),
        "tirpc" => Ok(Box::new(TirpcTransport::connect(url, rest)?)),
        "inproc" => Ok(Box::new(crate::driver::Driven::new(
            crate::inproc::InProc::new(),
        ))),
        "shm" if rest.is_empty() => Ok(Box::new(Driven::new(RdmaDriver::<Shm>::embedded(
            "shm", options,
        )?))),
        "shm" => Ok(Box::new(Driven::new(RdmaDriver::<Shm>::connect(
            "shm", url, options,
        )))),
        "roce" if rest.is_empty() => Ok(Box::new(Driven::new(RdmaDriver::<Roce>::embedded(
            "roce", options,
        )?))),
        "roce" => Ok(Box::new(Driven::new(RdmaDriver::<Roce>::connect(
            "roce", url, options,
        )))),
        "tcp" if rest.is_empty() => Ok(Box::new(Driven::new(TcpDriver::embedded(options)?))),
        "tcp" => Ok(Box::new(Driven::new(TcpDriver::connect(url, options)?))),
        other => Err(BenchError::BadUrl {
            url: url.to_owned(),
            reason: format!(
                "unknown transport `{other}` (known: {})",
                TRANSPORTS
                    .iter()
                    .map(|t| t.0)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }),
    }
}

/// The libtirpc baseline as a [`Transport`]: each run is one C client
/// process (`bench_prog_client`). libtirpc's `clnt_call` is synchronous,
/// so depth D is D client threads, each with its own TCP connection and
/// one call outstanding; the embedded server is one process with one
/// thread serving all connections. Per-call latencies come back through
/// a samples file and go into the same HdrHistogram as every transport's.
/// `--spin` does not apply: libtirpc waits in `poll(2)`.
pub struct TirpcTransport {
    server: Option<TirpcServer>,
    host: String,
    port: u16,
    cores: Option<Cores>,
}

impl TirpcTransport {
    /// Starts a server here (pinned to `options.cores.server`).
    ///
    /// # Errors
    /// [`TirpcError`](crate::tirpc::TirpcError)s of [`TirpcServer::start_pinned`].
    pub fn embedded(options: &OpenOptions) -> Result<TirpcTransport, BenchError> {
        let server = TirpcServer::start_pinned(0, options.cores.map(|c| c.server))?;
        Ok(TirpcTransport {
            port: server.port(),
            server: Some(server),
            host: "127.0.0.1".to_owned(),
            cores: options.cores,
        })
    }

    /// Uses a running server at `host_port` (`IPV4:PORT`).
    ///
    /// # Errors
    /// [`BenchError::BadUrl`], or [`TirpcError::Unavailable`](crate::tirpc::TirpcError::Unavailable) when the
    /// client was not built.
    pub fn connect(url: &str, host_port: &str) -> Result<TirpcTransport, BenchError> {
        tirpc::binaries()?;
        let bad = |reason: &str| BenchError::BadUrl {
            url: url.to_owned(),
            reason: reason.to_owned(),
        };
        let (host, port) = host_port
            .rsplit_once(':')
            .ok_or_else(|| bad("expected tirpc://IPV4:PORT"))?;
        let port: u16 = port
            .parse()
            .ok()
            .filter(|&p| p != 0)
            .ok_or_else(|| bad("bad port"))?;
        if host.parse::<std::net::Ipv4Addr>().is_err() {
            return Err(bad("the libtirpc client takes an IPv4 address"));
        }
        Ok(TirpcTransport {
            server: None,
            host: host.to_owned(),
            port,
            cores: None,
        })
    }

    fn workload(spec: &RunSpec) -> Workload {
        let seconds = spec.duration.as_secs_f64().max(0.001);
        match spec.op {
            Op::Null | Op::Echo if spec.depth == 1 => Workload::LatFor {
                proc: if spec.op == Op::Null {
                    Proc::Null
                } else {
                    Proc::Echo
                },
                size: spec.size,
                seconds,
                warmup: u64::from(spec.warmup_calls),
            },
            Op::Null | Op::Echo => Workload::Rate {
                depth: spec.depth,
                seconds,
            },
            Op::Read => Workload::Read {
                size: spec.size,
                depth: spec.depth,
                seconds,
            },
            Op::Write => Workload::Write {
                size: spec.size,
                depth: spec.depth,
                seconds,
            },
        }
    }
}

impl Transport for TirpcTransport {
    fn name(&self) -> &'static str {
        "tirpc"
    }

    fn describe(&self) -> String {
        match &self.server {
            Some(s) => format!(
                "tirpc: libtirpc over TCP, embedded server pid {} on 127.0.0.1:{}{}",
                s.pid(),
                self.port,
                match self.cores {
                    Some(c) => format!(", server core {}, client core {}", c.server, c.client),
                    None => String::new(),
                }
            ),
            None => format!("tirpc: libtirpc over TCP to {}:{}", self.host, self.port),
        }
    }

    fn run(&mut self, spec: &RunSpec) -> Result<RunResult, BenchError> {
        if spec.op == Op::Echo && spec.depth > 1 {
            return Err(BenchError::Unsupported {
                transport: "tirpc",
                reason: "ECHO runs at depth 1 only (the C client's pipelined modes are NULL, SOURCE, SINK)".to_owned(),
            });
        }
        let workload = Self::workload(spec);
        let samples = tempfile_path("tirpc-samples");
        let options = tirpc::ClientOptions {
            host: self.host.clone(),
            samples: Some(samples.clone()),
            check: spec.check,
            core: self.cores.map(|c| c.client),
        };
        let before = self.server.as_ref().map(|s| s.cpu()).transpose()?;
        let result = tirpc::run_client_with(self.port, &workload, &options);
        let after = self.server.as_ref().map(|s| s.cpu()).transpose()?;
        let read = std::fs::read(&samples);
        let _ = std::fs::remove_file(&samples);
        let result = result?;
        let raw = read.map_err(|source| BenchError::Io {
            what: format!("reading the latency samples {}", samples.display()),
            source,
        })?;
        let mut hist = new_histogram();
        for chunk in raw.chunks_exact(8) {
            let ns = u64::from_ne_bytes(chunk.try_into().expect("8-byte chunk"));
            record_latency(&mut hist, ns);
        }
        let latency = LatencySummary::of(&hist);
        let server = before.zip(after).map(|(b, a)| a.since(b));
        let (seconds, calls, client, check) = match result {
            TirpcResult::Lat(l) => (
                l.seconds,
                l.count,
                CpuTimes {
                    user_s: l.client_user_s,
                    sys_s: l.client_sys_s,
                },
                l.check,
            ),
            TirpcResult::Rate(t) | TirpcResult::Read(t) | TirpcResult::Write(t) => (
                t.seconds,
                t.calls,
                CpuTimes {
                    user_s: t.client_user_s,
                    sys_s: t.client_sys_s,
                },
                t.check,
            ),
            TirpcResult::Verify(_) => unreachable!("no verify workload is built here"),
        };
        let check = if spec.check && matches!(spec.op, Op::Read | Op::Echo) {
            let c = check.ok_or_else(|| BenchError::Call {
                transport: "tirpc",
                reason: "the client did not report the reply check".to_owned(),
            })?;
            Some(CheckReport::new(
                c.replies,
                c.first_fnv1a64,
                c.differing,
                spec.size,
            ))
        } else {
            None
        };
        // NULL at depth > 1 ran as the C client's `rate`: the op stays NULL.
        Ok(RunResult::new(
            "tirpc", spec, seconds, calls, latency, client, server, check,
        ))
    }
}

/// A fresh path in the temporary directory, unique to this process.
pub fn tempfile_path(what: &str) -> std::path::PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    std::env::temp_dir().join(format!(
        "rpcrdma-bench-{what}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}

#[cfg(test)]
mod size_limit_tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_refused_call_past_the_default_limit_names_the_key_and_both_sizes() {
        let spec = RunSpec::new(Op::Echo, 2 << 20, 1, Duration::from_secs(1));
        let err = BenchError::Call {
            transport: "shm",
            reason: "call failed: PeerChunkError".to_owned(),
        };
        let line = explain_size_limit(err, &spec).to_string();
        assert!(line.contains("transport.max_message"), "{line}");
        assert!(line.contains(&(2u32 << 20).to_string()), "{line}");
        assert!(line.contains("1052672"), "{line}");
        assert_eq!(line.lines().count(), 1);
        // Within the default, or another failure: unchanged.
        let small = RunSpec::new(Op::Echo, 4096, 1, Duration::from_secs(1));
        let err = BenchError::Call {
            transport: "shm",
            reason: "call failed: PeerChunkError".to_owned(),
        };
        assert_eq!(
            explain_size_limit(err, &small).to_string(),
            "shm: call failed: call failed: PeerChunkError"
        );
        let other = BenchError::Call {
            transport: "tcp",
            reason: "connect 127.0.0.1:1: refused".to_owned(),
        };
        assert!(!explain_size_limit(other, &spec)
            .to_string()
            .contains("max_message"));
    }
}
