//! The real `rpcrdmad` binary, started as a separate process, serving the
//! bench program over `shm` to `dataplane::client` (issue 5, "Show").
//!
//! Sizes 0 B .. 16 MiB, each through the paths a requester can choose
//! (RFC 5666 s3.4, s5): inline, a DDP-eligible argument moved by a read
//! chunk, a DDP-eligible result placed in a write chunk, a reply chunk,
//! and a long call (RDMA_NOMSG with a position-zero read chunk). Every
//! byte is checked. No timing assertion anywhere.
mod support;

use std::net::SocketAddr;
use std::process::{Command, Stdio};

use dataplane::client::{CallOutcome, Client, ClientConfig, ReplyTarget};
use dataplane::engine::{self, DdpItem};
use dataplane::service::bench::{self, Args};
use dataplane::verbs::roce::Roce;
use dataplane::verbs::shm::Shm;
use dataplane::verbs::Provider;
use dataplane::wire::rpc::{CallHeader, OpaqueAuth};
use dataplane::wire::xdr::Encoder;
use dataplane::worker::{EndpointConfig, IdleStrategy};
use nix::sys::signal::Signal;
use support::*;

const MIB: u32 = 1 << 20;

/// Client engine limits matching a daemon configured with
/// `max_message` and `credits`.
fn client_config(max_message: u32, calls: u32) -> ClientConfig {
    ClientConfig {
        endpoint: EndpointConfig {
            engine: engine::Config {
                inline_recv_size: 4096,
                inline_send_size: 4096,
                credits: calls,
                max_outstanding_calls: calls,
                max_call_size: max_message,
                max_reply_size: max_message,
                max_ddp_size: max_message - 4096,
                ..engine::Config::default()
            },
            ..EndpointConfig::default()
        },
        conf_rdma: true,
        idle: IdleStrategy::Adaptive {
            park_max: std::time::Duration::from_micros(200),
        },
        wait_timeout: PATIENCE,
    }
}

fn daemon_config(
    dir: &std::path::Path,
    url: &str,
    metrics: SocketAddr,
    extra: &str,
) -> std::path::PathBuf {
    write_file(
        dir,
        "serve.toml",
        &format!(
            "[[listeners]]\nurl = \"{url}\"\n\n[workers]\ncores = [0]\nidle = \"adaptive\"\n\n\
             [metrics]\naddress = \"{metrics}\"\n\n[rpcbind]\nregister = false\n\n{extra}"
        ),
    )
}

/// How a call travels.
#[derive(Debug, Clone, Copy)]
enum Path {
    /// DDP-eligible argument (read chunk when large), result into a write
    /// chunk.
    DdpBothWays,
    /// DDP-eligible argument, whole reply in a reply chunk.
    ReplyChunk,
    /// Argument not marked: a call larger than inline goes as a long call.
    LongCall,
}

/// ECHO with the argument marked DDP-eligible or not.
fn encode_echo(
    buf: &mut [u8],
    xid: u32,
    data: &[u8],
    mark: bool,
) -> Option<(usize, Option<DdpItem>)> {
    if mark {
        let e = bench::encode_call(buf, xid, Args::Echo(data)).ok()?;
        return Some((e.len, e.ddp));
    }
    let h = CallHeader::new(
        xid,
        bench::PROGRAM,
        bench::VERSION,
        1,
        OpaqueAuth::None,
        OpaqueAuth::None,
    );
    let mut enc = Encoder::new(buf);
    h.emit(&mut enc).ok()?;
    enc.put_opaque(data).ok()?;
    Some((enc.position(), None))
}

