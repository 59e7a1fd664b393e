//! The daemon's configuration: a TOML file read with serde.
//!
//! Every key has a default, so an empty file, no file at all
//! ([`Config::default`]) and `configs/default.toml` give the same
//! configuration (a test checks it). Every key, its type, default and
//! meaning is in `docs/CONFIG.md`.
//!
//! # Errors name a file and a line
//! [`Config::parse`] fails with a [`ConfigError`] that renders as one line,
//! `FILE:LINE: message`:
//! - syntax errors, unknown keys (every table denies unknown fields), wrong
//!   types and values that do not parse (a listener URL, a socket address,
//!   an unknown idle strategy) point at the offending key or value;
//! - semantic errors found after parsing (a number out of range, an empty
//!   or duplicated worker core, a core this host does not have, duplicate
//!   listeners) point at the line of the key that holds the bad value.

use std::collections::HashSet;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::Deserialize;

use crate::rpcbind::RpcbindAddress;

/// The whole configuration. See `docs/CONFIG.md`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Polling workers.
    pub workers: Workers,
    /// Where connections are accepted (`[[listeners]]`).
    pub listeners: Vec<Listener>,
    /// RPC-over-RDMA transport parameters.
    pub transport: Transport,
    /// Chunk list limits for incoming headers.
    pub chunks: Chunks,
    /// Registered memory.
    pub memory: Memory,
    /// rpcbind registration.
    pub rpcbind: Rpcbind,
    /// Prometheus exporter.
    pub metrics: Metrics,
    /// `shm` provider access control.
    pub shm: Shm,
    /// Shutdown behaviour.
    pub shutdown: Shutdown,
    /// The local control socket (`rpcrdmad status`).
    pub control: Control,
    /// Logging.
    pub log: Log,
    /// Programs relayed to ONC RPC servers over TCP (`[[gateway]]`).
    pub gateway: Vec<GatewayRoute>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            workers: Workers::default(),
            listeners: vec![Listener {
                url: ProviderUrl::Shm {
                    path: PathBuf::from(DEFAULT_SHM_SOCKET),
                },
            }],
            transport: Transport::default(),
            chunks: Chunks::default(),
            memory: Memory::default(),
            rpcbind: Rpcbind::default(),
            metrics: Metrics::default(),
            shm: Shm::default(),
            shutdown: Shutdown::default(),
            control: Control::default(),
            log: Log::default(),
            gateway: Vec::new(),
        }
    }
}

/// The socket of the default `shm` listener.
pub const DEFAULT_SHM_SOCKET: &str = "/run/rpcrdma/rpcrdmad.sock";

/// `[workers]`: one busy-polling worker per listed core.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Workers {
    /// CPU ids, one worker pinned to each.
    pub cores: Vec<usize>,
    /// What a worker does when a poll finds nothing.
    pub idle: IdleStrategy,
    /// Longest sleep of the `adaptive` strategy, in microseconds.
    pub park_max_us: u32,
    /// Connections (every listener, every transport) served at once;
    /// requests beyond it are refused.
    pub max_connections: u32,
    /// TCP connections one peer address may have open at once; more are
    /// refused. 0: no limit per address.
    pub max_connections_per_peer: u32,
    /// Buffers of `transport.max_message` in each worker's bulk pool, per
    /// RDMA provider: large calls and replies of every connection lease
    /// them one exchange at a time. 0: no pool.
    pub bulk_buffers: u32,
    /// Receives of the inline receive size in each worker's shared receive
    /// queue, per RDMA provider: every connection of the worker receives
    /// from it. 0: every connection posts its own.
    pub shared_receives: u32,
    /// Entries of each worker's control ring (new connections and
    /// commands from the control plane). A connection that finds every
    /// ring full waits in its acceptor until one drains.
    pub control_ring: u32,
}

impl Default for Workers {
    fn default() -> Self {
        Workers {
            cores: vec![0],
            idle: IdleStrategy::Adaptive,
            park_max_us: 100_000,
            max_connections: 1024,
            max_connections_per_peer: 128,
            bulk_buffers: 64,
            shared_receives: 4096,
            control_ring: 256,
        }
    }
}

/// The idle strategy of the workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdleStrategy {
    /// Busy-poll forever: lowest latency, one full core per worker.
    Spin,
    /// Spin, then yield, then park with a bounded sleep: friendly to
    /// shared machines and CI.
    Adaptive,
}

