//! The requester side for the bench program over TCP: pipelined calls up
//! to a depth, replies matched by XID, everything in buffers reserved at
//! connect time.
//!
//! ```text
//! loop {
//!     while let Some(xid) = client.call(Args::Echo(&data), tag)? { ... } // queue calls
//!     client.poll(|reply| check(reply.data()))?;   // send queued, take replies
//!     // nothing done: idle strategy
//! }
//! ```

use std::io::{self, Read};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};

use nix::sys::socket::{send, MsgFlags};

use super::buf::{InBuf, OutBuf, ZeroedBuf};
use super::{parse_tcp_url, TcpError, DEFAULT_MAX_MESSAGE_LEN, MIN_MESSAGE_LEN};
use crate::service::bench::{
    decode_data_reply, decode_void_reply, encode_call, Args, Proc, ReplyError,
};
use crate::wire::rpc::{peek_direction, peek_xid, write_record_header, MessageType, RecordMarker};
use crate::wire::rpc::{RecordReassembler, MAX_CALL_HEADER_LEN};
use crate::wire::Error as WireError;

/// Sizes of a [`TcpClient`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpClientConfig {
    /// Calls outstanding at most.
    pub depth: usize,
    /// Largest call message (without its record mark).
    pub max_call_len: usize,
    /// Largest reply record accepted.
    pub max_reply_len: usize,
    /// Bytes asked for per `read`.
    pub read_buffer_len: usize,
    /// Output space beyond one call, where pipelined calls gather to leave
    /// in one `write`.
    pub batch_len: usize,
    /// `read` calls per [`TcpClient::poll`] at most.
    pub reads_per_poll: usize,
}

impl Default for TcpClientConfig {
    /// Depth 1, the bench program's largest messages (16 MiB of data).
    fn default() -> Self {
        TcpClientConfig {
            depth: 1,
            max_call_len: DEFAULT_MAX_MESSAGE_LEN,
            max_reply_len: DEFAULT_MAX_MESSAGE_LEN,
            read_buffer_len: 64 << 10,
            batch_len: 64 << 10,
            reads_per_poll: 16,
        }
    }
}

impl TcpClientConfig {
    /// Sized for calls and replies carrying at most `data_len` bytes of
    /// bench data, with `depth` calls outstanding.
    pub fn for_data(data_len: usize, depth: usize) -> TcpClientConfig {
        let max = MAX_CALL_HEADER_LEN + 4 + data_len.next_multiple_of(4);
        TcpClientConfig {
            depth,
            max_call_len: max,
            max_reply_len: max,
            ..TcpClientConfig::default()
        }
    }
}

/// Counters of a [`TcpClient`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TcpClientStats {
    /// Calls queued.
    pub calls: u64,
    /// Replies matched to a call.
    pub replies: u64,
    /// Bytes written.
    pub bytes_out: u64,
    /// Bytes read.
    pub bytes_in: u64,
}

/// Errors of a [`TcpClient`]. After any of them but
/// [`CallTooLarge`](TcpClientError::CallTooLarge) and
/// [`Encode`](TcpClientError::Encode) the connection is unusable.
#[derive(Debug, thiserror::Error)]
pub enum TcpClientError {
    /// The configuration or URL is wrong.
    #[error(transparent)]
    Setup(#[from] TcpError),
    /// `connect` failed.
    #[error("cannot connect to tcp://{addr}: {source}")]
    Connect {
        /// The server.
        addr: SocketAddr,
        /// The error from the operating system.
        source: io::Error,
    },
    /// A socket operation failed.
    #[error("tcp client {what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The error from the operating system.
        source: io::Error,
    },
    /// The server ended the stream with calls outstanding or inside a
    /// record.
    #[error("server closed the connection with {outstanding} calls outstanding")]
    Closed {
        /// Calls that got no reply.
        outstanding: usize,
    },
    /// A reply record is longer than `max_reply_len`.
    #[error("reply record over {max} bytes")]
    ReplyTooLarge {
        /// The configured limit.
        max: usize,
    },
    /// A record that is not an RPC reply.
    #[error("received a record that is not an RPC reply")]
    NotAReply,
    /// A reply whose XID matches no outstanding call.
    #[error("reply with XID {0:#x} matches no outstanding call")]
    UnexpectedXid(u32),
    /// The call does not fit `max_call_len`; nothing was queued.
    #[error("call message over {max} bytes")]
    CallTooLarge {
        /// The configured limit.
        max: usize,
    },
    /// The call could not be encoded (e.g. data over the program's
    /// maximum); nothing was queued.
    #[error("cannot encode the call: {0}")]
    Encode(WireError),
}

/// A reply, borrowed from the client's reassembly buffer for the duration
/// of the [`TcpClient::poll`] callback.
#[derive(Debug, Clone, Copy)]
pub struct Reply<'a> {
    /// Its XID.
    pub xid: u32,
    /// The tag given to [`TcpClient::call`].
    pub tag: u64,
    /// The procedure called.
    pub procedure: Proc,
    /// The RPC reply message (header and results).
    pub message: &'a [u8],
}