fn echo<P: Provider>(client: &mut Client<P>, data: &[u8], path: Path) {
    let target = match path {
        Path::DdpBothWays => ReplyTarget::WriteChunk {
            max_ddp: (data.len() as u32).max(4),
        },
        Path::ReplyChunk | Path::LongCall => ReplyTarget::ReplyChunk,
    };
    let mark = !matches!(path, Path::LongCall);
    let call = client
        .call(target, |xid, buf| encode_echo(buf, xid, data, mark))
        .unwrap_or_else(|e| panic!("echo {} via {path:?}: {e}", data.len()));
    let outcome = client.wait(call).expect("echo reply");
    let CallOutcome::Reply { len, ddp_len } = outcome else {
        panic!("echo {} via {path:?}: {outcome:?}", data.len());
    };
    // The path was really taken: a result larger than our inline receive
    // arrived in the write chunk, or (no write chunk) in the reply chunk.
    if data.len() > 4096 {
        match path {
            Path::DdpBothWays => assert_eq!(ddp_len, Some(data.len() as u32)),
            Path::ReplyChunk | Path::LongCall => {
                assert_eq!(ddp_len, None);
                assert!(len as usize > data.len(), "reply of {len} bytes");
            }
        }
    }
    let got = bench::decode_data_reply(client.reply(call).unwrap(), client.ddp(call))
        .unwrap_or_else(|e| panic!("echo {} via {path:?}: {e}", data.len()));
    assert!(
        got == data,
        "echo of {} bytes via {path:?} differs",
        data.len()
    );
    assert!(client.release(call));
}

fn simple_call<P: Provider>(
    client: &mut Client<P>,
    args: Args<'_>,
    target: ReplyTarget,
) -> Vec<u8> {
    let call = client
        .call(target, |xid, buf| {
            bench::encode_call(buf, xid, args)
                .ok()
                .map(|e| (e.len, e.ddp))
        })
        .expect("call");
    let CallOutcome::Reply { .. } = client.wait(call).expect("reply") else {
        panic!("{args:?} failed");
    };
    let out = match args {
        Args::Null | Args::Sink(_) => {
            bench::decode_void_reply(client.reply(call).unwrap()).expect("void reply");
            Vec::new()
        }
        _ => bench::decode_data_reply(client.reply(call).unwrap(), client.ddp(call))
            .expect("data reply")
            .to_vec(),
    };
    assert!(client.release(call));
    out
}