impl FromStr for IdleStrategy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "spin" => Ok(IdleStrategy::Spin),
            "adaptive" => Ok(IdleStrategy::Adaptive),
            other => Err(format!(
                "unknown idle strategy `{other}`: expected \"spin\" or \"adaptive\""
            )),
        }
    }
}

impl FromStr for Hugepages {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(Hugepages::Off),
            "prefer" => Ok(Hugepages::Prefer),
            "required" => Ok(Hugepages::Required),
            other => Err(format!(
                "unknown hugepages policy `{other}`: expected \"off\", \"prefer\" or \"required\""
            )),
        }
    }
}

/// Deserializes a string value through its `FromStr`, so the message is
/// the type's own.
macro_rules! deserialize_via_str {
    ($($t:ty),*) => {$(
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    )*};
}

deserialize_via_str!(IdleStrategy, Hugepages, ProviderUrl, RpcbindAddress);

impl fmt::Display for IdleStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IdleStrategy::Spin => "spin",
            IdleStrategy::Adaptive => "adaptive",
        })
    }
}

/// `[[listeners]]`: one entry per listening address.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Listener {
    /// Provider and address.
    pub url: ProviderUrl,
}

/// A listener address: which provider serves it and where.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ProviderUrl {
    /// `shm:///path.sock`: same-host RDMA; connection setup on a Unix
    /// socket at this absolute path.
    Shm {
        /// The Unix socket path.
        path: PathBuf,
    },
    /// `roce://IP:PORT`: software RoCEv2 (RoCE itself rides UDP 4791; the
    /// port is the RPC service port clients connect to).
    Roce(SocketAddr),
    /// `ibverbs://IP:PORT`: a real HCA through librdmacm.
    Ibverbs(SocketAddr),
    /// `tcp://IP:PORT`: ONC RPC over TCP (the baseline).
    Tcp(SocketAddr),
}

impl ProviderUrl {
    /// The URL scheme.
    pub fn scheme(&self) -> &'static str {
        match self {
            ProviderUrl::Shm { .. } => "shm",
            ProviderUrl::Roce(_) => "roce",
            ProviderUrl::Ibverbs(_) => "ibverbs",
            ProviderUrl::Tcp(_) => "tcp",
        }
    }

    /// The IP address and port, for every provider but `shm`.
    pub fn socket_addr(&self) -> Option<SocketAddr> {
        match self {
            ProviderUrl::Shm { .. } => None,
            ProviderUrl::Roce(a) | ProviderUrl::Ibverbs(a) | ProviderUrl::Tcp(a) => Some(*a),
        }
    }
}

impl fmt::Display for ProviderUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProviderUrl::Shm { path } => write!(f, "shm://{}", path.display()),
            other => write!(
                f,
                "{}://{}",
                other.scheme(),
                other.socket_addr().expect("not shm")
            ),
        }
    }
}

impl FromStr for ProviderUrl {
    type Err = String;

    fn from_str(url: &str) -> Result<Self, String> {
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err(format!(
                "listener URL `{url}` has no scheme: expected shm:///PATH, roce://IP:PORT, \
                 ibverbs://IP:PORT or tcp://IP:PORT"
            ));
        };
        let inet = |make: fn(SocketAddr) -> ProviderUrl| {
            let addr: SocketAddr = rest.parse().map_err(|_| {
                format!(
                    "listener URL `{url}`: `{rest}` is not IP:PORT (IPv6 as [ADDR]:PORT; \
                     host names are not resolved)"
                )
            })?;
            if addr.port() == 0 {
                return Err(format!(
                    "listener URL `{url}`: port 0 is not allowed (clients and rpcbind need a fixed port)"
                ));
            }
            Ok(make(addr))
        };
        match scheme {
            "shm" => {
                let path = Path::new(rest);
                if !path.is_absolute() || path.file_name().is_none() {
                    return Err(format!(
                        "listener URL `{url}`: shm needs an absolute socket path, \
                         e.g. shm:///run/rpcrdma/rpcrdmad.sock"
                    ));
                }
                Ok(ProviderUrl::Shm {
                    path: path.to_path_buf(),
                })
            }
            "roce" => inet(ProviderUrl::Roce),
            "ibverbs" => inet(ProviderUrl::Ibverbs),
            "tcp" => inet(ProviderUrl::Tcp),
            other => Err(format!(
                "unknown listener scheme `{other}` in `{url}`: expected shm, roce, ibverbs or tcp"
            )),
        }
    }
}

