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
use std::collections::VecDeque;
use std::time::Duration;

use crate::engine::{
    self, decode_conf_rdma_reply, encode_conf_rdma_call, AppChunks, CallFailure, CallHandle,
    DdpItem, Event, OutgoingCall, ReplyExpect, SendCallError,
};
use crate::verbs::shm::Shm;
use crate::verbs::{Completion, Context, Provider, VerbsError};
use crate::wire::conf::ConfigRdmaReply;
use crate::worker::{Endpoint, EndpointConfig, EndpointError, IdleStrategy, Idler, POLL_BURST};

/// Client configuration.
#[derive(Debug, Clone, Copy)]
pub struct ClientConfig {
    /// Engine limits and queue depths of the connection.
    pub endpoint: EndpointConfig,
    /// Run the CONF_RDMA exchange (RFC 5666 s6) right after connecting and
    /// apply the server's limits before any other call.
    pub conf_rdma: bool,
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
            idle: IdleStrategy::default(),
            wait_timeout: Duration::from_secs(30),
        }
    }
}

/// Where the reply of a call should land (the requester's chunk choice,
/// RFC 5666 s3.4, s5.2; the engine then decides per call).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyTarget {
    /// The reply is expected to fit our inline receive size.
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
    origin: std::time::Instant,
    config: ClientConfig,
    next_xid: u32,
    conf: Option<ConfigRdmaReply>,
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
    pub fn connect(url: &str, config: ClientConfig) -> Result<Client<P>, ClientError> {
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
            origin: std::time::Instant::now(),
            config,
            // Start somewhere unpredictable-ish per connection.
            next_xid: std::process::id().wrapping_mul(0x9e37_79b9),
            conf: None,
        };
        if config.conf_rdma {
            client.conf_rdma()?;
        }
        Ok(client)
    }

    fn now(&self) -> engine::Instant {
        engine::Instant(self.origin.elapsed().as_nanos() as u64)
    }

    /// RFC 5666 s6: the first call on the connection; its answer sets our
    /// inline call size and Read limit.
    fn conf_rdma(&mut self) -> Result<(), ClientError> {
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
                    .map(decode_conf_rdma_reply)
                    .ok_or_else(|| ClientError::ConfRdma("reply vanished".into()));
                self.release(call);
                let r = decoded?.map_err(|e| ClientError::ConfRdma(e.to_string()))?;
                self.ep.connection_mut().apply_conf_rdma_reply(&r);
                self.conf = Some(r);
                Ok(())
            }
            CallOutcome::Failed(f) => Err(ClientError::ConfRdma(format!("{f:?}"))),
        }
    }

    /// The server's CONF_RDMA answer, if the exchange ran.
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
        let xid = self.next_xid;
        self.next_xid = self.next_xid.wrapping_add(1);
        let (len, ddp) = encode(xid, &mut self.call_buf).ok_or(ClientError::Encode)?;
        let cfg = self.ep.connection().config();
        let reply = match target {
            ReplyTarget::Inline => ReplyExpect {
                max_len: cfg.inline_recv_size.min(cfg.max_reply_size),
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
                } => self
                    .done
                    .push_back((call, CallOutcome::Reply { len, ddp_len })),
                Event::CallFailed { call, reason, .. } => {
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
            idler.idle(None);
        }
    }

    /// The reply message of a finished call.
    pub fn reply(&self, call: CallHandle) -> Option<&[u8]> {
        self.ep.connection().reply_message(call)
    }

    /// The DDP result the server wrote into the call's write chunk.
    pub fn ddp(&self, call: CallHandle) -> Option<&[u8]> {
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
                idler.idle(None);
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
