//! The requester API: an RPC-over-RDMA client on one connection
//! (docs/WORKER.md, "Client").
//!
//! The caller's thread drives it (no hidden threads): [`Client::call`]
//! encodes a call into the client's preallocated buffer and queues it,
//! [`Client::poll`] makes progress and returns finished calls,
//! [`Client::wait`] busy-polls with the configured idle strategy until one
//! call finishes. Replies are read in place ([`Client::reply`],
//! [`Client::ddp`]) and given back with [`Client::release`]. Calls pipeline
//! up to the engine's `max_outstanding_calls` (and the server's grant).
//! Nothing allocates per call in steady state.
//!
//! Application memory and directed operations (docs/CLIENT.md): with
//! `endpoint.engine.app_memory` bytes configured, [`Client::register`]
//! hands out keys ([`MemKey`]) for ranges of memory registered once with
//! the connection; [`Client::call_directed`] uses them as the call's
//! read-chunk source and/or write-chunk target, numbers the operation
//! ([`OpId`], increasing), and [`Client::barrier`] reports the high-water
//! mark of completed operations, after the RDS zero-copy proposal.
use std::collections::VecDeque;
use std::time::Duration;

use crate::engine::{
    self, decode_conf_rdma_reply, decode_conf_rdma_reply_v2, encode_conf_rdma_call,
    encode_conf_rdma_call_v2, AppChunks, CallFailure, CallHandle, ConfRdmaError, DdpItem, Event,
    Extensions, OutgoingCall, ReplyExpect, SendCallError,
};
use crate::mem::PeerBytes;
use crate::verbs::shm::Shm;
use crate::verbs::{Completion, Context, Provider, VerbsError};
use crate::wire::conf::ConfigRdmaReply;
use crate::wire::conf2::is_plain_version_one;
use crate::wire::rpcrdma::MIN_CHUNKED_HEADER_LEN;
use crate::worker::{Endpoint, EndpointConfig, EndpointError, IdleStrategy, Idler, POLL_BURST};

/// Client configuration.
#[derive(Debug, Clone, Copy)]
pub struct ClientConfig {
    /// Engine limits and queue depths of the connection.
    pub endpoint: EndpointConfig,
    /// Run the CONF_RDMA exchange (RFC 5666 s6) right after connecting and
    /// apply the server's limits before any other call. Non-empty
    /// `extensions` run it too.
    pub conf_rdma: bool,
    /// RPC-over-RDMA extensions to offer the server (docs/EXTENSIONS.md;
    /// names in `extension_names`). Default: none, a plain Version One
    /// client. When non-empty, the connection's engine configuration gets
    /// them (added to `endpoint.engine.extensions`) and CONF_RDMA runs at
    /// connect as version 2, whether or not `conf_rdma` is set: the client
    /// advertises what it both wants and implements
    /// (`Connection::advertised_extensions`), and uses only what the
    /// server advertised too ([`Client::negotiated`]). A server that
    /// answers as plain Version One (PROG_MISMATCH, PROG_UNAVAIL,
    /// PROC_UNAVAIL) gets the version 1 exchange for the limits instead,
    /// and nothing is negotiated.
    pub extensions: Extensions,
    /// How [`Client::wait`] waits.
    pub idle: IdleStrategy,
    /// How long [`Client::wait`] (and the CONF_RDMA exchange) waits at most.
    pub wait_timeout: Duration,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            endpoint: EndpointConfig::default(),
            conf_rdma: false,
            extensions: Extensions::EMPTY,
            idle: IdleStrategy::default(),
            wait_timeout: Duration::from_secs(30),
        }
    }
}

/// Where the reply of a call should land (the requester's chunk choice,
/// RFC 5666 s3.4, s5.2; the engine then decides per call).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyTarget {
    /// The reply, with its transport header, is expected to fit our
    /// inline receive size: no reply chunk is offered (unless the peer
    /// announced a smaller inline send size than ours).
    Inline,
    /// The reply's DDP-eligible result (up to `max_ddp` bytes) goes by RDMA
    /// Write into this call slot's DDP buffer: registered once with the
    /// connection and reused by every call, no registration per call. The
    /// rest of the reply may be up to `max_reply_size` (a reply chunk is
    /// offered when it might not fit inline).
    WriteChunk {
        /// Largest DDP result.
        max_ddp: u32,
    },
    /// The reply may be long: offer a reply chunk of `max_reply_size`.
    ReplyChunk,
}

