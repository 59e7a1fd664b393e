//! `shm` and `roce`: RPC over RDMA with [`dataplane::client::Client`], one
//! driver generic over the verbs provider.
//!
//! * With `--connect shm://PATH` / `roce://IP:PORT` the client talks to a
//!   running server (`rpcrdmad`); its CPU time is read from
//!   `/proc/<pid>/stat` when `--server-pid` names it, else not reported.
//! * Without a URL ([`RdmaDriver::embedded`]) a one-worker
//!   [`WorkerPool`] starts in this process on the server core, with an
//!   acceptor thread; the client runs on the caller's thread (pinned to the
//!   client core by [`RdmaDriver::prepare`]). The worker's CPU time is
//!   read from `/proc/self/task/<tid>/stat`.
//!
//! Each run reconnects with a client sized for it: `depth` requester slots,
//! and for READ/ECHO a write chunk of `size` bytes per slot, registered
//! once with the connection and reused by every call (RFC 5666 s3.4:
//! the SOURCE/ECHO result is the DDP-eligible item, placed by RDMA Write).
//! A SINK argument is marked DDP-eligible, so the engine offers it as a
//! read chunk the server pulls when the call does not fit inline.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use dataplane::client::{
    CallOutcome, Client, ClientConfig, ClientError, Directed, MemKey, MemRange, ReplyTarget,
};
use dataplane::engine::{self, CallHandle, Extensions, SendCallError};
use dataplane::extension_names::Names;
use dataplane::service::bench::{encode_call, encode_call_directed, Args};
use dataplane::service::ServiceTable;
use dataplane::verbs::{Context, VerbsError};
use dataplane::worker::{
    EndpointConfig, IdleStrategy, PoolProvider, WorkerConfig, WorkerError, WorkerPool,
    WORKER_THREAD_PREFIX,
};

use crate::driver::{thread_cpu_of, Reply, RpcDriver};
use crate::spec::{BenchError, Idle, Op, OpenOptions, RunSpec};
use crate::tirpc::CpuTimes;

/// Largest data size the embedded server takes (calls and replies carry
/// up to this many bytes plus headers): the bench program's maximum.
pub const EMBEDDED_MAX_DATA: u32 = dataplane::service::bench::MAX_DATA;
/// Most credits the embedded server grants a connection: the deepest
/// pipeline a run can keep in flight.
pub const EMBEDDED_MAX_CREDITS: u32 = 1024;

/// What an embedded server is built for. A responder connection holds
/// `2 * credits * (max_call_size + max_reply_size)` bytes, faulted in at
/// accept (docs/WORKER.md, "Memory per connection"), so one sized for
/// 16 MiB messages and deep pipelines would take gigabytes: the server is
/// sized for the run, in powers of two so that neighbouring runs of a
/// sweep share it, and restarted when a run needs another size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ServerShape {
    idle: Idle,
    max_data: u32,
    credits: u32,
}

impl ServerShape {
    fn for_run(spec: &RunSpec) -> ServerShape {
        ServerShape {
            idle: spec.idle,
            max_data: spec.size.max(64 << 10).next_power_of_two(),
            credits: spec.depth.max(16).next_power_of_two(),
        }
    }
}
/// Room for the RPC and RPC-over-RDMA headers around the data.
const HEADER_ROOM: u32 = 1024;

/// Engine limits for data of `max_data` bytes with `credits` calls in
/// flight (the same on both sides of an embedded run).
fn engine_config(max_data: u32, credits: u32) -> engine::Config {
    // The engine wants sizes in whole XDR words.
    let max_data = max_data.max(4).next_multiple_of(4);
    engine::Config {
        inline_recv_size: 4096,
        inline_send_size: 4096,
        credits,
        max_outstanding_calls: credits,
        max_call_size: max_data + HEADER_ROOM,
        max_reply_size: max_data + HEADER_ROOM,
        max_ddp_size: max_data,
        ..engine::Config::default()
    }
}

fn idle_strategy(idle: Idle) -> IdleStrategy {
    match idle {
        Idle::Spin => IdleStrategy::Spin,
        Idle::Adaptive => IdleStrategy::Adaptive {
            park_max: Duration::from_micros(200),
        },
    }
}

