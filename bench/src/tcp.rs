//! `tcp`: ONC RPC over TCP (RFC 5531 s11 record marking) with the
//! dataplane's pipelined [`TcpClient`].
//!
//! * With `--connect tcp://IP:PORT` the client talks to a running server
//!   (the daemon's TCP listener, or any server of the bench program); its
//!   CPU time is read from `/proc/<pid>/stat` when `--server-pid` names it.
//! * Without a URL ([`TcpDriver::embedded`]) a [`TcpServer`] on an
//!   ephemeral loopback port is polled by one thread of this process,
//!   pinned to the server core, with the run's idle policy; its CPU time is
//!   read from `/proc/self/task/<tid>/stat`.
//!
//! Each run reconnects with a client sized for it (`depth` calls, messages
//! of `size` bytes of data); a call's slot is its tag.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use dataplane::service::bench::Args;
use dataplane::service::ServiceTable;
use dataplane::tcp::{TcpClient, TcpClientConfig, TcpConfig, TcpServer};

use crate::driver::{current_thread_id, thread_cpu_of, Reply, RpcDriver};
use crate::spec::{BenchError, Idle, OpenOptions, RunSpec};
use crate::tirpc::CpuTimes;

/// Empty passes before an adaptive server thread starts yielding.
const ADAPTIVE_SPINS: u32 = 1024;
/// Longest sleep of an adaptive server thread once yielding did not help.
const ADAPTIVE_PARK: Duration = Duration::from_micros(200);

/// A [`TcpServer`] polled by a thread of this process.
struct EmbeddedTcp {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    tid: Option<i32>,
    core: Option<usize>,
    idle: Idle,
}

impl EmbeddedTcp {
    fn start(core: Option<usize>, idle: Idle) -> Result<EmbeddedTcp, BenchError> {
        let fail = |reason: String| BenchError::Unsupported {
            transport: "tcp",
            reason: format!("embedded server: {reason}"),
        };
        let mut server = TcpServer::bind(([127, 0, 0, 1], 0).into(), TcpConfig::default())
            .map_err(|e| fail(e.to_string()))?;
        let addr = server.local_addr();
        let stop = Arc::new(AtomicBool::new(false));
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let thread = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("bench-tcp-server".to_owned())
                .spawn(move || {
                    if let Some(c) = core {
                        let _ = core_affinity::set_for_current(core_affinity::CoreId { id: c });
                    }
                    let _ = tid_tx.send(current_thread_id());
                    let table = ServiceTable::builtin();
                    let origin = Instant::now();
                    let mut idle_passes = 0u32;
                    while !stop.load(Ordering::Relaxed) {
                        let now = dataplane::engine::Instant(origin.elapsed().as_nanos() as u64);
                        if server.poll(&table, now) > 0 {
                            idle_passes = 0;
                            continue;
                        }
                        idle_passes = idle_passes.saturating_add(1);
                        match idle {
                            Idle::Spin => std::hint::spin_loop(),
                            Idle::Adaptive if idle_passes < ADAPTIVE_SPINS => {
                                std::hint::spin_loop()
                            }
                            Idle::Adaptive if idle_passes < ADAPTIVE_SPINS + 64 => {
                                std::thread::yield_now()
                            }
                            Idle::Adaptive => std::thread::sleep(ADAPTIVE_PARK),
                        }
                    }
                    server.connections_mut().close_all();
                })
                .map_err(|e| fail(format!("spawn: {e}")))?
        };
        let tid = tid_rx.recv().ok();
        Ok(EmbeddedTcp {
            addr,
            stop,
            thread: Some(thread),
            tid,
            core,
            idle,
        })
    }
}

impl Drop for EmbeddedTcp {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The RPC-over-TCP client driver.
pub struct TcpDriver {
    addr: SocketAddr,
    embedded: Option<EmbeddedTcp>,
    server_pid: Option<u32>,
    client_core: Option<usize>,
    client: Option<TcpClient>,
    /// Connect with [`lean_client`] limits (an idle connection of
    /// `conns`), whatever the run asks for.
    lean: bool,
    /// Keep the connection when the next run has the same shape as the
    /// last (`conns` measures one busy connection across its series).
    keep: bool,
    /// Shape of the connection prepared last: (size, depth, idle).
    prepared: Option<(u32, u32, Idle)>,
}

/// Limits of a connection that makes one NULL call and then idles (the
/// idle connections of `conns`): one call slot, 1 KiB messages and read
/// buffer, so that a thousand of them cost about 3 KiB of buffers each
/// instead of the default 16 MiB reply reservation.
pub fn lean_client() -> TcpClientConfig {
    TcpClientConfig {
        depth: 1,
        max_call_len: 1024,
        max_reply_len: 1024,
        read_buffer_len: 1024,
        batch_len: 1024,
        reads_per_poll: 1,
    }
}

impl TcpDriver {
    /// A driver with its own server thread in this process.
    ///
    /// # Errors
    /// [`BenchError::Unsupported`] when the server cannot bind or start.
    pub fn embedded(options: &OpenOptions) -> Result<TcpDriver, BenchError> {
        let server = EmbeddedTcp::start(options.cores.map(|c| c.server), options.idle)?;
        Ok(TcpDriver {
            addr: server.addr,
            embedded: Some(server),
            server_pid: None,
            client_core: options.cores.map(|c| c.client),
            client: None,
            lean: false,
            keep: false,
            prepared: None,
        })
    }