/// How a call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallOutcome {
    /// The reply arrived: read it with [`Client::reply`] / [`Client::ddp`],
    /// then [`Client::release`] it.
    Reply {
        /// Reply message length.
        len: u32,
        /// Bytes placed in the write chunk, if the server used it.
        ddp_len: Option<u32>,
    },
    /// The call failed (its handle is no longer valid).
    Failed(CallFailure),
}

/// Client errors.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Building or connecting the endpoint failed.
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    /// Opening the provider failed.
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    /// The engine refused the call.
    #[error("call refused: {0}")]
    Call(#[from] SendCallError),
    /// The encoder did not produce a message (buffer too small).
    #[error("call message does not fit max_call_size")]
    Encode,
    /// The connection is closed.
    #[error("connection closed ({0:?})")]
    Closed(engine::CloseReason),
    /// Nothing happened within `wait_timeout`.
    #[error("timed out waiting for the reply")]
    Timeout,
    /// The CONF_RDMA exchange failed.
    #[error("CONF_RDMA exchange failed: {0}")]
    ConfRdma(String),
    /// Closing left resources in use.
    #[error("resources still in use after close: {0:?}")]
    Leak(engine::Resources),
    /// A [`MemKey`] that is not (or no longer) registered.
    #[error("unknown or deregistered memory key")]
    BadKey,
    /// A range outside its registered region.
    #[error("range {offset}+{len} outside the registered region of {region_len} bytes")]
    OutOfRange {
        /// Offset asked for.
        offset: u32,
        /// Length asked for.
        len: u32,
        /// The region's length.
        region_len: u32,
    },
    /// The range belongs to an operation in flight until it completes
    /// (see [`Client::barrier`]).
    #[error("range in use by directed operation {0:?} until it completes")]
    InFlight(OpId),
    /// No room for the region in the connection's application memory, or
    /// every region slot taken.
    #[error("cannot register {len} bytes: {why} (configure endpoint.engine.app_memory)")]
    NoAppMemory {
        /// Bytes asked for.
        len: u32,
        /// What ran out.
        why: &'static str,
    },
}

/// Regions a client registers at most at once.
pub const MAX_REGIONS: usize = 64;

/// Further descriptors a sleeping client waits on besides its queue's
/// doorbell (`CompletionQueue::watch_also`: a `roce` connection's device
/// socket); more are left out, and their news comes through the doorbell.
const CLIENT_WATCH_ALSO: usize = 3;

/// A key for a registered range of the connection's application memory
/// (the RDS proposal's "key": obtained once, used by many directed
/// operations). Valid on this client's connection only, until
/// [`Client::deregister`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MemKey {
    index: u32,
    generation: u32,
}

/// A byte range of a registered region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemRange {
    /// The region.
    pub key: MemKey,
    /// Offset in the region.
    pub offset: u32,
    /// Length in bytes.
    pub len: u32,
}

/// What a directed operation moves through application memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Directed {
    /// The call's DDP-eligible argument: the server pulls it from here by
    /// RDMA Read (a read chunk, RFC 5666 s3.4). The encoded message then
    /// stops after the item's length word and continues after its data
    /// and padding (the data is not copied into the message).
    pub source: Option<MemRange>,
    /// The reply's DDP-eligible result: the server RDMA-writes it here (a
    /// write chunk, RFC 5666 s3.6).
    pub target: Option<MemRange>,
}

/// A directed operation's number: increasing by one per operation on a
/// client, starting at 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OpId(pub u64);

/// What [`Client::barrier`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Barrier {
    /// Every operation up to and including this one has completed
    /// (replied or failed); `OpId(0)` when none has.
    pub high_water: OpId,
    /// Whether the operation asked about (and all before it) completed.
    pub complete: bool,
}

/// A registered region: its place in the application memory.
#[derive(Debug, Clone, Copy, Default)]
struct Region {
    start: u32,
    len: u32,
    generation: u32,
    live: bool,
    /// Directed operations in flight on it.
    in_flight: u32,
}

/// A range of the application memory and the region it belongs to.
#[derive(Debug, Clone, Copy)]
struct Span {
    /// Offset in the application memory (not in the region).
    start: u32,
    len: u32,
    region: u32,
}

/// A directed operation in flight, by call slot.
#[derive(Debug, Clone, Copy, Default)]
struct OpSlot {
    op: u64,
    active: bool,
    source: Option<Span>,
    target: Option<Span>,
}

