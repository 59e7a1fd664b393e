//! A worker pool on the `shm` provider with an acceptor thread, the bench
//! program as a local test service, and client helpers (shared by
//! `worker_shm.rs` and `worker_alloc.rs`).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use dataplane::client::{CallOutcome, Client, ClientConfig, ReplyTarget};
use dataplane::engine::{self, DdpItem};
use dataplane::service::ServiceTable;
use dataplane::verbs::shm::Shm;
use dataplane::verbs::Context;
use dataplane::wire::rpc::{CallHeader, OpaqueAuth, ReplyHeader};
use dataplane::wire::xdr::{Decoder, Encoder};
use dataplane::worker::{
    Dispatcher, EndpointConfig, IdleStrategy, PoolProvider, ShutdownReport, WorkerConfig,
    WorkerPool,
};

pub const BENCH_PROGRAM: u32 = dataplane::service::bench::PROGRAM;
pub const NULL: u32 = 0;
pub const ECHO: u32 = 1;
pub const SINK: u32 = 2;
pub const SOURCE: u32 = 3;

/// The daemon's service table (the bench program), as workers run it.
pub fn bench_service() -> Arc<dyn Dispatcher> {
    Arc::new(ServiceTable::builtin())
}

/// Encodes a bench call; unlike `service::bench::encode_call` it can leave
/// the argument unmarked (`Arg::Opaque(_, false)`), which makes a call too
/// large for inline go as a long call (RFC 5666 s5.1).
pub fn encode_call(
    xid: u32,
    proc_: u32,
    arg: Arg<'_>,
    buf: &mut [u8],
) -> Option<(usize, Option<DdpItem>)> {
    let h = CallHeader::new(
        xid,
        BENCH_PROGRAM,
        1,
        proc_,
        OpaqueAuth::None,
        OpaqueAuth::None,
    );
    let mut e = Encoder::new(buf);
    h.emit(&mut e).ok()?;
    let ddp = match arg {
        Arg::None => None,
        Arg::Opaque(p, ddp) => {
            let off = e.position() as u32 + 4;
            e.put_opaque(p).ok()?;
            ddp.then_some(DdpItem {
                offset: off,
                len: p.len() as u32,
            })
        }
        Arg::U32(v) => {
            e.put_u32(v).ok()?;
            None
        }
    };
    Some((e.position(), ddp))
}

#[derive(Clone, Copy)]
pub enum Arg<'a> {
    None,
    /// Payload, and whether it is marked DDP-eligible.
    Opaque(&'a [u8], bool),
    U32(u32),
}

pub fn decode_opaque_reply(reply: &[u8]) -> Vec<u8> {
    let (_, hl) = ReplyHeader::parse(reply).expect("reply header");
    Decoder::new(&reply[hl..])
        .get_opaque(usize::MAX)
        .expect("opaque result")
        .to_vec()
}

static NEXT_SOCK: AtomicUsize = AtomicUsize::new(0);