/// A socket address with a message that says what is expected.
fn socket_addr<'de, D: serde::Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
    let s = String::deserialize(d)?;
    s.parse().map_err(|_| {
        serde::de::Error::custom(format!(
            "`{s}` is not IP:PORT (IPv6 as [ADDR]:PORT; host names are not resolved)"
        ))
    })
}

/// `[[gateway]]`: one program whose RDMA calls are relayed to an ONC RPC
/// server over TCP (docs/GATEWAY.md).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayRoute {
    /// Program number (NFS 100003, MOUNT 100005, NFSACL 100227).
    pub program: u32,
    /// Versions registered with rpcbind for it (netid `rdma`).
    pub versions: Vec<u32>,
    /// The backend: `IP:PORT`, or `rpcbind://IP` to ask the rpcbind at
    /// that address (port 111) for the program's TCP address at start.
    pub backend: Backend,
    /// TCP connections to the backend per worker.
    #[serde(default = "one")]
    pub connections: u32,
}

fn one() -> u32 {
    1
}

/// Where a gateway route's backend is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A fixed TCP address.
    Tcp(SocketAddr),
    /// Looked up at start from the rpcbind at this address.
    Rpcbind(SocketAddr),
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Backend::Tcp(a) => write!(f, "{a}"),
            Backend::Rpcbind(a) => write!(f, "rpcbind://{a}"),
        }
    }
}

impl<'de> Deserialize<'de> for Backend {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if let Some(host) = s.strip_prefix("rpcbind://") {
            let with_port = host.parse::<SocketAddr>().ok();
            let bare = host
                .parse::<std::net::IpAddr>()
                .ok()
                .map(|ip| SocketAddr::new(ip, 111));
            return with_port.or(bare).map(Backend::Rpcbind).ok_or_else(|| {
                serde::de::Error::custom(format!(
                    "backend `{s}`: after rpcbind:// an IP address is expected (optionally IP:PORT; host names are not resolved)"
                ))
            });
        }
        s.parse().map(Backend::Tcp).map_err(|_| {
            serde::de::Error::custom(format!(
                "backend `{s}` is neither IP:PORT nor rpcbind://IP (host names are not resolved)"
            ))
        })
    }
}

/// `[transport]`: RPC-over-RDMA v1 parameters (RFC 8166 s3.3, RFC 5666 s6).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Transport {
    /// Credits granted per connection (receives posted per connection).
    pub credits: u32,
    /// Largest inline call accepted, bytes (the receive buffer size;
    /// CONF_RDMA `maxcall_sendsize`, RFC 8797 `max_recv_size`).
    pub inline_receive: u32,
    /// Largest inline reply sent, bytes (RFC 8797 `max_send_size`).
    pub inline_send: u32,
    /// RDMA Reads the responder keeps in flight per connection (CONF_RDMA
    /// `maxrdmaread`).
    pub max_rdma_read: u32,
    /// Largest RPC call or reply message in bytes, bulk data included
    /// (what a read chunk may bring in, what a reply may carry out).
    /// Every credit reserves this much (sparse) memory per connection.
    pub max_message: u32,
    /// Seconds without a received message (and nothing in flight) after
    /// which an RDMA connection is closed; 0: never.
    pub idle_timeout_s: u32,
    /// RPC-over-RDMA extensions offered to clients that ask with CONF_RDMA
    /// version 2 (docs/EXTENSIONS.md); a Version One client never sees
    /// one. Empty by default. Names as `dataplane::extension_names`; any
    /// other is refused by the check, at its line.
    pub extensions: Vec<String>,
}

impl Transport {
    /// The extensions `transport.extensions` names, as one set (a name
    /// that is not an extension, which the check refuses, counts for
    /// nothing).
    pub fn extension_set(&self) -> dataplane::engine::Extensions {
        self.extensions
            .iter()
            .filter_map(|n| dataplane::extension_names::by_name(n))
            .fold(dataplane::engine::Extensions::EMPTY, |acc, e| acc.union(e))
    }
}

/// Default `transport.max_message`: 1 MiB of data plus 4 KiB of headers.
pub const DEFAULT_MAX_MESSAGE: u32 = (1 << 20) + 4096;