fn overlaps(a: (u32, u32), b: (u32, u32)) -> bool {
    let (a0, a1) = (u64::from(a.0), u64::from(a.0) + u64::from(a.1));
    let (b0, b1) = (u64::from(b.0), u64::from(b.0) + u64::from(b.1));
    a0 < b1 && b0 < a1
}

/// An RPC-over-RDMA client connection.
pub struct Client<P: Provider = Shm> {
    // Drop order: the endpoint (queue pair, CQ, memory) before the PD and
    // the context it came from.
    ep: Endpoint<P>,
    _pd: P::Pd,
    _ctx: P::Context,
    call_buf: Box<[u8]>,
    wcs: Vec<Completion>,
    done: VecDeque<(CallHandle, CallOutcome)>,
    clock: crate::clock::MonoClock,
    config: ClientConfig,
    next_xid: u32,
    conf: Option<ConfigRdmaReply>,
    regions: Vec<Region>,
    /// Directed operations by call slot index.
    ops: Vec<OpSlot>,
    next_op: u64,
}

impl<P: Provider> core::fmt::Debug for Client<P> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Client")
            .field("endpoint", &self.ep)
            .field("done", &self.done.len())
            .finish()
    }
}

impl<P: Provider> Client<P> {
    /// Connects to `url` and, if configured, runs CONF_RDMA.
    ///
    /// # Errors
    /// [`ClientError::Verbs`] / [`ClientError::Endpoint`] for setup,
    /// [`ClientError::ConfRdma`] when the exchange fails.
    pub fn connect(url: &str, mut config: ClientConfig) -> Result<Client<P>, ClientError> {
        // What we offer is part of the connection's engine configuration,
        // so that `advertised_extensions` reflects it.
        config.endpoint.engine.extensions =
            config.endpoint.engine.extensions.union(config.extensions);
        let ctx = P::open(url)?;
        let pd = ctx.alloc_pd()?;
        let prepared = crate::worker::PreparedEndpoint::<P>::new(&ctx, &pd, &config.endpoint)?;
        let ep = prepared.connect(url)?;
        let slots = config.endpoint.engine.max_outstanding_calls as usize;
        let mut client = Client {
            ep,
            _pd: pd,
            _ctx: ctx,
            call_buf: vec![0u8; config.endpoint.engine.max_call_size as usize].into_boxed_slice(),
            wcs: (0..POLL_BURST).map(|_| Completion::default()).collect(),
            done: VecDeque::with_capacity(slots * 2 + 4),
            clock: crate::clock::MonoClock::new(),
            config,
            // Start somewhere unpredictable-ish per connection.
            next_xid: std::process::id().wrapping_mul(0x9e37_79b9),
            conf: None,
            regions: Vec::with_capacity(MAX_REGIONS),
            ops: vec![OpSlot::default(); slots],
            next_op: 1,
        };
        if !config.extensions.is_empty() {
            client.conf_rdma_v2()?;
        } else if config.conf_rdma {
            client.conf_rdma()?;
        }
        Ok(client)
    }

    /// When every call slot is held only by finished calls whose Sends
    /// have not completed yet (their replies came in ahead of the
    /// acknowledgements, which a transport may deliver later), makes
    /// progress until one frees, for at most `wait_timeout`: the caller
    /// gets a slot instead of `NoSlot`. With `max_outstanding_calls`
    /// calls really outstanding it returns at once.
    fn wait_for_draining_slot(&mut self) {
        let max = self.config.endpoint.engine.max_outstanding_calls;
        let draining = |c: &Client<P>| {
            c.ep.connection().free_call_slots() == 0
                && c.outstanding() < max
                && c.ep.close_reason().is_none()
        };
        if !draining(self) {
            return;
        }
        let mut idler = Idler::new(self.config.idle);
        let start = std::time::Instant::now();
        while draining(self) && start.elapsed() <= self.config.wait_timeout {
            if self.progress() > 0 {
                idler.reset();
            } else {
                self.idle(&mut idler);
            }
        }
    }