impl<'a> Reply<'a> {
    /// The `bench_data` result of ECHO or SOURCE.
    ///
    /// # Errors
    /// [`ReplyError`] when the reply is not a well-formed success.
    pub fn data(&self) -> Result<&'a [u8], ReplyError> {
        decode_data_reply(self.message, None)
    }

    /// Checks the empty result of NULL or SINK.
    ///
    /// # Errors
    /// [`ReplyError`] when the reply is not a well-formed, empty success.
    pub fn check_void(&self) -> Result<(), ReplyError> {
        decode_void_reply(self.message)
    }
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    busy: bool,
    xid: u32,
    tag: u64,
    procedure: Proc,
}

/// An ONC RPC over TCP client of the bench program: one connection,
/// non-blocking, driven by [`call`](Self::call) and [`poll`](Self::poll).
#[derive(Debug)]
pub struct TcpClient {
    cfg: TcpClientConfig,
    stream: TcpStream,
    fd: RawFd,
    peer: SocketAddr,
    input: InBuf,
    reassembler: RecordReassembler<ZeroedBuf>,
    output: OutBuf,
    slots: Box<[Slot]>,
    outstanding: usize,
    next_xid: u32,
    stats: TcpClientStats,
}

impl TcpClient {
    /// Connects to `tcp://IP:PORT`.
    ///
    /// # Errors
    /// As [`parse_tcp_url`] and [`TcpClient::connect`].
    pub fn connect_url(url: &str, cfg: TcpClientConfig) -> Result<TcpClient, TcpClientError> {
        TcpClient::connect(parse_tcp_url(url)?, cfg)
    }

    /// Connects to `addr` (blocking until the handshake is done) and
    /// reserves the buffers.
    ///
    /// # Errors
    /// [`TcpClientError::Setup`] for a depth of 0 or a message limit out of
    /// range, [`TcpClientError::Connect`], [`TcpClientError::Io`] when the
    /// socket options or buffer mappings fail.
    pub fn connect(addr: SocketAddr, cfg: TcpClientConfig) -> Result<TcpClient, TcpClientError> {
        let limits = MIN_MESSAGE_LEN..=RecordMarker::MAX_FRAGMENT_LEN;
        if cfg.depth == 0 || cfg.read_buffer_len == 0 || cfg.reads_per_poll == 0 {
            return Err(TcpError::Config(
                "depth, read_buffer_len and reads_per_poll must not be 0",
            )
            .into());
        }
        if !limits.contains(&cfg.max_call_len) || !limits.contains(&cfg.max_reply_len) {
            return Err(TcpError::Config("message limits must be 28..=2147483647 bytes").into());
        }
        let stream =
            TcpStream::connect(addr).map_err(|source| TcpClientError::Connect { addr, source })?;
        let io = |what| move |source| TcpClientError::Io { what, source };
        stream.set_nodelay(true).map_err(io("set TCP_NODELAY"))?;
        stream
            .set_nonblocking(true)
            .map_err(io("set non-blocking"))?;
        let mut xid = [0u8; 4];
        // Any start works (XIDs only need to differ among outstanding
        // calls); a random one keeps runs apart in a capture.
        let _ = getrandom::fill(&mut xid);
        Ok(TcpClient {
            fd: stream.as_raw_fd(),
            stream,
            peer: addr,
            input: InBuf::new(cfg.read_buffer_len).map_err(io("reserve buffers"))?,
            reassembler: RecordReassembler::with_buffer(
                ZeroedBuf::new(cfg.max_reply_len).map_err(io("reserve buffers"))?,
            ),
            output: OutBuf::new(RecordMarker::LEN + cfg.max_call_len, cfg.batch_len)
                .map_err(io("reserve buffers"))?,
            slots: vec![
                Slot {
                    busy: false,
                    xid: 0,
                    tag: 0,
                    procedure: Proc::Null,
                };
                cfg.depth
            ]
            .into_boxed_slice(),
            outstanding: 0,
            next_xid: u32::from_ne_bytes(xid),
            stats: TcpClientStats::default(),
            cfg,
        })
    }