impl Default for Transport {
    fn default() -> Self {
        Transport {
            credits: 64,
            inline_receive: 4096,
            inline_send: 4096,
            max_rdma_read: 16,
            max_message: DEFAULT_MAX_MESSAGE,
            // Linux's RPC server ages idle transports out on this period
            // (as our TCP connections do).
            idle_timeout_s: 360,
            extensions: Vec::new(),
        }
    }
}

/// `[chunks]`: limits on the chunk lists of a received transport header;
/// the names and defaults of `dataplane::wire::rpcrdma::Limits`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Chunks {
    /// Read list entries over all read chunks.
    pub max_read_segments: usize,
    /// Chunks in the write list.
    pub max_write_chunks: usize,
    /// Segments in any one write chunk.
    pub max_segments_per_chunk: usize,
    /// Segments in the reply chunk.
    pub max_reply_segments: usize,
}

impl Default for Chunks {
    fn default() -> Self {
        Chunks::from(dataplane::wire::rpcrdma::Limits::DEFAULT)
    }
}

impl From<dataplane::wire::rpcrdma::Limits> for Chunks {
    fn from(l: dataplane::wire::rpcrdma::Limits) -> Self {
        Chunks {
            max_read_segments: l.max_read_segments,
            max_write_chunks: l.max_write_chunks,
            max_segments_per_chunk: l.max_segments_per_chunk,
            max_reply_segments: l.max_reply_segments,
        }
    }
}

impl Chunks {
    /// The limits in the form the header codec takes.
    pub fn to_wire_limits(&self) -> dataplane::wire::rpcrdma::Limits {
        dataplane::wire::rpcrdma::Limits {
            max_read_segments: self.max_read_segments,
            max_write_chunks: self.max_write_chunks,
            max_segments_per_chunk: self.max_segments_per_chunk,
            max_reply_segments: self.max_reply_segments,
        }
    }
}

/// `[memory]`: registered memory.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Memory {
    /// Whether the worker arenas use 2 MiB hugepages.
    pub hugepages: Hugepages,
}

impl Default for Memory {
    fn default() -> Self {
        Memory {
            hugepages: Hugepages::Prefer,
        }
    }
}

/// Hugepage policy of the worker arenas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hugepages {
    /// Never: 4 KiB pages.
    Off,
    /// Use hugepages when the host has them free, else warn once and use
    /// 4 KiB pages.
    Prefer,
    /// Refuse to start without free hugepages.
    Required,
}

/// `[rpcbind]`: registration of the served programs.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Rpcbind {
    /// Whether to register at start and unregister at shutdown.
    pub register: bool,
    /// rpcbind's address: `IP:PORT` (TCP) or an absolute path (its local
    /// socket, e.g. `/run/rpcbind.sock`).
    pub address: RpcbindAddress,
    /// Timeout of each connect, send and receive, in milliseconds.
    pub timeout_ms: u32,
}

impl Default for Rpcbind {
    fn default() -> Self {
        Rpcbind {
            register: true,
            address: RpcbindAddress::Tcp(SocketAddr::from(([127, 0, 0, 1], 111))),
            timeout_ms: 1000,
        }
    }
}

/// `[metrics]`: the Prometheus exporter.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Metrics {
    /// Whether to serve `/metrics`.
    pub enabled: bool,
    /// Address of the HTTP listener.
    #[serde(deserialize_with = "socket_addr")]
    pub address: SocketAddr,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            enabled: true,
            address: SocketAddr::from(([127, 0, 0, 1], 9464)),
        }
    }
}

/// `[shm]`: who may connect to `shm` listeners.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Shm {
    /// Peer uids (SO_PEERCRED) allowed besides the daemon's own uid; empty
    /// means the daemon's uid only.
    pub allowed_uids: Vec<u32>,
    /// Connections one peer uid may have open at once on each shm
    /// listener; 0: no limit. Its own key, not TCP's per-address one: a
    /// uid is not an address, and with the default allow-list (the
    /// daemon's uid alone) a cap per uid would only be a second
    /// `workers.max_connections`.
    pub max_connections_per_uid: u32,
}

/// `[shutdown]`: what SIGINT/SIGTERM do.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Shutdown {
    /// How long in-flight RPCs may take to finish, in milliseconds.
    pub grace_ms: u32,
}