    /// Waits as `idler` says; before it parks, the connection's
    /// completion queue is told (`CompletionQueue::before_sleep`) and,
    /// where its provider rings one, the park sleeps on its doorbell: a
    /// reply wakes the client at once, not at the park's timeout.
    fn idle(&self, idler: &mut Idler) {
        if !idler.will_park() {
            idler.idle(None);
            return;
        }
        self.ep.before_sleep();
        let mut fds = [crate::wake::pollfd(-1); 1 + CLIENT_WATCH_ALSO];
        // Until the doorbell or the engine's next deadline; a short nap
        // where the provider rings nothing.
        let mut until = self
            .ep
            .poll_timeout()
            .map(|t| t.saturating_duration_since(self.now()));
        let n = match self.ep.wakeup_fd() {
            Some(fd) => {
                fds[0] = crate::wake::pollfd(fd);
                1
            }
            None => {
                until = crate::worker::unrung(until);
                0
            }
        };
        if self.ep.arm_wakeup() {
            let mut n = n;
            if n == 1 {
                self.ep.watch_also(&mut |fd| {
                    if let Some(slot) = fds.get_mut(n) {
                        *slot = crate::wake::pollfd(fd);
                        n += 1;
                    }
                });
            }
            idler.idle_on(until, &mut fds[..n]);
        }
        self.ep.disarm_wakeup();
    }

    fn now(&self) -> engine::Instant {
        self.clock.now()
    }

    /// RFC 5666 s6: the first call on the connection; its answer sets our
    /// inline call size and Read limit.
    fn conf_rdma(&mut self) -> Result<(), ClientError> {
        self.conf_rdma_v1(true)
    }

    /// The version 1 exchange; unless `required`, a server without
    /// CONF_RDMA at all (PROG_UNAVAIL and the like, as from a Linux
    /// server, which does not implement the program) leaves the limits as
    /// they are instead of failing the connect.
    fn conf_rdma_v1(&mut self, required: bool) -> Result<(), ClientError> {
        let req = self.ep.connection().conf_rdma_request();
        let call = self.call(ReplyTarget::Inline, |xid, buf| {
            encode_conf_rdma_call(buf, xid, &req)
                .ok()
                .map(|n| (n, None))
        })?;
        match self.wait(call)? {
            CallOutcome::Reply { .. } => {
                let decoded = self
                    .reply(call)
                    .map(|r| decode_conf_rdma_reply(&r.to_vec()))
                    .ok_or_else(|| ClientError::ConfRdma("reply vanished".into()));
                self.release(call);
                match decoded? {
                    Ok(r) => {
                        self.ep.connection_mut().apply_conf_rdma_reply(&r);
                        self.conf = Some(r);
                        Ok(())
                    }
                    Err(ConfRdmaError::NotSuccessful(status))
                        if !required && is_plain_version_one(status) =>
                    {
                        Ok(())
                    }
                    Err(e) => Err(ClientError::ConfRdma(e.to_string())),
                }
            }
            CallOutcome::Failed(f) => Err(ClientError::ConfRdma(format!("{f:?}"))),
        }
    }

    /// CONF_RDMA version 2 (docs/EXTENSIONS.md, sections 2-3): our limits
    /// and advertised extensions; the server's limits and extensions come
    /// back and both sides use what both advertised. A plain Version One
    /// server (`conf2::is_plain_version_one`) gets the version 1 exchange
    /// for the limits, and nothing is negotiated.
    fn conf_rdma_v2(&mut self) -> Result<(), ClientError> {
        let req = self
            .ep
            .connection()
            .conf_rdma_request_v2()
            .map_err(|e| ClientError::ConfRdma(e.to_string()))?;
        let call = self.call(ReplyTarget::Inline, |xid, buf| {
            encode_conf_rdma_call_v2(buf, xid, &req)
                .ok()
                .map(|n| (n, None))
        })?;
        let reply = match self.wait(call)? {
            CallOutcome::Reply { .. } => {
                let decoded = self
                    .reply(call)
                    .map(|r| decode_conf_rdma_reply_v2(&r.to_vec()))
                    .ok_or_else(|| ClientError::ConfRdma("reply vanished".into()));
                self.release(call);
                decoded?
            }
            CallOutcome::Failed(f) => return Err(ClientError::ConfRdma(format!("{f:?}"))),
        };
        match reply {
            Ok(r) => {
                self.ep.connection_mut().apply_conf_rdma_reply_v2(&r);
                self.conf = Some(r.base);
                Ok(())
            }
            // A plain Version One server: the version 1 exchange for the
            // limits, if it has CONF_RDMA at all (Linux has not).
            Err(ConfRdmaError::NotSuccessful(status)) if is_plain_version_one(status) => {
                self.conf_rdma_v1(false)
            }
            Err(e) => Err(ClientError::ConfRdma(e.to_string())),
        }
    }