pub fn sock_url() -> String {
    let n = NEXT_SOCK.fetch_add(1, Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!(
        "rpcrdma-worker-test-{}-{n}.sock",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);
    format!("shm://{}", path.display())
}

pub fn adaptive() -> IdleStrategy {
    IdleStrategy::Adaptive {
        park_max: Duration::from_micros(200),
    }
}

/// Engine limits shared by server and client.
pub fn engine_config(max_msg: u32, credits: u32) -> engine::Config {
    engine::Config {
        inline_recv_size: 4096,
        inline_send_size: 4096,
        credits,
        max_outstanding_calls: credits,
        max_call_size: max_msg + 1024,
        max_reply_size: max_msg + 1024,
        max_ddp_size: max_msg,
        ..engine::Config::default()
    }
}

pub fn client_config(engine: engine::Config) -> ClientConfig {
    ClientConfig {
        endpoint: EndpointConfig {
            engine,
            ..EndpointConfig::default()
        },
        conf_rdma: false,
        extensions: dataplane::engine::Extensions::EMPTY,
        idle: adaptive(),
        wait_timeout: Duration::from_secs(60),
    }
}

/// A worker pool and an acceptor thread: `shm` on a fresh socket
/// (`start*`), or any provider at a given URL (`at`).
pub struct Server<P: PoolProvider = Shm> {
    pub url: String,
    pool: Option<Arc<WorkerPool<P>>>,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
}

impl Server<Shm> {
    pub fn start(workers: usize, engine: engine::Config) -> Server {
        Server::with_dispatcher(workers, engine, bench_service())
    }

    pub fn start_with(
        workers: usize,
        engine: engine::Config,
        tweak: impl FnOnce(&mut WorkerConfig),
    ) -> Server {
        Server::build(workers, engine, bench_service(), tweak)
    }

    pub fn with_dispatcher(
        workers: usize,
        engine: engine::Config,
        dispatcher: Arc<dyn Dispatcher>,
    ) -> Server {
        Server::build(workers, engine, dispatcher, |_| {})
    }

    fn build(
        workers: usize,
        engine: engine::Config,
        dispatcher: Arc<dyn Dispatcher>,
        tweak: impl FnOnce(&mut WorkerConfig),
    ) -> Server {
        Server::at(sock_url(), workers, engine, dispatcher, tweak)
    }
}

impl<P: PoolProvider> Server<P> {
    /// A pool of provider `P` listening at `url`.
    pub fn at(
        url: String,
        workers: usize,
        engine: engine::Config,
        dispatcher: Arc<dyn Dispatcher>,
        tweak: impl FnOnce(&mut WorkerConfig),
    ) -> Server<P> {
        let ctx = Arc::new(P::open(&url).unwrap());
        let listener = ctx.listen(&url).unwrap();
        let mut config = WorkerConfig {
            endpoint: EndpointConfig {
                engine,
                ..EndpointConfig::default()
            },
            idle: adaptive(),
            ..WorkerConfig::default()
        };
        tweak(&mut config);
        // Pin to cores this process may use (the pinning path is tested
        // too); fall back to unpinned when the mask is unknown.
        let allowed: Vec<usize> = core_affinity_ids();
        let cores: Vec<Option<usize>> = (0..workers)
            .map(|i| allowed.get(i % allowed.len().max(1)).copied())
            .collect();
        let pool = Arc::new(WorkerPool::<P>::spawn(ctx, &cores, config, dispatcher).unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let acceptor = {
            let (pool, stop) = (pool.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match pool.accept(&listener, Duration::from_millis(20)) {
                        Ok(_) => {}
                        Err(dataplane::worker::WorkerError::Verbs(
                            dataplane::verbs::VerbsError::Timeout,
                        )) => {}
                        Err(e) => eprintln!("accept: {e}"),
                    }
                }
            })
        };
        Server {
            url,
            pool: Some(pool),
            stop,
            acceptor: Some(acceptor),
        }
    }

    pub fn pool(&self) -> &WorkerPool<P> {
        self.pool.as_ref().unwrap()
    }

    pub fn stop(mut self, grace: Duration) -> ShutdownReport {
        self.stop.store(true, Ordering::Relaxed);
        self.acceptor.take().unwrap().join().unwrap();
        let pool = Arc::try_unwrap(self.pool.take().unwrap()).expect("pool still shared");
        pool.stop(grace)
    }
}

pub fn core_affinity_ids() -> Vec<usize> {
    // The same view the pool checks against.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Cpus_allowed_list:"))
                .map(|l| parse_cpu_list(l.split(':').nth(1).unwrap_or("").trim()))
        })
        .unwrap_or_default()
}

pub fn parse_cpu_list(s: &str) -> Vec<usize> {
    let mut out = Vec::new();
    for part in s.split(',') {
        let mut it = part.split('-');
        let (Some(a), b) = (it.next(), it.next()) else {
            continue;
        };
        let Ok(a) = a.trim().parse::<usize>() else {
            continue;
        };
        let b = b.and_then(|b| b.trim().parse().ok()).unwrap_or(a);
        out.extend(a..=b);
    }
    out
}

pub fn assert_clean(report: &ShutdownReport) {
    assert!(report.is_clean(), "leaks or panics at shutdown: {report:?}");
}