fn metric(body: &str, name: &str) -> u64 {
    body.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

fn promtool_accepts(body: &str) {
    let Some(promtool) = require_peer("promtool") else {
        return;
    };
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn bench_program_over_shm_every_size_and_path() {
    let dir = scratch_dir("serve-sizes");
    let url = format!("shm://{}/d.sock", dir.display());
    every_size_and_path::<Shm>(&dir, &url, "127.0.0.1:19481".parse().unwrap());
    assert!(!std::path::Path::new(&format!("{}/d.sock", dir.display())).exists());
    let _ = std::fs::remove_dir_all(dir);
}

/// The same over RoCEv2 on loopback: the daemon's listener binds UDP
/// 127.0.0.25:4791, this test process connects from its own loopback alias
/// (docs/ROCE.md, "Addressing").
#[test]
fn bench_program_over_roce_every_size_and_path() {
    let dir = scratch_dir("serve-roce");
    every_size_and_path::<Roce>(
        &dir,
        "roce://127.0.0.25:20251",
        "127.0.0.1:19483".parse().unwrap(),
    );
    let _ = std::fs::remove_dir_all(dir);
}

fn every_size_and_path<P: Provider>(dir: &std::path::Path, url: &str, metrics: SocketAddr) {
    let max_message = 16 * MIB + 4096;
    let cfg = daemon_config(
        dir,
        url,
        metrics,
        &format!("[transport]\ncredits = 4\nmax_message = {max_message}\n"),
    );
    let mut d = Daemon::spawn(&["--config", cfg.to_str().unwrap()]);
    d.wait_for_line("started");

    let mut client = Client::<P>::connect(url, client_config(max_message, 4)).expect("connect");
    // CONF_RDMA (RFC 5666 s6) ran at connect: the server's limits.
    let conf = client.conf_rdma_reply().expect("CONF_RDMA reply");
    assert_eq!(conf.maxcall_sendsize, 4096);
    assert!(conf.align >= 4 && conf.align.is_power_of_two(), "{conf:?}");
    assert_eq!(conf.maxrdmaread, 16);

    simple_call(&mut client, Args::Null, ReplyTarget::Inline);
    let sizes = [0usize, 1, 1024, 4096, 64 << 10, 1 << 20, 16 << 20];
    for &size in &sizes {
        let data: Vec<u8> = (0..size)
            .map(|i| (i.wrapping_mul(7) ^ (i >> 8)) as u8)
            .collect();
        for path in [Path::DdpBothWays, Path::ReplyChunk, Path::LongCall] {
            echo(&mut client, &data, path);
        }
    }
    // SOURCE into a write chunk, and inline; SINK from a read chunk.
    for n in [0u32, 100, 4095, 4097, MIB] {
        let got = simple_call(
            &mut client,
            Args::Source(n),
            ReplyTarget::WriteChunk { max_ddp: n.max(4) },
        );
        assert_eq!(got.len(), n as usize);
        assert_eq!(bench::pattern_mismatch(&got), None, "source {n}");
    }
    let got = simple_call(&mut client, Args::Source(1000), ReplyTarget::Inline);
    assert_eq!(bench::pattern_mismatch(&got), None);
    simple_call(
        &mut client,
        Args::Sink(&vec![5u8; MIB as usize]),
        ReplyTarget::Inline,
    );

    // The counters moved, and promtool accepts the exposition.
    let (status, body) = http_get(metrics, "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK");
    let rpcs = metric(&body, "rpcrdma_worker_rpcs_total");
    assert!(
        rpcs >= 1 + 3 * sizes.len() as u64 + 7,
        "rpcs {rpcs}:\n{body}"
    );
    assert!(
        metric(&body, "rpcrdma_worker_bytes_total") > 3 * (16 << 20),
        "{body}"
    );
    assert_eq!(
        metric(&body, "rpcrdma_listener_connections_total"),
        1,
        "{body}"
    );
    assert_eq!(metric(&body, "rpcrdma_listener_connections{"), 1, "{body}");
    promtool_accepts(&body);

    drop(client);
    d.signal(Signal::SIGTERM);
    assert_eq!(d.wait().code(), Some(0), "{}", d.stderr());
    assert!(
        d.stderr().contains("every pool back to full"),
        "{}",
        d.stderr()
    );
}

#[test]
fn sixty_four_concurrent_clients() {
    let dir = scratch_dir("serve-64");
    let metrics: SocketAddr = "127.0.0.1:19482".parse().unwrap();
    let max_message = (64 << 10) + 4096;
    let url = format!("shm://{}/d.sock", dir.display());
    let cfg = daemon_config(
        &dir,
        &url,
        metrics,
        &format!("[transport]\ncredits = 8\nmax_message = {max_message}\n"),
    );
    let mut d = Daemon::spawn(&["--config", cfg.to_str().unwrap()]);
    d.wait_for_line("started");

    let threads: Vec<_> = (0..64u32)
        .map(|t| {
            let url = url.clone();
            std::thread::spawn(move || {
                let mut c = Client::<Shm>::connect(&url, client_config(max_message, 4))
                    .unwrap_or_else(|e| panic!("client {t}: {e}"));
                for round in 0..8u32 {
                    let size = ((t * 977 + round * 3001) % (40 << 10)) as usize;
                    let data: Vec<u8> = (0..size).map(|i| (i as u32 ^ t) as u8).collect();
                    echo(&mut c, &data, Path::DdpBothWays);
                }
            })
        })
        .collect();
    for (t, h) in threads.into_iter().enumerate() {
        h.join().unwrap_or_else(|_| panic!("client {t} failed"));
    }

    let (_, body) = http_get(metrics, "/metrics");
    assert_eq!(
        metric(&body, "rpcrdma_listener_connections_total"),
        64,
        "{body}"
    );
    assert!(
        metric(&body, "rpcrdma_worker_rpcs_total") >= 64 * 8,
        "{body}"
    );

    d.signal(Signal::SIGTERM);
    assert_eq!(d.wait().code(), Some(0), "{}", d.stderr());
    assert!(
        d.stderr().contains("every pool back to full"),
        "{}",
        d.stderr()
    );
    let _ = std::fs::remove_dir_all(dir);
}