    /// The extensions in use on the connection: those both sides
    /// advertised in CONF_RDMA version 2 (empty without that exchange, or
    /// with a plain Version One server).
    pub fn negotiated(&self) -> Extensions {
        self.ep.connection().negotiated()
    }

    /// The server's CONF_RDMA answer, if the exchange ran (its version 1
    /// words, for either version).
    pub fn conf_rdma_reply(&self) -> Option<&ConfigRdmaReply> {
        self.conf.as_ref()
    }

    /// Queues a call. `encode(xid, buf)` writes the whole RPC call message
    /// (with that XID) into the client's buffer (`max_call_size` bytes) and
    /// returns its length and its DDP-eligible argument, or `None` if it
    /// does not fit.
    ///
    /// # Errors
    /// [`ClientError::Encode`], [`ClientError::Call`] (e.g. `NoSlot` when
    /// `max_outstanding_calls` are in flight: poll, then retry).
    pub fn call(
        &mut self,
        target: ReplyTarget,
        encode: impl FnOnce(u32, &mut [u8]) -> Option<(usize, Option<DdpItem>)>,
    ) -> Result<CallHandle, ClientError> {
        self.wait_for_draining_slot();
        let xid = self.next_xid;
        self.next_xid = self.next_xid.wrapping_add(1);
        let (len, ddp) = encode(xid, &mut self.call_buf).ok_or(ClientError::Encode)?;
        let cfg = self.ep.connection().config();
        let reply = match target {
            // The reply and its transport header (no chunk lists) fill at
            // most one receive buffer. Counting the whole buffer as reply
            // made every such call offer a reply chunk (the header would
            // not fit beside it), and a server that always uses an offered
            // reply chunk, as Linux's svcrdma does, then RDMA-Wrote every
            // NULL reply and sent RDMA_NOMSG (docs/INTEROP.md).
            ReplyTarget::Inline => ReplyExpect {
                max_len: cfg
                    .inline_recv_size
                    .saturating_sub(MIN_CHUNKED_HEADER_LEN as u32)
                    .min(cfg.max_reply_size),
                ddp_max: None,
            },
            ReplyTarget::ReplyChunk => ReplyExpect {
                max_len: cfg.max_reply_size,
                ddp_max: None,
            },
            ReplyTarget::WriteChunk { max_ddp } => ReplyExpect {
                max_len: cfg
                    .max_reply_size
                    .min(cfg.inline_recv_size.saturating_add(max_ddp)),
                ddp_max: Some(max_ddp.min(cfg.max_ddp_size)),
            },
        };
        let now = self.now();
        let call = OutgoingCall {
            message: self.call_buf.get(..len).ok_or(ClientError::Encode)?,
            ddp,
            reply,
            app: AppChunks::NONE,
        };
        let handle = self.ep.connection_mut().send_call(now, &call)?;
        self.ep.flush();
        Ok(handle)
    }

    /// Registers `len` bytes of the connection's application memory
    /// (`endpoint.engine.app_memory`) and returns their key. The memory
    /// was registered with the connection when it was set up: this only
    /// reserves a range of it (first fit, 64-byte aligned), so it is cheap,
    /// but it is meant to be done once and the key reused.
    ///
    /// # Errors
    /// [`ClientError::NoAppMemory`].
    pub fn register(&mut self, len: u32) -> Result<MemKey, ClientError> {
        let total = self.ep.connection().app_memory().len() as u64;
        let no = |why| ClientError::NoAppMemory { len, why };
        if len == 0 {
            return Err(no("empty region"));
        }
        // First fit: move past every live region in the way.
        let mut start = 0u64;
        loop {
            if start + u64::from(len) > total {
                return Err(no("not enough application memory left"));
            }
            let clash = self
                .regions
                .iter()
                .find(|r| r.live && overlaps((start as u32, len), (r.start, r.len)));
            match clash {
                None => break,
                Some(r) => start = (u64::from(r.start) + u64::from(r.len)).next_multiple_of(64),
            }
        }
        let region = Region {
            start: start as u32,
            len,
            generation: 0,
            live: true,
            in_flight: 0,
        };
        let index = match self.regions.iter().position(|r| !r.live) {
            Some(i) => {
                let generation = self.regions[i].generation;
                self.regions[i] = Region {
                    generation,
                    ..region
                };
                i
            }
            None if self.regions.len() < MAX_REGIONS => {
                self.regions.push(region);
                self.regions.len() - 1
            }
            None => return Err(no("every region slot is taken")),
        };
        Ok(MemKey {
            index: index as u32,
            generation: self.regions[index].generation,
        })
    }