    /// A driver for the server at `url` (`tcp://IP:PORT`).
    ///
    /// # Errors
    /// [`BenchError::BadUrl`].
    pub fn connect(url: &str, options: &OpenOptions) -> Result<TcpDriver, BenchError> {
        let addr = dataplane::tcp::parse_tcp_url(url).map_err(|e| BenchError::BadUrl {
            url: url.to_owned(),
            reason: e.to_string(),
        })?;
        Ok(TcpDriver {
            addr,
            embedded: None,
            server_pid: options.server_pid,
            client_core: options.cores.map(|c| c.client),
            client: None,
            lean: false,
            keep: false,
            prepared: None,
        })
    }

    /// This driver with [`lean_client`] connections.
    pub fn lean(mut self) -> Self {
        self.lean = true;
        self
    }

    /// This driver keeping its connection between runs of one shape.
    pub fn keeping_connection(mut self) -> Self {
        self.keep = true;
        self
    }

    /// The server's URL (`tcp://IP:PORT`; an embedded server's own).
    pub fn url(&self) -> String {
        format!("tcp://{}", self.addr)
    }

    /// Whether the server is embedded in this process.
    pub fn is_embedded(&self) -> bool {
        self.embedded.is_some()
    }

    /// Closes the connection (an embedded server keeps running).
    pub fn close_connection(&mut self) {
        self.prepared = None;
        self.client = None;
    }
}

fn call_error(reason: String) -> BenchError {
    BenchError::Call {
        transport: "tcp",
        reason,
    }
}

impl RpcDriver for TcpDriver {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn describe(&self) -> String {
        match &self.embedded {
            Some(s) => format!(
                "tcp: RPC over TCP, embedded dataplane::tcp server thread on {} ({}, {} idle){}",
                s.addr,
                match s.core {
                    Some(c) => format!("server core {c}"),
                    None => "unpinned".to_owned(),
                },
                match s.idle {
                    Idle::Spin => "spin",
                    Idle::Adaptive => "adaptive",
                },
                match self.client_core {
                    Some(c) => format!(", client core {c}"),
                    None => String::new(),
                }
            ),
            None => format!(
                "tcp: RPC over TCP to {}{}",
                self.addr,
                match self.server_pid {
                    Some(p) => format!(" (server pid {p})"),
                    None => String::new(),
                }
            ),
        }
    }

    fn prepare(&mut self, spec: &RunSpec) -> Result<(), BenchError> {
        let shape = (spec.size, spec.depth, spec.idle);
        if self.keep
            && self.prepared == Some(shape)
            && self.client.as_ref().is_some_and(|c| c.outstanding() == 0)
        {
            return Ok(());
        }
        self.prepared = None;
        self.client = None;
        if let Some(core) = self.client_core {
            let _ = core_affinity::set_for_current(core_affinity::CoreId { id: core });
        }
        if let Some(s) = &self.embedded {
            if s.idle != spec.idle {
                let core = s.core;
                self.embedded = None;
                let server = EmbeddedTcp::start(core, spec.idle)?;
                self.addr = server.addr;
                self.embedded = Some(server);
            }
        }
        let cfg = if self.lean {
            if spec.size > 0 || spec.depth > 1 {
                return Err(BenchError::Unsupported {
                    transport: "tcp",
                    reason: "a lean connection makes NULL calls at depth 1 only".to_owned(),
                });
            }
            lean_client()
        } else {
            TcpClientConfig::for_data(spec.size as usize, spec.depth.max(1) as usize)
        };
        let client = TcpClient::connect(self.addr, cfg)
            .map_err(|e| call_error(format!("connect {}: {e}", self.addr)))?;
        self.client = Some(client);
        self.prepared = Some(shape);
        Ok(())
    }

    fn start(&mut self, slot: u32, args: Args<'_>) -> Result<(), BenchError> {
        let Some(client) = self.client.as_mut() else {
            return Err(call_error("start before prepare".to_owned()));
        };
        // The output buffer holds one call beyond the batch; when it is
        // full, the socket drains as the server reads.
        let t0 = Instant::now();
        let mut tries = 0u32;
        loop {
            match client.call(args, u64::from(slot)) {
                Ok(Some(_)) => return Ok(()),
                Ok(None) => {
                    client.flush().map_err(|e| call_error(e.to_string()))?;
                    tries += 1;
                    if tries % 1024 == 0 {
                        if t0.elapsed() > Duration::from_secs(60) {
                            return Err(call_error(
                                "no room for a call for 60 s (server not reading?)".to_owned(),
                            ));
                        }
                        std::thread::yield_now();
                    }
                }
                Err(e) => return Err(call_error(e.to_string())),
            }
        }
    }

    fn poll<F: FnMut(u32, Reply<'_>)>(&mut self, mut done: F) -> Result<usize, BenchError> {
        let Some(client) = self.client.as_mut() else {
            return Ok(0);
        };
        let mut finished = 0;
        client
            .poll(|r| {
                finished += 1;
                done(
                    r.tag as u32,
                    Reply {
                        message: r.message,
                        ddp: None,
                    },
                );
            })
            .map_err(|e| call_error(e.to_string()))?;
        Ok(finished)
    }

    fn server_cpu(&self) -> Option<CpuTimes> {
        match &self.embedded {
            Some(s) => thread_cpu_of(s.tid?),
            None => {
                let stat =
                    std::fs::read_to_string(format!("/proc/{}/stat", self.server_pid?)).ok()?;
                crate::tirpc::parse_stat_cpu(&stat)
            }
        }
    }
}