/// Echoes `payload` and returns (reply payload, ddp_len).
pub fn echo<P: PoolProvider>(
    client: &mut Client<P>,
    payload: &[u8],
    ddp_arg: bool,
    target: ReplyTarget,
) -> (Vec<u8>, Option<u32>) {
    let call = client
        .call(target, |xid, buf| {
            encode_call(xid, ECHO, Arg::Opaque(payload, ddp_arg), buf)
        })
        .unwrap();
    match client.wait(call).unwrap() {
        CallOutcome::Reply { ddp_len, .. } => {
            let reply = client.reply(call).map(|b| b.to_vec()).unwrap();
            let out = match ddp_len {
                // The DDP result moved by the write chunk: the inline
                // reply keeps its length word, the data is in the chunk.
                Some(n) => {
                    let data = client.ddp(call).map(|b| b.to_vec()).unwrap();
                    assert_eq!(data.len(), n as usize);
                    let (_, hl) = ReplyHeader::parse(&reply).unwrap();
                    let len = Decoder::new(&reply[hl..]).get_u32().unwrap();
                    assert_eq!(len, n);
                    data.to_vec()
                }
                None => decode_opaque_reply(&reply),
            };
            assert!(client.release(call));
            (out, ddp_len)
        }
        CallOutcome::Failed(f) => panic!("echo of {} bytes failed: {f:?}", payload.len()),
    }
}

/// Each client warms up with one echo (the server's grant is then known,
/// RFC 5666 s3.3), then pipelines `depth` echoes of `payloads` (client
/// `i` sends `payloads[i * depth..][..depth]`) and checks every reply
/// byte for byte, in order.
pub fn pipelined_echoes<P: PoolProvider>(
    clients: &mut [Client<P>],
    payloads: &[Vec<u8>],
    depth: usize,
    target: ReplyTarget,
) {
    pipelined_echoes_around(clients, payloads, depth, target, || {}, || {});
}

/// [`pipelined_echoes`], running `before_issue` after each client's first
/// echo and `after_issue` once every pipelined call is posted and before
/// any is waited for: a test holds the server between the two to have
/// every call in flight at once.
pub fn pipelined_echoes_around<P: PoolProvider>(
    clients: &mut [Client<P>],
    payloads: &[Vec<u8>],
    depth: usize,
    target: ReplyTarget,
    before_issue: impl FnOnce(),
    after_issue: impl FnOnce(),
) {
    for (c, p) in clients.iter_mut().zip(payloads) {
        assert!(echo(c, p, false, target).0 == *p);
    }
    before_issue();
    let mut calls = Vec::new();
    for (i, c) in clients.iter_mut().enumerate() {
        for p in &payloads[i * depth..(i + 1) * depth] {
            calls.push(
                c.call(target, |xid, buf| {
                    encode_call(xid, ECHO, Arg::Opaque(p, false), buf)
                })
                .expect("call"),
            );
        }
    }
    after_issue();
    for (i, c) in clients.iter_mut().enumerate() {
        for k in 0..depth {
            let call = calls[i * depth + k];
            let outcome = c.wait(call).expect("reply");
            assert!(matches!(outcome, CallOutcome::Reply { .. }), "{outcome:?}");
            let back = decode_opaque_reply(&c.reply(call).map(|b| b.to_vec()).unwrap());
            assert!(back == payloads[i * depth + k], "client {i} call {k}");
            assert!(c.release(call));
        }
    }
}

/// The engine configuration of rpcrdmad's server connections at its
/// defaults: 64 credits, 1 MiB messages plus headers, no requester slot.
pub fn daemon_engine_config() -> engine::Config {
    engine::Config {
        credits: 64,
        max_outstanding_calls: 0,
        max_call_size: (1 << 20) + 4096,
        max_reply_size: (1 << 20) + 4096,
        max_ddp_size: 4096,
        ..engine::Config::default()
    }
}

pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed))
        .collect()
}

/// Runs `stop` (a pool's or a set's) on another thread while its workers
/// sleep, waits for the report (60 s: a deadline that means the stop never
/// woke them), and checks that every sleep worker 0 took was ended by a
/// doorbell, none by its timeout (the tests that call this park for an
/// hour). Returns worker 0's final counters.
pub fn stop_sleeping_workers(
    stop: impl FnOnce() -> dataplane::worker::ShutdownReport + Send + 'static,
) -> dataplane::worker::WorkerSnapshot {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(stop());
    });
    let report = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("broken: a sleeping worker did not see its stop");
    let c = report.workers[0].counters;
    assert!(c.sleeps >= 4, "{c:?}");
    assert_eq!(
        c.sleeps, c.doorbell_wakeups,
        "a sleep ended by its timeout: {c:?}"
    );
    c
}