impl Default for Shutdown {
    fn default() -> Self {
        Shutdown { grace_ms: 5000 }
    }
}

/// `[control]`: the local socket `rpcrdmad status` talks to.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Control {
    /// Path of the Unix stream socket (absolute). Mode 0600: only root
    /// and the daemon's user reach it, and the daemon checks the peer's
    /// uid as well.
    pub socket: PathBuf,
}

/// The default control socket.
pub const DEFAULT_CONTROL_SOCKET: &str = "/run/rpcrdma/rpcrdmad.ctl";

impl Default for Control {
    fn default() -> Self {
        Control {
            socket: PathBuf::from(DEFAULT_CONTROL_SOCKET),
        }
    }
}

/// `[log]`: what is logged.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Log {
    /// The least severe level written: `error`, `warn`, `info`, `debug`
    /// or `trace` (`RPCRDMAD_LOG`, when set, wins).
    pub level: LogLevel,
}

impl Default for Log {
    fn default() -> Self {
        Log {
            level: LogLevel::Info,
        }
    }
}

/// `log.level`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    /// Errors only.
    Error,
    /// Warnings and errors.
    Warn,
    /// What the daemon does (the default).
    Info,
    /// Details of connection setup and teardown.
    Debug,
    /// Everything.
    Trace,
}

impl LogLevel {
    /// The `tracing` level.
    pub fn level(self) -> tracing::Level {
        match self {
            LogLevel::Error => tracing::Level::ERROR,
            LogLevel::Warn => tracing::Level::WARN,
            LogLevel::Info => tracing::Level::INFO,
            LogLevel::Debug => tracing::Level::DEBUG,
            LogLevel::Trace => tracing::Level::TRACE,
        }
    }
}

/// Facts about the host that a configuration is checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFacts {
    /// CPU ids this process may run on (its affinity mask).
    pub cores: Vec<usize>,
}

impl HostFacts {
    /// The facts of the machine this process runs on.
    pub fn current() -> Self {
        let cores = core_affinity::get_core_ids()
            .map(|ids| ids.into_iter().map(|c| c.id).collect())
            .unwrap_or_else(|| {
                (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect()
            });
        HostFacts { cores }
    }
}

/// A configuration error, rendered as one line `FILE:LINE: message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file as named by the operator (or `<built-in defaults>`).
    pub file: String,
    /// 1-based line; `None` when the file could not be read.
    pub line: Option<usize>,
    /// What is wrong, one line.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{}: {}", self.file, line, self.message),
            None => write!(f, "{}: {}", self.file, self.message),
        }
    }
}

impl std::error::Error for ConfigError {}

/// One step of a path to a key: a table key or an array index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seg {
    Key(&'static str),
    Index(usize),
}

/// A semantic error: where (a key path) and what.
struct Semantic {
    path: Vec<Seg>,
    message: String,
}

fn sem(path: &[Seg], message: impl Into<String>) -> Semantic {
    Semantic {
        path: path.to_vec(),
        message: message.into(),
    }
}

use Seg::{Index, Key};