/// Serialises embedded-server start-up in this process, so that the
/// worker thread found in `/proc/self/task` is the one just started.
static SPAWN_LOCK: Mutex<()> = Mutex::new(());

/// Threads of this process named like the pool's workers.
fn worker_tids() -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let e = e.ok()?;
        let tid: i32 = e.file_name().to_str()?.parse().ok()?;
        let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
        comm.starts_with(WORKER_THREAD_PREFIX).then_some(tid)
    })
    .collect()
}

/// A one-worker pool serving the bench program, and its acceptor.
struct EmbeddedServer<P: PoolProvider> {
    url: String,
    /// What its clients connect with (see `embedded_urls`).
    client_url: String,
    pool: Option<Arc<WorkerPool<P>>>,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
    worker_tid: Option<i32>,
    shape: ServerShape,
    core: Option<usize>,
}

impl<P: PoolProvider> EmbeddedServer<P> {
    fn start(
        core: Option<usize>,
        shape: ServerShape,
        extensions: Extensions,
    ) -> Result<Self, BenchError> {
        let (url, client_url) = embedded_urls(P::SCHEME);
        let fail = |what: &str, e: &dyn std::fmt::Display| BenchError::Unsupported {
            transport: P::SCHEME,
            reason: format!("embedded server: {what}: {e}"),
        };
        let ctx = Arc::new(P::open(&url).map_err(|e| fail("open", &e))?);
        let listener = ctx
            .listen(&url)
            .map_err(|e| fail(&format!("listen on {url}"), &e))?;
        let mut endpoint = EndpointConfig {
            engine: engine_config(shape.max_data, shape.credits),
            ..EndpointConfig::default()
        };
        // A server connection never calls: one requester slot (as the
        // worker's default does).
        endpoint.engine.max_outstanding_calls = 1;
        endpoint.engine.extensions = extensions;
        let config = WorkerConfig {
            endpoint,
            idle: idle_strategy(shape.idle),
            ..WorkerConfig::default()
        };
        let (pool, worker_tid) = {
            let _guard = SPAWN_LOCK.lock().unwrap_or_else(|p| p.into_inner());
            let before = worker_tids();
            let pool =
                WorkerPool::<P>::spawn(ctx, &[core], config, Arc::new(ServiceTable::builtin()))
                    .map_err(|e| fail("spawn the worker", &e))?;
            let tid = worker_tids().into_iter().find(|t| !before.contains(t));
            (Arc::new(pool), tid)
        };
        let stop = Arc::new(AtomicBool::new(false));
        let acceptor = {
            let (pool, stop) = (pool.clone(), stop.clone());
            std::thread::Builder::new()
                .name("bench-acceptor".to_owned())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        match pool.accept(&listener, Duration::from_millis(20)) {
                            Ok(_) | Err(WorkerError::Verbs(VerbsError::Timeout)) => {}
                            Err(e) => eprintln!("embedded {} server: accept: {e}", P::SCHEME),
                        }
                    }
                })
                .map_err(|e| fail("spawn the acceptor", &e))?
        };
        Ok(EmbeddedServer {
            url,
            client_url,
            pool: Some(pool),
            stop,
            acceptor: Some(acceptor),
            worker_tid,
            shape,
            core,
        })
    }
}