    /// The server's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// The local address of the connection (what the server sees as the
    /// peer).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.stream.local_addr()
    }

    /// The configuration.
    pub fn config(&self) -> &TcpClientConfig {
        &self.cfg
    }

    /// Calls sent or queued that have no reply yet.
    pub fn outstanding(&self) -> usize {
        self.outstanding
    }

    /// The counters so far.
    pub fn stats(&self) -> &TcpClientStats {
        &self.stats
    }

    /// Queues a call of the bench program, with `tag` handed back in its
    /// [`Reply`], and returns its XID; `Ok(None)` when `depth` calls are
    /// outstanding or the output buffer has no room for another call yet
    /// ([`poll`](Self::poll), then retry). The bytes leave on the next
    /// [`flush`](Self::flush) or `poll`, so calls queued together share
    /// one `write`.
    ///
    /// # Errors
    /// [`TcpClientError::CallTooLarge`] when the call is over
    /// `max_call_len`; [`TcpClientError::Encode`] for data over the
    /// program's maximum. Nothing is queued then.
    pub fn call(&mut self, args: Args<'_>, tag: u64) -> Result<Option<u32>, TcpClientError> {
        if self.outstanding == self.slots.len() {
            return Ok(None);
        }
        if !self.output.make_reserve() {
            self.flush()?;
            if !self.output.make_reserve() {
                return Ok(None);
            }
        }
        let xid = self.next_xid;
        let (mark, body) = self.output.reserve_mut().split_at_mut(RecordMarker::LEN);
        let len = match encode_call(body, xid, args) {
            Ok(c) => c.len,
            Err(WireError::BufferTooShort) => {
                return Err(TcpClientError::CallTooLarge {
                    max: self.cfg.max_call_len,
                })
            }
            Err(e) => return Err(TcpClientError::Encode(e)),
        };
        write_record_header(mark, len).map_err(TcpClientError::Encode)?;
        self.output.commit(RecordMarker::LEN + len);
        self.next_xid = xid.wrapping_add(1);
        let slot = self
            .slots
            .iter_mut()
            .find(|s| !s.busy)
            .expect("outstanding < depth leaves a free slot");
        *slot = Slot {
            busy: true,
            xid,
            tag,
            procedure: args.procedure(),
        };
        self.outstanding += 1;
        self.stats.calls += 1;
        Ok(Some(xid))
    }

    /// Writes queued call bytes until done or the socket is full; returns
    /// the number of `write`s that moved bytes.
    ///
    /// # Errors
    /// [`TcpClientError::Io`] (connection reset, broken pipe).
    pub fn flush(&mut self) -> Result<usize, TcpClientError> {
        let mut writes = 0;
        while !self.output.is_empty() {
            match send(self.fd, self.output.pending(), MsgFlags::MSG_NOSIGNAL) {
                Ok(0) => {
                    return Err(TcpClientError::Io {
                        what: "send",
                        source: io::ErrorKind::WriteZero.into(),
                    })
                }
                Ok(n) => {
                    self.output.consume(n);
                    self.stats.bytes_out += n as u64;
                    writes += 1;
                }
                Err(nix::errno::Errno::EAGAIN) => break,
                Err(nix::errno::Errno::EINTR) => {}
                Err(e) => {
                    return Err(TcpClientError::Io {
                        what: "send",
                        source: e.into(),
                    })
                }
            }
        }
        Ok(writes)
    }

    /// Sends queued calls, reads what the server sent, and hands each
    /// complete reply to `on_reply`, in arrival order. Returns the work
    /// done (writes, reads and replies); 0 means nothing happened. Never
    /// blocks, never allocates.
    ///
    /// # Errors
    /// [`TcpClientError::Io`], [`TcpClientError::Closed`] (end of stream
    /// with calls outstanding), [`TcpClientError::ReplyTooLarge`],
    /// [`TcpClientError::NotAReply`], [`TcpClientError::UnexpectedXid`].
    pub fn poll(&mut self, mut on_reply: impl FnMut(Reply<'_>)) -> Result<usize, TcpClientError> {
        let mut work = self.flush()?;
        let mut reads_left = self.cfg.reads_per_poll;
        loop {
            if self.input.is_empty() {
                if reads_left == 0 {
                    break;
                }
                reads_left -= 1;
                match self.stream.read(self.input.space()) {
                    Ok(0) => {
                        if self.outstanding == 0 && !self.reassembler.is_mid_record() {
                            // Nothing lost; the next call will fail to send.
                            break;
                        }
                        return Err(TcpClientError::Closed {
                            outstanding: self.outstanding,
                        });
                    }
                    Ok(n) => {
                        self.input.filled(n);
                        self.stats.bytes_in += n as u64;
                        work += 1;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(source) => {
                        return Err(TcpClientError::Io {
                            what: "read",
                            source,
                        })
                    }
                }
            }
            let used = self.reassembler.push(self.input.unread()).map_err(|_| {
                TcpClientError::ReplyTooLarge {
                    max: self.cfg.max_reply_len,
                }
            })?;
            self.input.consume(used);
            if let Some(record) = self.reassembler.poll_record() {
                let (Some(xid), Some(MessageType::Reply)) =
                    (peek_xid(record), peek_direction(record))
                else {
                    return Err(TcpClientError::NotAReply);
                };
                let slot = self
                    .slots
                    .iter_mut()
                    .find(|s| s.busy && s.xid == xid)
                    .ok_or(TcpClientError::UnexpectedXid(xid))?;
                slot.busy = false;
                self.outstanding -= 1;
                self.stats.replies += 1;
                work += 1;
                on_reply(Reply {
                    xid,
                    tag: slot.tag,
                    procedure: slot.procedure,
                    message: record,
                });
            }
        }
        Ok(work)
    }
}