impl Config {
    /// Reads and checks the file at `path` against this host.
    ///
    /// # Errors
    /// A [`ConfigError`] naming `path` (as given) and the line.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: file.clone(),
            line: None,
            message: format!("cannot read the configuration: {e}"),
        })?;
        Config::parse(&text, &file, &HostFacts::current())
    }

    /// Parses `text` (named `file` in errors) and checks it, against
    /// `host` for the host-dependent rules.
    ///
    /// # Errors
    /// A [`ConfigError`] for the first problem found.
    pub fn parse(text: &str, file: &str, host: &HostFacts) -> Result<Config, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|e| ConfigError {
            file: file.to_string(),
            line: Some(e.span().map_or(1, |s| line_of_offset(text, s.start))),
            message: one_line(e.message()),
        })?;
        if let Err(s) = config.check(host) {
            return Err(ConfigError {
                file: file.to_string(),
                line: Some(line_of_path(text, &s.path)),
                message: s.message,
            });
        }
        Ok(config)
    }

    /// Checks the built-in defaults against `host` (an error names
    /// `<built-in defaults>`).
    ///
    /// # Errors
    /// As [`parse`](Self::parse).
    pub fn check_defaults(&self, host: &HostFacts) -> Result<(), ConfigError> {
        self.check(host).map_err(|s| ConfigError {
            file: "<built-in defaults>".into(),
            line: None,
            message: s.message,
        })
    }

    /// The rules serde cannot express.
    fn check(&self, host: &HostFacts) -> Result<(), Semantic> {
        const CORES: [Seg; 2] = [Key("workers"), Key("cores")];
        let w = &self.workers;
        if w.cores.is_empty() {
            return Err(sem(
                &CORES,
                "workers.cores is empty: list at least one CPU id",
            ));
        }
        let mut seen = HashSet::new();
        for (i, &core) in w.cores.iter().enumerate() {
            let at = [Key("workers"), Key("cores"), Index(i)];
            if !seen.insert(core) {
                return Err(sem(
                    &at,
                    format!("workers.cores: core {core} is listed twice"),
                ));
            }
            if !host.cores.contains(&core) {
                return Err(sem(
                    &at,
                    format!(
                        "workers.cores: core {core} is not available on this host (usable cores: {})",
                        core_ranges(&host.cores)
                    ),
                ));
            }
        }
        range(
            &[Key("workers"), Key("park_max_us")],
            "workers.park_max_us",
            w.park_max_us.into(),
            1,
            1_000_000,
        )?;
        range(
            &[Key("workers"), Key("max_connections")],
            "workers.max_connections",
            w.max_connections.into(),
            1,
            1_000_000,
        )?;
        range(
            &[Key("workers"), Key("max_connections_per_peer")],
            "workers.max_connections_per_peer",
            w.max_connections_per_peer.into(),
            0,
            1_000_000,
        )?;
        range(
            &[Key("shm"), Key("max_connections_per_uid")],
            "shm.max_connections_per_uid",
            self.shm.max_connections_per_uid.into(),
            0,
            1_000_000,
        )?;
        range(
            &[Key("workers"), Key("control_ring")],
            "workers.control_ring",
            w.control_ring.into(),
            1,
            65_536,
        )?;

        if self.listeners.is_empty() {
            return Err(sem(
                &[Key("listeners")],
                "no listeners: add at least one [[listeners]] table with a url",
            ));
        }
        let mut urls = HashSet::new();
        let mut ports = std::collections::HashMap::new();
        for (i, l) in self.listeners.iter().enumerate() {
            let at = [Key("listeners"), Index(i), Key("url")];
            if !urls.insert(&l.url) {
                return Err(sem(&at, format!("listener {} is listed twice", l.url)));
            }
            if let Some(a) = l.url.socket_addr() {
                // roce/ibverbs share the RDMA service port space; tcp has
                // its own.
                let space = matches!(l.url, ProviderUrl::Tcp(_));
                if let Some(prev) = ports.insert((space, a), &l.url) {
                    return Err(sem(
                        &at,
                        format!("listener {} uses the address of listener {prev}", l.url),
                    ));
                }
                if space && self.metrics.enabled && a == self.metrics.address {
                    return Err(sem(
                        &at,
                        format!("listener {} uses the metrics address {a}", l.url),
                    ));
                }
            }
        }

        if !self.control.socket.is_absolute() {
            return Err(sem(
                &[Key("control"), Key("socket")],
                format!(
                    "control.socket = {:?} is not an absolute path",
                    self.control.socket.display().to_string()
                ),
            ));
        }
        if self
            .listeners
            .iter()
            .any(|l| matches!(&l.url, ProviderUrl::Shm { path } if *path == self.control.socket))
        {
            return Err(sem(
                &[Key("control"), Key("socket")],
                format!(
                    "control.socket {} is the socket of an shm listener; choose another path",
                    self.control.socket.display()
                ),
            ));
        }

        let t = &self.transport;
        range(
            &[Key("transport"), Key("credits")],
            "transport.credits",
            t.credits.into(),
            1,
            4096,
        )?;
        range(
            &[Key("transport"), Key("inline_receive")],
            "transport.inline_receive",
            t.inline_receive.into(),
            1024,
            65536,
        )?;
        range(
            &[Key("transport"), Key("inline_send")],
            "transport.inline_send",
            t.inline_send.into(),
            1024,
            65536,
        )?;
        range(
            &[Key("transport"), Key("max_rdma_read")],
            "transport.max_rdma_read",
            t.max_rdma_read.into(),
            1,
            128,
        )?;
        range(
            &[Key("transport"), Key("max_message")],
            "transport.max_message",
            t.max_message.into(),
            4096,
            (64 << 20) + 4096,
        )?;
        range(
            &[Key("transport"), Key("idle_timeout_s")],
            "transport.idle_timeout_s",
            t.idle_timeout_s.into(),
            0,
            7 * 24 * 3600,
        )?;
        for (i, name) in t.extensions.iter().enumerate() {
            if dataplane::extension_names::by_name(name).is_none() {
                return Err(sem(
                    &[Key("transport"), Key("extensions"), Index(i)],
                    format!(
                        "transport.extensions: {}",
                        dataplane::extension_names::unknown(name)
                    ),
                ));
            }
        }
        if t.max_message % 4 != 0 {
            return Err(sem(
                &[Key("transport"), Key("max_message")],
                format!(
                    "transport.max_message = {} is not a multiple of 4 (XDR units)",
                    t.max_message
                ),
            ));
        }
        // The pool is one registration: 4 GiB at most, as any region
        // (SGE offsets are 32-bit).
        let bulk = [Key("workers"), Key("bulk_buffers")];
        range(
            &bulk,
            "workers.bulk_buffers",
            w.bulk_buffers.into(),
            0,
            65536,
        )?;
        let srq = [Key("workers"), Key("shared_receives")];
        range(
            &srq,
            "workers.shared_receives",
            w.shared_receives.into(),
            0,
            16384,
        )?;
        // Every connection reserves one receive of its worker's queue at
        // least; connections spread over the workers.
        let per_worker = w.max_connections.div_ceil(w.cores.len().max(1) as u32);
        if w.shared_receives > 0 && w.shared_receives < per_worker {
            return Err(sem(
                &srq,
                format!(
                    "workers.shared_receives = {} cannot back the {} connections a worker may hold (workers.max_connections = {} over {} cores; each needs one receive at least); raise it to {} or more, or set 0 for receives per connection",
                    w.shared_receives,
                    per_worker,
                    w.max_connections,
                    w.cores.len().max(1),
                    2 * per_worker
                ),
            ));
        }
        let pool = dataplane::engine::BulkPool::memory_len(w.bulk_buffers, t.max_message) as u64;
        if pool > u64::from(u32::MAX) {
            return Err(sem(
                &bulk,
                format!(
                    "workers.bulk_buffers = {} of transport.max_message = {} bytes is {} MiB per worker and provider, over the 4 GiB a registration holds; lower either",
                    w.bulk_buffers,
                    t.max_message,
                    pool >> 20
                ),
            ));
        }

        let c = &self.chunks;
        for (key, v) in [
            ("max_read_segments", c.max_read_segments),
            ("max_write_chunks", c.max_write_chunks),
            ("max_segments_per_chunk", c.max_segments_per_chunk),
            ("max_reply_segments", c.max_reply_segments),
        ] {
            range(
                &[Key("chunks"), Key(key)],
                &format!("chunks.{key}"),
                v as u64,
                1,
                1024,
            )?;
        }

        let mut programs = HashSet::new();
        for (i, g) in self.gateway.iter().enumerate() {
            let at = |k| [Key("gateway"), Index(i), Key(k)];
            if !programs.insert(g.program) {
                return Err(sem(
                    &at("program"),
                    format!("gateway: program {} is routed twice", g.program),
                ));
            }
            if g.program == dataplane::wire::conf::CONFIG_RDMA_PROG {
                return Err(sem(
                    &at("program"),
                    "gateway: program 100417 (CONF_RDMA) is the transport's own; it cannot be relayed",
                ));
            }
            if g.versions.is_empty() {
                return Err(sem(
                    &at("versions"),
                    format!("gateway: program {} lists no versions", g.program),
                ));
            }
            range(
                &at("connections"),
                "gateway.connections",
                g.connections.into(),
                1,
                64,
            )?;
        }

        range(
            &[Key("rpcbind"), Key("timeout_ms")],
            "rpcbind.timeout_ms",
            self.rpcbind.timeout_ms.into(),
            1,
            60_000,
        )?;
        range(
            &[Key("shutdown"), Key("grace_ms")],
            "shutdown.grace_ms",
            self.shutdown.grace_ms.into(),
            0,
            600_000,
        )?;
        Ok(())
    }
}