impl<P: PoolProvider> Drop for EmbeddedServer<P> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        if let Some(pool) = self.pool.take().and_then(|p| Arc::try_unwrap(p).ok()) {
            let report = pool.stop(Duration::from_secs(2));
            if !report.is_clean() {
                eprintln!(
                    "embedded {} server: unclean shutdown: {report:?}",
                    P::SCHEME
                );
            }
        }
        if let Some(path) = self.url.strip_prefix("shm://") {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Sets the calling thread's CPU mask to `cores` (best effort).
fn set_affinity(cores: &[usize]) {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET writes within it
    // for ids below CPU_SETSIZE, which is checked.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cores {
            if c < libc::CPU_SETSIZE as usize {
                libc::CPU_SET(c, &mut set);
            }
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Fresh URLs for an embedded server of provider `scheme`: the one it
/// listens on and the one its clients connect with.
fn embedded_urls(scheme: &str) -> (String, String) {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    match scheme {
        "roce" => {
            // A loopback address of its own per server (Linux answers for
            // all of 127/8): no clash with a daemon on 127.0.0.1:4791 or a
            // device of ours still closing. The clients get a device of
            // their own at another address (the `local` option), as a
            // client on another host would have: on the server's device
            // they would share its one socket with the worker, which then
            // reads some of their packets and hands them over.
            let pid = std::process::id();
            let (b, c) = (pid % 250 + 1, n % 250 + 1);
            let server = format!("127.{}.{b}.{c}", 100 + (pid >> 8) % 100);
            let client = format!("127.{}.{b}.{c}", 200 + (pid >> 8) % 50);
            (
                format!("roce://{server}:20049"),
                format!("roce://{server}:20049?local={client}"),
            )
        }
        _ => {
            let path =
                std::env::temp_dir().join(format!("rpcrdma-bench-{}-{n}.sock", std::process::id()));
            let _ = std::fs::remove_file(&path);
            let url = format!("shm://{}", path.display());
            (url.clone(), url)
        }
    }
}

/// Where the server is.
enum Server<P: PoolProvider> {
    Embedded(EmbeddedServer<P>),
    Remote { pid: Option<u32> },
}

/// The RPC-over-RDMA client driver of provider `P`.
pub struct RdmaDriver<P: PoolProvider> {
    name: &'static str,
    url: String,
    server: Server<P>,
    client_core: Option<usize>,
    /// The cores this thread could use before the client pinned it: a
    /// server restarted later is spawned from this mask (the pool checks
    /// its core against the spawning thread's mask).
    allowed: Vec<usize>,
    client: Option<Client<P>>,
    /// The call in flight in each slot.
    slots: Vec<Option<CallHandle>>,
    /// The bench slot of each requester slot's call (indexed by
    /// `CallHandle::slot`), so a reply finds its slot in one probe.
    slot_of_call: Vec<u32>,
    in_flight: u32,
    target: ReplyTarget,
    /// READ and WRITE runs: application memory registered once, one range
    /// of `slot_bytes` per slot, used by directed operations
    /// (docs/CLIENT.md): the result lands there, the argument is pulled
    /// from there.
    app: Option<MemKey>,
    slot_bytes: u32,
    /// The argument (address, length) each slot's range holds, so that
    /// it is copied in once, not per call (a gateway's data is already in
    /// its registered memory).
    loaded: Vec<Option<(usize, usize)>>,
    /// Connect with [`lean_endpoint`] limits (an idle connection of
    /// `conns`), whatever the run asks for.
    lean: bool,
    /// Keep the connection when the next run has the same shape as the
    /// last (`conns` measures one busy connection across its series).
    keep: bool,
    /// Shape of the connection prepared last: (op, size, depth, idle).
    prepared: Option<(Op, u32, u32, Idle)>,
    /// The reply message being checked, copied out of the reply buffer
    /// (the server writes that buffer, so it is never a slice); sized at
    /// prepare, so the copy never allocates.
    reply_copy: Vec<u8>,
    /// Extensions the client (and an embedded server) offer.
    extensions: Extensions,
    /// READ and WRITE data as the message's DDP item, not directed
    /// (`OpenOptions::bulk_in_messages`).
    bulk_in_messages: bool,
    /// What the first connection negotiated (reported once).
    negotiated: Option<Extensions>,
}

/// Limits of a connection that makes one NULL call and then idles (the
/// idle connections of `conns`): the engine's minimum inline sizes (1 KiB
/// each way), one credit and one call slot, 1 KiB messages, no DDP, short
/// queues and 4 KiB pages, so that a thousand of them in one process cost
/// a few MiB in all instead of a hugepage or more each.
pub fn lean_endpoint() -> EndpointConfig {
    EndpointConfig {
        engine: engine::Config {
            inline_recv_size: 1024,
            inline_send_size: 1024,
            credits: 1,
            max_outstanding_calls: 1,
            max_call_size: 1024,
            max_reply_size: 1024,
            max_ddp_size: 0,
            max_rdma_read: 1,
            inbound_rdma_read: 1,
            max_reply_read_chunks: 1,
            error_buffers: 1,
            ..engine::Config::default()
        },
        max_send_wr: 8,
        backlog: 8,
        backing: dataplane::mem::Backing::Small,
        ..EndpointConfig::default()
    }
}

impl<P: PoolProvider> RdmaDriver<P> {
    /// A driver with its own server in this process (pinned to
    /// `options.cores.server`, polling with `options.idle`).
    ///
    /// # Errors
    /// [`BenchError::Unsupported`] when the server cannot start (provider,
    /// listen address, worker core).
    pub fn embedded(name: &'static str, options: &OpenOptions) -> Result<Self, BenchError> {
        let mut first = RunSpec::new(Op::Null, 0, 1, Duration::ZERO);
        first.idle = options.idle;
        let server = EmbeddedServer::<P>::start(
            options.cores.map(|c| c.server),
            ServerShape::for_run(&first),
            options.extensions,
        )?;
        let url = server.client_url.clone();
        Ok(Self::with_server(
            name,
            url,
            Server::Embedded(server),
            options,
        ))
    }

    /// A driver for the server at `url`; `options.server_pid` names its
    /// process for the server CPU figures.
    pub fn connect(name: &'static str, url: &str, options: &OpenOptions) -> Self {
        Self::with_server(
            name,
            url.to_owned(),
            Server::Remote {
                pid: options.server_pid,
            },
            options,
        )
    }

    fn with_server(
        name: &'static str,
        url: String,
        server: Server<P>,
        options: &OpenOptions,
    ) -> Self {
        RdmaDriver {
            name,
            url,
            server,
            client_core: options.cores.map(|c| c.client),
            allowed: core_affinity::get_core_ids()
                .unwrap_or_default()
                .into_iter()
                .map(|c| c.id)
                .collect(),
            client: None,
            slots: Vec::new(),
            slot_of_call: Vec::new(),
            in_flight: 0,
            target: ReplyTarget::Inline,
            app: None,
            slot_bytes: 0,
            loaded: Vec::new(),
            lean: false,
            keep: false,
            prepared: None,
            reply_copy: Vec::new(),
            extensions: options.extensions,
            bulk_in_messages: options.bulk_in_messages,
            negotiated: None,
        }
    }

    /// This driver with [`lean_endpoint`] connections (NULL runs only).
    pub fn lean(mut self) -> Self {
        self.lean = true;
        self
    }

    /// This driver keeping its connection between runs of one shape.
    pub fn keeping_connection(mut self) -> Self {
        self.keep = true;
        self
    }

    /// The server's URL (an embedded server's own, once started).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The extensions the first connection negotiated (CONF_RDMA
    /// version 2), once one was made.
    pub fn negotiated(&self) -> Option<Extensions> {
        self.negotiated
    }

    /// Whether the server is embedded in this process.
    pub fn is_embedded(&self) -> bool {
        matches!(self.server, Server::Embedded(_))
    }

    /// Closes the connection (an embedded server keeps running).
    ///
    /// # Errors
    /// The close timed out or left resources in use.
    pub fn close_connection(&mut self) -> Result<(), BenchError> {
        self.prepared = None;
        self.disconnect()
    }

    fn call_error(&self, reason: String) -> BenchError {
        BenchError::Call {
            transport: self.name,
            reason,
        }
    }

    /// Closes the current client, if any, checking it leaked nothing.
    fn disconnect(&mut self) -> Result<(), BenchError> {
        self.slots.iter_mut().for_each(|s| *s = None);
        self.in_flight = 0;
        match self.client.take() {
            Some(c) => c
                .close()
                .map_err(|e| self.call_error(format!("closing the previous connection: {e}"))),
            None => Ok(()),
        }
    }
}

impl<P: PoolProvider> Drop for RdmaDriver<P> {
    fn drop(&mut self) {
        // The client goes before the embedded server it talks to.
        let _ = self.disconnect();
    }
}

impl<P: PoolProvider> RpcDriver for RdmaDriver<P> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn describe(&self) -> String {
        let base = match &self.server {
            Server::Embedded(s) => format!(
                "{}: RPC over RDMA, embedded one-worker server at {} ({}, {} idle){}",
                self.name,
                s.url,
                match s.core {
                    Some(c) => format!("server core {c}"),
                    None => "unpinned".to_owned(),
                },
                match s.shape.idle {
                    Idle::Spin => "spin",
                    Idle::Adaptive => "adaptive",
                },
                match self.client_core {
                    Some(c) => format!(", client core {c}"),
                    None => String::new(),
                }
            ),
            Server::Remote { pid } => format!(
                "{}: RPC over RDMA to {}{}",
                self.name,
                self.url,
                match pid {
                    Some(p) => format!(" (server pid {p})"),
                    None => String::new(),
                }
            ),
        };
        match self.negotiated {
            Some(n) => format!("{base}, extensions negotiated: {}", Names(n)),
            None => base,
        }
    }

    fn prepare(&mut self, spec: &RunSpec) -> Result<(), BenchError> {
        let shape = (spec.op, spec.size, spec.depth, spec.idle);
        if self.keep && self.client.is_some() && self.in_flight == 0 && self.prepared == Some(shape)
        {
            return Ok(());
        }
        self.prepared = None;
        self.disconnect()?;
        if self.lean && spec.op != Op::Null {
            return Err(BenchError::Unsupported {
                transport: self.name,
                reason: "a lean connection makes NULL calls only".to_owned(),
            });
        }
        if let Server::Embedded(s) = &self.server {
            if spec.size > EMBEDDED_MAX_DATA || spec.depth > EMBEDDED_MAX_CREDITS {
                return Err(BenchError::Unsupported {
                    transport: self.name,
                    reason: format!(
                        "the embedded server takes up to {EMBEDDED_MAX_DATA} bytes at depth {EMBEDDED_MAX_CREDITS}"
                    ),
                });
            }
            let shape = ServerShape::for_run(spec);
            if s.shape != shape {
                let core = s.core;
                // The old server goes first (its memory, its listener).
                self.server = Server::Remote { pid: None };
                if self.client_core.is_some() && !self.allowed.is_empty() {
                    set_affinity(&self.allowed);
                }
                let server = EmbeddedServer::start(core, shape, self.extensions)?;
                self.url = server.client_url.clone();
                self.server = Server::Embedded(server);
            }
        }
        if let Some(core) = self.client_core {
            // Best effort, as for the other transports' clients.
            let _ = core_affinity::set_for_current(core_affinity::CoreId { id: core });
        }
        let depth = spec.depth.max(1);
        let data = spec.size.max(1);
        self.target = match spec.op {
            Op::Read | Op::Echo => ReplyTarget::WriteChunk { max_ddp: data },
            Op::Null | Op::Write => ReplyTarget::Inline,
        };
        let directed = matches!(spec.op, Op::Read | Op::Write) && !self.bulk_in_messages;
        self.slot_bytes = data.next_multiple_of(64);
        let mut engine = engine_config(data, depth);
        if directed {
            engine.app_memory = depth * self.slot_bytes;
        }
        let config = ClientConfig {
            endpoint: if self.lean {
                lean_endpoint()
            } else {
                EndpointConfig {
                    engine,
                    ..EndpointConfig::default()
                }
            },
            conf_rdma: false,
            extensions: self.extensions,
            idle: idle_strategy(spec.idle),
            wait_timeout: Duration::from_secs(60),
        };
        let mut client = Client::<P>::connect(&self.url, config)
            .map_err(|e| self.call_error(format!("connect {}: {e}", self.url)))?;
        if self.negotiated.is_none() && !self.extensions.is_empty() {
            let negotiated = client.negotiated();
            println!(
                "{}: extensions negotiated: {} (configured: {}, advertised: {})",
                self.name,
                Names(negotiated),
                Names(self.extensions),
                Names(client.endpoint().connection().advertised_extensions()),
            );
            self.negotiated = Some(negotiated);
        }
        self.app = if directed {
            Some(
                client
                    .register(depth * self.slot_bytes)
                    .map_err(|e| self.call_error(format!("register: {e}")))?,
            )
        } else {
            None
        };
        self.loaded = vec![None; depth as usize];
        let config = client.endpoint().connection().config();
        self.reply_copy = Vec::with_capacity(config.max_reply_size as usize);
        // `CallHandle::slot` is below `max_outstanding_calls`: sized here,
        // the table never grows while calls run.
        self.slot_of_call = vec![0; config.max_outstanding_calls as usize];
        self.client = Some(client);
        self.slots = vec![None; depth as usize];
        self.in_flight = 0;
        self.prepared = Some(shape);
        Ok(())
    }

    fn start(&mut self, slot: u32, args: Args<'_>) -> Result<(), BenchError> {
        let name = self.name;
        let fail = |reason: String| BenchError::Call {
            transport: name,
            reason,
        };
        let refused = |e: ClientError| match e {
            ClientError::Call(SendCallError::NoSlot) => BenchError::Busy { transport: name },
            e => fail(e.to_string()),
        };
        let Some(client) = self.client.as_mut() else {
            return Err(fail("start before prepare".to_owned()));
        };
        let Some(entry) = self.slots.get_mut(slot as usize) else {
            return Err(fail(format!("slot {slot} beyond the prepared depth")));
        };
        let handle = match (self.app, args) {
            (Some(key), Args::Source(n)) => {
                let target = MemRange {
                    key,
                    offset: slot * self.slot_bytes,
                    len: n,
                };
                client
                    .call_directed(
                        Directed {
                            source: None,
                            target: Some(target),
                        },
                        |xid, buf| encode_call(buf, xid, args).ok().map(|c| (c.len, c.ddp)),
                    )
                    .map_err(refused)?
                    .0
            }
            (Some(key), Args::Sink(data)) => {
                let source = MemRange {
                    key,
                    offset: slot * self.slot_bytes,
                    len: data.len() as u32,
                };
                let have = Some((data.as_ptr() as usize, data.len()));
                let loaded = &mut self.loaded[slot as usize];
                if *loaded != have {
                    client
                        .write_region(key, source.offset, data)
                        .map_err(|e| fail(e.to_string()))?;
                    *loaded = have;
                }
                client
                    .call_directed(
                        Directed {
                            source: Some(source),
                            target: None,
                        },
                        |xid, buf| {
                            encode_call_directed(buf, xid, args)
                                .ok()
                                .map(|c| (c.len, c.ddp))
                        },
                    )
                    .map_err(refused)?
                    .0
            }
            _ => client
                .call(self.target, |xid, buf| {
                    encode_call(buf, xid, args).ok().map(|c| (c.len, c.ddp))
                })
                .map_err(refused)?,
        };
        *entry = Some(handle);
        if let Some(s) = self.slot_of_call.get_mut(handle.slot()) {
            *s = slot;
        }
        self.in_flight += 1;
        Ok(())
    }

    fn poll<F: FnMut(u32, Reply<'_>)>(&mut self, mut done: F) -> Result<usize, BenchError> {
        let name = self.name;
        let Some(client) = self.client.as_mut() else {
            return Ok(0);
        };
        let mut finished = 0;
        while self.in_flight > 0 {
            let Some((handle, outcome)) = client.poll() else {
                break;
            };
            let slot = self.slot_of_call.get(handle.slot()).map(|&s| s as usize);
            let Some(slot) = slot.filter(|&s| self.slots.get(s) == Some(&Some(handle))) else {
                // A reply for no slot of ours (e.g. a call of a failed
                // run): give it back.
                client.release(handle);
                continue;
            };
            self.slots[slot] = None;
            self.in_flight -= 1;
            finished += 1;
            match outcome {
                CallOutcome::Reply { .. } => {
                    self.reply_copy.clear();
                    if let Some(m) = client.reply(handle) {
                        m.append_to(&mut self.reply_copy);
                    }
                    let ddp = client.ddp(handle);
                    done(
                        slot as u32,
                        Reply {
                            message: &self.reply_copy,
                            ddp,
                        },
                    );
                    client.release(handle);
                }
                CallOutcome::Failed(f) => {
                    return Err(BenchError::Call {
                        transport: name,
                        reason: format!("call failed: {f:?}"),
                    })
                }
            }
        }
        Ok(finished)
    }

    fn round_trips(&self) -> Option<(u64, u64)> {
        let s = self.client.as_ref()?.endpoint().connection().stats();
        Some((s.calls_sent, s.calls_pulled + s.replies_pulled))
    }

    fn server_cpu(&self) -> Option<CpuTimes> {
        match &self.server {
            Server::Embedded(s) => thread_cpu_of(s.worker_tid?),
            Server::Remote { pid } => {
                let stat = std::fs::read_to_string(format!("/proc/{}/stat", (*pid)?)).ok()?;
                crate::tirpc::parse_stat_cpu(&stat)
            }
        }
    }
}