    /// Deregisters `key`: it no longer names memory (a later use is
    /// [`ClientError::BadKey`]) and its range may be registered again.
    ///
    /// # Errors
    /// [`ClientError::BadKey`]; [`ClientError::InFlight`] while a directed
    /// operation uses the region.
    pub fn deregister(&mut self, key: MemKey) -> Result<(), ClientError> {
        let i = self.region_index(key)?;
        if self.regions[i].in_flight > 0 {
            let op = self.ops.iter().find(|o| {
                o.active
                    && (o.source.map(|s| s.region) == Some(i as u32)
                        || o.target.map(|t| t.region) == Some(i as u32))
            });
            return Err(ClientError::InFlight(OpId(op.map_or(0, |o| o.op))));
        }
        let r = &mut self.regions[i];
        r.live = false;
        r.generation = r.generation.wrapping_add(1);
        Ok(())
    }

    fn region_index(&self, key: MemKey) -> Result<usize, ClientError> {
        let i = key.index as usize;
        match self.regions.get(i) {
            Some(r) if r.live && r.generation == key.generation => Ok(i),
            _ => Err(ClientError::BadKey),
        }
    }

    /// The absolute range of `len` bytes at `offset` of `key`'s region.
    fn absolute(&self, key: MemKey, offset: u32, len: u32) -> Result<Span, ClientError> {
        let i = self.region_index(key)?;
        let r = self.regions[i];
        if u64::from(offset) + u64::from(len) > u64::from(r.len) {
            return Err(ClientError::OutOfRange {
                offset,
                len,
                region_len: r.len,
            });
        }
        Ok(Span {
            start: r.start + offset,
            len,
            region: i as u32,
        })
    }

    /// The first operation in flight whose range overlaps `range`:
    /// targets always, sources too when `sources`.
    fn busy(&self, range: (u32, u32), sources: bool) -> Option<OpId> {
        self.ops.iter().filter(|o| o.active).find_map(|o| {
            let hit = |r: Option<Span>| r.is_some_and(|r| overlaps(range, (r.start, r.len)));
            (hit(o.target) || (sources && hit(o.source))).then_some(OpId(o.op))
        })
    }