fn range(path: &[Seg], name: &str, v: u64, min: u64, max: u64) -> Result<(), Semantic> {
    if (min..=max).contains(&v) {
        Ok(())
    } else {
        Err(sem(
            path,
            format!("{name} = {v} is out of range {min}..={max}"),
        ))
    }
}

/// `0-3,6` style rendering of a core list.
fn core_ranges(cores: &[usize]) -> String {
    let mut v = cores.to_vec();
    v.sort_unstable();
    v.dedup();
    let mut out = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let start = v[i];
        while i + 1 < v.len() && v[i + 1] == v[i] + 1 {
            i += 1;
        }
        out.push(if v[i] == start {
            start.to_string()
        } else {
            format!("{start}-{}", v[i])
        });
        i += 1;
    }
    if out.is_empty() {
        "none".into()
    } else {
        out.join(",")
    }
}

/// Collapses a possibly multi-line parser message into one line.
fn one_line(msg: &str) -> String {
    msg.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

/// 1-based line of byte `offset` in `text`.
pub(crate) fn line_of_offset(text: &str, offset: usize) -> usize {
    let offset = offset.min(text.len());
    text.as_bytes()[..offset]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// The line of the deepest element of `path` present in `text`: the key's
/// own line for keys, the element's line for array indices; line 1 when
/// not even the first element is there (the value is a default).
fn line_of_path(text: &str, path: &[Seg]) -> usize {
    use toml::de::{DeTable, DeValue};
    let Ok(root) = DeTable::parse(text) else {
        return 1;
    };
    let mut best = 1;
    let mut table: Option<&DeTable<'_>> = Some(root.get_ref());
    let mut value: Option<&DeValue<'_>> = None;
    for seg in path {
        match *seg {
            Key(k) => {
                let Some(t) = table else { break };
                let Some((key, v)) = t.iter().find(|(key, _)| key.get_ref() == k) else {
                    break;
                };
                best = line_of_offset(text, key.span().start);
                value = Some(v.get_ref());
                table = v.get_ref().as_table();
            }
            Index(i) => {
                let Some(DeValue::Array(a)) = value else {
                    break;
                };
                let Some(v) = a.get(i) else { break };
                best = line_of_offset(text, v.span().start);
                value = Some(v.get_ref());
                table = v.get_ref().as_table();
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(n: usize) -> HostFacts {
        HostFacts {
            cores: (0..n).collect(),
        }
    }

    #[test]
    fn empty_file_is_the_default() {
        assert_eq!(
            Config::parse("", "t.toml", &host(1)).unwrap(),
            Config::default()
        );
    }

    #[test]
    fn provider_urls_parse() {
        assert_eq!(
            "shm:///run/x.sock".parse::<ProviderUrl>(),
            Ok(ProviderUrl::Shm {
                path: "/run/x.sock".into()
            })
        );
        assert_eq!(
            "roce://127.0.0.1:20049".parse::<ProviderUrl>(),
            Ok(ProviderUrl::Roce("127.0.0.1:20049".parse().unwrap()))
        );
        assert_eq!(
            "ibverbs://[::1]:20049".parse::<ProviderUrl>(),
            Ok(ProviderUrl::Ibverbs("[::1]:20049".parse().unwrap()))
        );
        assert_eq!(
            "tcp://0.0.0.0:2049".parse::<ProviderUrl>(),
            Ok(ProviderUrl::Tcp("0.0.0.0:2049".parse().unwrap()))
        );
        for bad in [
            "shm://relative.sock",
            "roce://localhost:1",
            "roce://127.0.0.1:0",
            "iwarp://1.2.3.4:5",
            "127.0.0.1:5",
        ] {
            assert!(bad.parse::<ProviderUrl>().is_err(), "{bad}");
        }
        for good in ["shm:///a/b.sock", "roce://127.0.0.1:20049", "tcp://[::1]:7"] {
            assert_eq!(good.parse::<ProviderUrl>().unwrap().to_string(), good);
        }
    }

    #[test]
    fn core_ranges_render() {
        assert_eq!(core_ranges(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
        assert_eq!(core_ranges(&[3]), "3");
        assert_eq!(core_ranges(&[]), "none");
    }

    #[test]
    fn semantic_error_points_at_the_array_element() {
        let text = "[workers]\ncores = [\n  0,\n  1,\n  9,\n]\n";
        let e = Config::parse(text, "c.toml", &host(2)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "c.toml:5: workers.cores: core 9 is not available on this host (usable cores: 0-1)"
        );
    }
}