    /// `len` bytes at `offset` of a registered region, as a view to copy
    /// from (the server may write registered memory, so it is never a
    /// slice: `mem::PeerBytes`).
    ///
    /// # Errors
    /// [`ClientError::BadKey`], [`ClientError::OutOfRange`];
    /// [`ClientError::InFlight`] while the server may still write the
    /// range (a directed operation's target).
    pub fn region(&self, key: MemKey, offset: u32, len: u32) -> Result<PeerBytes<'_>, ClientError> {
        let Span { start, len, .. } = self.absolute(key, offset, len)?;
        if let Some(op) = self.busy((start, len), false) {
            return Err(ClientError::InFlight(op));
        }
        Ok(self
            .ep
            .connection()
            .app_memory()
            .sub(start as usize, len as usize)
            .unwrap_or(PeerBytes::empty()))
    }

    /// Copies `data` into a registered region at `offset`.
    ///
    /// # Errors
    /// As [`Client::region`] (for `data.len()` bytes), and
    /// [`ClientError::InFlight`] also while the server may still read the
    /// range (a directed operation's source).
    pub fn write_region(
        &mut self,
        key: MemKey,
        offset: u32,
        data: &[u8],
    ) -> Result<(), ClientError> {
        let n = u32::try_from(data.len()).unwrap_or(u32::MAX);
        let Span { start, len, .. } = self.absolute(key, offset, n)?;
        if let Some(op) = self.busy((start, len), true) {
            return Err(ClientError::InFlight(op));
        }
        // Inside the application memory: `absolute` checked the range.
        let _ = self
            .ep
            .connection_mut()
            .write_app_memory(start as usize, data);
        Ok(())
    }

    /// Queues a directed operation: a call whose DDP-eligible argument
    /// comes from, and/or whose DDP-eligible result goes to, registered
    /// application memory (no copy, no registration per call). `encode`
    /// is as for [`Client::call`], except that with a `source` the
    /// message stops after the item's XDR length word (which must hold
    /// `source.len`) and goes on after its data and padding; the
    /// `DdpItem` it returns names where the data would be. Returns the
    /// call and the operation's id; the ranges belong to the operation
    /// until it completes ([`Client::barrier`]).
    ///
    /// # Errors
    /// [`ClientError::BadKey`], [`ClientError::OutOfRange`],
    /// [`ClientError::InFlight`] (the target overlaps a range in flight,
    /// or the source overlaps a target in flight), [`ClientError::Encode`],
    /// [`ClientError::Call`].
    pub fn call_directed(
        &mut self,
        op: Directed,
        encode: impl FnOnce(u32, &mut [u8]) -> Option<(usize, Option<DdpItem>)>,
    ) -> Result<(CallHandle, OpId), ClientError> {
        let source = op
            .source
            .map(|r| self.absolute(r.key, r.offset, r.len))
            .transpose()?;
        let target = op
            .target
            .map(|r| self.absolute(r.key, r.offset, r.len))
            .transpose()?;
        if let Some(t) = target {
            if let Some(busy) = self.busy((t.start, t.len), true) {
                return Err(ClientError::InFlight(busy));
            }
        }
        if let Some(s) = source {
            if let Some(busy) = self.busy((s.start, s.len), false) {
                return Err(ClientError::InFlight(busy));
            }
        }
        self.wait_for_draining_slot();
        let xid = self.next_xid;
        self.next_xid = self.next_xid.wrapping_add(1);
        let (len, ddp) = encode(xid, &mut self.call_buf).ok_or(ClientError::Encode)?;
        let cfg = self.ep.connection().config();
        let reply = ReplyExpect {
            max_len: match target {
                Some(t) => cfg
                    .max_reply_size
                    .min(cfg.inline_recv_size.saturating_add(t.len)),
                None => cfg.inline_recv_size.min(cfg.max_reply_size),
            },
            ddp_max: None,
        };
        let app = AppChunks {
            write: target.map(|t| engine::AppSlice {
                offset: t.start,
                len: t.len,
            }),
            read: source.map(|s| engine::AppSlice {
                offset: s.start,
                len: s.len,
            }),
        };
        let now = self.now();
        let call = OutgoingCall {
            message: self.call_buf.get(..len).ok_or(ClientError::Encode)?,
            ddp,
            reply,
            app,
        };
        let handle = self.ep.connection_mut().send_call(now, &call)?;
        self.ep.flush();
        let id = self.next_op;
        self.next_op += 1;
        for span in source.iter().chain(target.iter()) {
            self.regions[span.region as usize].in_flight += 1;
        }
        self.ops[handle.slot()] = OpSlot {
            op: id,
            active: true,
            source,
            target,
        };
        Ok((handle, OpId(id)))
    }

    /// The directed operation of `call`, if any, is complete: its ranges
    /// go back to the application.
    fn complete_op(&mut self, call: CallHandle) {
        let Some(o) = self.ops.get_mut(call.slot()) else {
            return;
        };
        if !o.active {
            return;
        }
        o.active = false;
        let (source, target) = (o.source, o.target);
        for span in source.iter().chain(target.iter()) {
            if let Some(r) = self.regions.get_mut(span.region as usize) {
                r.in_flight = r.in_flight.saturating_sub(1);
            }
        }
    }

    /// The high-water mark: every directed operation up to and including
    /// it has completed (replied or failed).
    pub fn high_water(&self) -> OpId {
        let oldest_in_flight = self.ops.iter().filter(|o| o.active).map(|o| o.op).min();
        OpId(oldest_in_flight.unwrap_or(self.next_op) - 1)
    }

    /// Whether operation `op` and every one before it completed (no
    /// waiting: call [`Client::poll`] or use [`Client::barrier_wait`]).
    pub fn barrier(&self, op: OpId) -> Barrier {
        let high_water = self.high_water();
        Barrier {
            high_water,
            complete: op <= high_water,
        }
    }

    /// Makes progress until [`Client::barrier`] of `op` is complete.
    ///
    /// # Errors
    /// [`ClientError::Timeout`] after `wait_timeout`.
    pub fn barrier_wait(&mut self, op: OpId) -> Result<Barrier, ClientError> {
        let mut idler = Idler::new(self.config.idle);
        let start = std::time::Instant::now();
        loop {
            let b = self.barrier(op);
            if b.complete {
                return Ok(b);
            }
            if self.progress() > 0 {
                idler.reset();
                continue;
            }
            if start.elapsed() > self.config.wait_timeout {
                return Err(ClientError::Timeout);
            }
            self.idle(&mut idler);
        }
    }

    /// One round of progress: completions, timers, events, posting.
    /// Returns how much happened (0: idle).
    pub fn progress(&mut self) -> usize {
        let now = self.now();
        let mut work = self.ep.poll_completions(now, &mut self.wcs);
        self.ep.handle_timeouts(now);
        while let Some(ev) = self.ep.poll_event() {
            work += 1;
            match ev {
                Event::ReplyArrived {
                    call, len, ddp_len, ..
                } => {
                    self.complete_op(call);
                    self.done
                        .push_back((call, CallOutcome::Reply { len, ddp_len }))
                }
                Event::CallFailed { call, reason, .. } => {
                    self.complete_op(call);
                    self.done.push_back((call, CallOutcome::Failed(reason)))
                }
                // A client serves no calls: the engine answers CONF_RDMA
                // itself; anything else is left unanswered until close.
                Event::CallArrived { .. } | Event::ConnectionLost { .. } => {}
            }
        }
        work + self.ep.flush()
    }

    /// Makes progress once and returns a finished call, if any.
    pub fn poll(&mut self) -> Option<(CallHandle, CallOutcome)> {
        if self.done.is_empty() {
            self.progress();
        }
        self.done.pop_front()
    }

    /// Waits for `call` to finish (other calls finishing meanwhile stay
    /// queued for [`Client::poll`]).
    ///
    /// # Errors
    /// [`ClientError::Timeout`] after `wait_timeout`; [`ClientError::Closed`]
    /// if the connection is gone and the call never finished.
    pub fn wait(&mut self, call: CallHandle) -> Result<CallOutcome, ClientError> {
        let mut idler = Idler::new(self.config.idle);
        let start = std::time::Instant::now();
        loop {
            if let Some(i) = self.done.iter().position(|(h, _)| *h == call) {
                if let Some((_, outcome)) = self.done.remove(i) {
                    return Ok(outcome);
                }
            }
            if self.progress() > 0 {
                idler.reset();
                continue;
            }
            if let Some(reason) = self.ep.close_reason() {
                if self.ep.is_drained() && !self.done.iter().any(|(h, _)| *h == call) {
                    return Err(ClientError::Closed(reason));
                }
            }
            if start.elapsed() > self.config.wait_timeout {
                return Err(ClientError::Timeout);
            }
            self.idle(&mut idler);
        }
    }

    /// The reply message of a finished call, as a view to copy from
    /// (`mem::PeerBytes`: the server wrote it, and could again).
    pub fn reply(&self, call: CallHandle) -> Option<PeerBytes<'_>> {
        self.ep.connection().reply_message(call)
    }

    /// The DDP result the server wrote into the call's write chunk (a
    /// view, as [`Client::reply`]).
    pub fn ddp(&self, call: CallHandle) -> Option<PeerBytes<'_>> {
        self.ep.connection().reply_ddp(call)
    }

    /// Gives a finished call's slot back. False for a stale handle.
    pub fn release(&mut self, call: CallHandle) -> bool {
        self.ep.connection_mut().release_reply(call)
    }

    /// Calls sent and not yet finished (or finished and not released).
    pub fn outstanding(&self) -> u32 {
        self.ep.connection().outstanding_calls()
    }

    /// The endpoint (engine stats, resources, counters).
    pub fn endpoint(&self) -> &Endpoint<P> {
        &self.ep
    }

    /// Closes the connection, waits for every posted work request to come
    /// back and checks that nothing leaked.
    ///
    /// # Errors
    /// [`ClientError::Leak`] with the resources still in use;
    /// [`ClientError::Timeout`] when the flush does not finish.
    pub fn close(mut self) -> Result<(), ClientError> {
        self.done.clear();
        self.ep.close();
        let mut idler = Idler::new(self.config.idle);
        let start = std::time::Instant::now();
        while !self.ep.is_drained() {
            if self.progress() > 0 {
                idler.reset();
            } else if start.elapsed() > self.config.wait_timeout {
                return Err(ClientError::Timeout);
            } else {
                self.idle(&mut idler);
            }
        }
        let res = self.ep.resources();
        if res.is_idle() {
            Ok(())
        } else {
            Err(ClientError::Leak(res))
        }
    }
}
