//! `nfs`: sequential NFSv3 READ and WRITE of one file, over RPC-over-RDMA
//! through the daemon's storage gateway and over TCP straight to the NFS
//! server, in one run (the experiment of the Sun NFS/RDMA paper, s7.3).
//!
//! Both clients are ours, on the same codecs (`dataplane::nfs`):
//!
//! * [`RdmaNfs`]: `dataplane::client::Client` to a gateway listener
//!   (`shm://PATH`, `roce://IP:PORT`). A READ offers a write chunk of the
//!   request size (the result is placed by RDMA Write into the call slot's
//!   DDP buffer and never copied out: a kernel client would have it land
//!   in the page cache the same way); a WRITE's data is the DDP-eligible
//!   item of the encoded call, which the engine sends as a read chunk the
//!   gateway pulls when the call does not fit inline.
//! * [`TcpNfs`]: record-marked ONC RPC (RFC 5531 s11) over one TCP
//!   connection, blocking, the calls pipelined to the same depth and the
//!   replies matched by XID.
//!
//! A point ([`run_point`]) keeps `depth` calls in flight for `duration`,
//! each call at the next offset of the file (READ wraps at the file's
//! end, WRITE at `write_span`), then stops issuing and waits until every
//! outstanding call is answered (a WRITE point then COMMITs the file);
//! its time and bytes run from the first call to the last reply. Client
//! CPU is this process's (`getrusage(RUSAGE_SELF)`), and the gateway's
//! and the NFS server's when their pids are given (`/proc/PID/stat`).

use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use dataplane::client::{CallOutcome, Client, ClientConfig, ReplyTarget};
use dataplane::engine::{self, CallHandle, DdpItem};
use dataplane::nfs::{
    decode_mount_reply, decode_reply, encode_call, encode_mount_call, Commit3Args, DirOpArgs3,
    DirPath, FileHandle, Filename, Ftype3, Lookup3Args, MntRes3, MountArgs, MountProc, MountRes,
    Nfs3Args, Nfs3Proc, Nfs3Res, Read3Args, Res3, StableHow, Write3Args,
};
use dataplane::verbs::Provider;
use dataplane::wire::rpc::{AuthSys, CallHeader, OpaqueAuth, RecordMarker};
use dataplane::wire::xdr::{Decoder, Encoder};
use dataplane::worker::{EndpointConfig, IdleStrategy};
use serde::Serialize;

use crate::spec::{BenchError, Idle};
use crate::tirpc::CpuTimes;

/// Largest READ or WRITE the clients are built for (ganesha's MaxRead and
/// MaxWrite in the deploy script, Linux's usual rsize/wsize).
pub const MAX_IO: u32 = 1 << 20;
/// Room for the RPC header, credential and NFS arguments or results
/// around the data.
const HEADER_ROOM: u32 = 4096;
/// Deepest pipeline a connection is built for.
pub const MAX_DEPTH: u32 = 64;
/// How long a point waits without any reply before it gives up.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Empty polls of the RDMA client before it yields, then naps (as the
/// bench's adaptive idle policy).
const ADAPTIVE_SPINS: u32 = 256;
const ADAPTIVE_YIELDS: u32 = 16;
const ADAPTIVE_NAP: Duration = Duration::from_micros(20);

const PMAP_PROGRAM: u32 = 100_000;
const MOUNT_PROGRAM: u32 = 100_005;
const IPPROTO_TCP: u32 = 6;

/// Sequential READ or WRITE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NfsOp {
    /// READ of the read file.
    Read,
    /// WRITE (UNSTABLE) to the write file, COMMIT at the end of the point.
    Write,
}

impl NfsOp {
    /// `read` or `write`.
    pub fn name(self) -> &'static str {
        match self {
            NfsOp::Read => "read",
            NfsOp::Write => "write",
        }
    }
}

/// One point of the experiment.
#[derive(Debug, Clone, Copy)]
pub struct PointSpec {
    /// READ or WRITE.
    pub op: NfsOp,
    /// Bytes per call.
    pub size: u32,
    /// Calls in flight.
    pub depth: u32,
    /// How long calls are issued.
    pub duration: Duration,
    /// How the RDMA client waits for completions.
    pub idle: Idle,
}

/// The files a run reads and writes, as the client found them.
#[derive(Debug, Clone)]
pub struct Files {
    /// The read file's handle.
    pub read: Vec<u8>,
    /// The read file's size.
    pub read_size: u64,
    /// The write file's handle.
    pub write: Vec<u8>,
    /// WRITE offsets wrap here.
    pub write_span: u64,
}

/// What one point measured.
#[derive(Debug, Clone, Serialize)]
pub struct NfsPoint {
    /// `shm`, `roce` (through the gateway) or `tcp` (straight).
    pub transport: String,
    /// READ or WRITE.
    pub op: NfsOp,
    /// Bytes per call.
    pub size: u32,
    /// Calls in flight.
    pub depth: u32,
    /// From the first call to the last reply (the drain and a WRITE
    /// point's COMMIT included).
    pub seconds: f64,
    /// READ or WRITE calls answered.
    pub calls: u64,
    /// Bytes read or written.
    pub bytes: u64,
    /// `bytes / seconds / 10^6`.
    pub mb_per_s: f64,
    /// Mean time from a call to its reply, microseconds.
    pub mean_latency_us: f64,
    /// This process's CPU seconds over the point.
    pub client_cpu_s: f64,
    /// Client CPU seconds per 10^9 bytes moved.
    pub client_s_per_gb: f64,
    /// The gateway daemon's CPU seconds per 10^9 bytes (`--gateway-pid`;
    /// RDMA points only).
    pub gateway_s_per_gb: Option<f64>,
    /// The NFS server's CPU seconds per 10^9 bytes (`--nfs-pid`).
    pub server_s_per_gb: Option<f64>,
}

/// The ratio of one RDMA point to the TCP point of the same op, size and
/// depth.
#[derive(Debug, Clone, Serialize)]
pub struct NfsRatio {
    /// `shm` or `roce`.
    pub transport: String,
    /// READ or WRITE.
    pub op: NfsOp,
    /// Bytes per call.
    pub size: u32,
    /// Calls in flight.
    pub depth: u32,
    /// MB/s over RDMA / MB/s over TCP.
    pub throughput: f64,
    /// Client CPU s/GB over RDMA / over TCP.
    pub client_cpu_per_gb: f64,
}

/// The ratios of every RDMA point that has a TCP twin.
pub fn ratios(points: &[NfsPoint]) -> Vec<NfsRatio> {
    points
        .iter()
        .filter(|p| p.transport != "tcp")
        .filter_map(|p| {
            let t = points.iter().find(|t| {
                t.transport == "tcp" && t.op == p.op && t.size == p.size && t.depth == p.depth
            })?;
            Some(NfsRatio {
                transport: p.transport.clone(),
                op: p.op,
                size: p.size,
                depth: p.depth,
                throughput: p.mb_per_s / t.mb_per_s.max(1e-9),
                client_cpu_per_gb: p.client_s_per_gb / t.client_s_per_gb.max(1e-9),
            })
        })
        .collect()
}

fn cred() -> OpaqueAuth<'static> {
    // AUTH_SYS root: the deploy script's export squashes nobody.
    OpaqueAuth::Sys(AuthSys::new(0, b"rpcrdma-bench", 0, 0, &[0]).expect("a short credential"))
}

fn call_error(transport: &'static str, reason: impl Into<String>) -> BenchError {
    BenchError::Call {
        transport,
        reason: reason.into(),
    }
}

/// How a call's reply comes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// A small reply, inline.
    Inline,
    /// A READ result of up to this many bytes (over RDMA: a write chunk).
    Data(u32),
}

/// Encodes a call: `(xid, buffer)` to the message length and its
/// DDP-eligible item (`None` when the encoder ran out of room).
pub type Encode<'e> = dyn FnMut(u32, &mut [u8]) -> Option<(usize, Option<DdpItem>)> + 'e;

/// Takes a finished call: `(slot, reply message, DDP length)`.
pub type Done<'d> = dyn FnMut(u32, &[u8], Option<u32>) + 'd;

/// An NFS client connection that keeps calls in flight by slot.
pub trait NfsTransport {
    /// `shm`, `roce`, `tcp`.
    fn name(&self) -> &'static str;

    /// Starts a call in `slot`: `encode(xid, buf)` writes the call message
    /// and returns its length and DDP-eligible item.
    ///
    /// # Errors
    /// The call could not be sent.
    fn start(
        &mut self,
        slot: u32,
        expect: Expect,
        encode: &mut Encode<'_>,
    ) -> Result<(), BenchError>;

    /// Hands finished calls to `done(slot, message, ddp_len)`: the reply
    /// message and, when the result was placed in a write chunk, its
    /// length. Returns how many finished. TCP blocks for one reply (up to
    /// [`CALL_TIMEOUT`]); RDMA does not block.
    ///
    /// # Errors
    /// The connection failed or timed out.
    fn poll(&mut self, done: &mut Done<'_>) -> Result<usize, BenchError>;

    /// Closes the connection cleanly.
    ///
    /// # Errors
    /// The close failed or leaked resources.
    fn close(self: Box<Self>) -> Result<(), BenchError>;
}

/// NFSv3 over RPC-over-RDMA through the gateway.
pub struct RdmaNfs<P: Provider> {
    name: &'static str,
    client: Option<Client<P>>,
    slots: Vec<Option<CallHandle>>,
    reply_copy: Vec<u8>,
    idle: Idle,
    idle_polls: u32,
}

impl<P: Provider> RdmaNfs<P> {
    /// Connects to the gateway listener at `url`, with room for
    /// [`MAX_DEPTH`] calls of up to [`MAX_IO`] bytes, offering
    /// `extensions` in CONF_RDMA version 2 (`--extensions`; empty: plain
    /// Version One).
    ///
    /// # Errors
    /// The connection failed.
    pub fn connect(
        name: &'static str,
        url: &str,
        idle: Idle,
        extensions: dataplane::engine::Extensions,
    ) -> Result<Self, BenchError> {
        let max_message = MAX_IO + HEADER_ROOM;
        let config = ClientConfig {
            endpoint: EndpointConfig {
                engine: engine::Config {
                    inline_recv_size: 4096,
                    inline_send_size: 4096,
                    credits: MAX_DEPTH,
                    max_outstanding_calls: MAX_DEPTH,
                    max_call_size: max_message,
                    max_reply_size: max_message,
                    max_ddp_size: MAX_IO,
                    ..engine::Config::default()
                },
                ..EndpointConfig::default()
            },
            conf_rdma: false,
            extensions,
            idle: match idle {
                Idle::Spin => IdleStrategy::Spin,
                Idle::Adaptive => IdleStrategy::Adaptive {
                    park_max: Duration::from_micros(200),
                },
            },
            wait_timeout: CALL_TIMEOUT,
        };
        let client = Client::<P>::connect(url, config)
            .map_err(|e| call_error(name, format!("connect to the gateway at {url}: {e}")))?;
        Ok(RdmaNfs {
            name,
            client: Some(client),
            slots: vec![None; MAX_DEPTH as usize],
            reply_copy: Vec::with_capacity(max_message as usize),
            idle,
            idle_polls: 0,
        })
    }
}

impl<P: Provider> NfsTransport for RdmaNfs<P> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn start(
        &mut self,
        slot: u32,
        expect: Expect,
        encode: &mut Encode<'_>,
    ) -> Result<(), BenchError> {
        let name = self.name;
        let client = self
            .client
            .as_mut()
            .ok_or_else(|| call_error(name, "closed"))?;
        let target = match expect {
            Expect::Inline => ReplyTarget::Inline,
            Expect::Data(n) => ReplyTarget::WriteChunk {
                max_ddp: n.max(4).next_multiple_of(4),
            },
        };
        let handle = client
            .call(target, encode)
            .map_err(|e| call_error(name, e.to_string()))?;
        self.slots[slot as usize] = Some(handle);
        Ok(())
    }

    fn poll(&mut self, done: &mut Done<'_>) -> Result<usize, BenchError> {
        let name = self.name;
        let client = self
            .client
            .as_mut()
            .ok_or_else(|| call_error(name, "closed"))?;
        let mut finished = 0;
        while let Some((handle, outcome)) = client.poll() {
            let Some(slot) = self.slots.iter().position(|s| *s == Some(handle)) else {
                client.release(handle);
                continue;
            };
            self.slots[slot] = None;
            finished += 1;
            match outcome {
                CallOutcome::Reply { ddp_len, .. } => {
                    self.reply_copy.clear();
                    if let Some(m) = client.reply(handle) {
                        m.append_to(&mut self.reply_copy);
                    }
                    client.release(handle);
                    done(slot as u32, &self.reply_copy, ddp_len);
                }
                CallOutcome::Failed(f) => {
                    return Err(call_error(name, format!("call failed: {f:?}")));
                }
            }
        }
        if finished == 0 {
            self.idle_polls = self.idle_polls.wrapping_add(1);
            match self.idle {
                Idle::Spin => std::hint::spin_loop(),
                Idle::Adaptive if self.idle_polls < ADAPTIVE_SPINS => std::hint::spin_loop(),
                Idle::Adaptive if self.idle_polls < ADAPTIVE_SPINS + ADAPTIVE_YIELDS => {
                    std::thread::yield_now();
                }
                Idle::Adaptive => std::thread::sleep(ADAPTIVE_NAP),
            }
        } else {
            self.idle_polls = 0;
        }
        Ok(finished)
    }

    fn close(mut self: Box<Self>) -> Result<(), BenchError> {
        let name = self.name;
        match self.client.take() {
            Some(c) => c
                .close()
                .map_err(|e| call_error(name, format!("close: {e}"))),
            None => Ok(()),
        }
    }
}

/// ONC RPC over one TCP connection, record-marked, calls pipelined.
pub struct TcpNfs {
    name: &'static str,
    writer: TcpStream,
    reader: BufReader<TcpStream>,
    send: Vec<u8>,
    recv: Vec<u8>,
    /// The XID of the call in flight in each slot.
    xids: Vec<Option<u32>>,
    next_xid: u32,
}

impl TcpNfs {
    /// Connects to `addr`; every read and write gives up after
    /// [`CALL_TIMEOUT`].
    ///
    /// # Errors
    /// The connection failed.
    pub fn connect(name: &'static str, addr: SocketAddr) -> Result<TcpNfs, BenchError> {
        let fail = |e: std::io::Error| call_error(name, format!("connect to {addr}: {e}"));
        let stream = TcpStream::connect_timeout(&addr, CALL_TIMEOUT).map_err(fail)?;
        stream.set_read_timeout(Some(CALL_TIMEOUT)).map_err(fail)?;
        stream.set_write_timeout(Some(CALL_TIMEOUT)).map_err(fail)?;
        stream.set_nodelay(true).map_err(fail)?;
        let reader = BufReader::with_capacity(256 << 10, stream.try_clone().map_err(fail)?);
        Ok(TcpNfs {
            name,
            writer: stream,
            reader,
            send: vec![0; (MAX_IO + HEADER_ROOM) as usize + RecordMarker::LEN],
            recv: Vec::with_capacity((MAX_IO + HEADER_ROOM) as usize),
            xids: vec![None; MAX_DEPTH as usize],
            next_xid: 0x4e46_0000 ^ std::process::id().rotate_left(16),
        })
    }

    fn read_record(&mut self) -> Result<(), BenchError> {
        let name = self.name;
        let io = |e: std::io::Error| call_error(name, format!("receive: {e}"));
        self.recv.clear();
        loop {
            let mut mark = [0u8; RecordMarker::LEN];
            self.reader.read_exact(&mut mark).map_err(io)?;
            let word = u32::from_be_bytes(mark);
            let len = (word & !RecordMarker::LAST_FRAGMENT) as usize;
            let at = self.recv.len();
            if at + len > (MAX_IO + HEADER_ROOM) as usize {
                return Err(call_error(
                    name,
                    format!("a reply record over {} bytes", at + len),
                ));
            }
            self.recv.resize(at + len, 0);
            self.reader.read_exact(&mut self.recv[at..]).map_err(io)?;
            if word & RecordMarker::LAST_FRAGMENT != 0 {
                return Ok(());
            }
        }
    }
}

impl NfsTransport for TcpNfs {
    fn name(&self) -> &'static str {
        self.name
    }

    fn start(
        &mut self,
        slot: u32,
        _expect: Expect,
        encode: &mut Encode<'_>,
    ) -> Result<(), BenchError> {
        let name = self.name;
        self.next_xid = self.next_xid.wrapping_add(1);
        let xid = self.next_xid;
        let (len, _) = encode(xid, &mut self.send[RecordMarker::LEN..])
            .ok_or_else(|| call_error(name, "the call does not fit the send buffer"))?;
        RecordMarker::new(len, true)
            .and_then(|m| m.emit(&mut self.send[..RecordMarker::LEN]))
            .map_err(|e| call_error(name, format!("record mark: {e}")))?;
        self.writer
            .write_all(&self.send[..RecordMarker::LEN + len])
            .map_err(|e| call_error(name, format!("send: {e}")))?;
        self.xids[slot as usize] = Some(xid);
        Ok(())
    }

    fn poll(&mut self, done: &mut Done<'_>) -> Result<usize, BenchError> {
        if self.xids.iter().all(Option::is_none) {
            return Ok(0);
        }
        self.read_record()?;
        let xid = self
            .recv
            .get(..4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
        let Some(slot) = self.xids.iter().position(|x| xid.is_some() && *x == xid) else {
            return Err(call_error(
                self.name,
                format!("a reply with XID {xid:08x?} matches no call"),
            ));
        };
        self.xids[slot] = None;
        done(slot as u32, &self.recv, None);
        Ok(1)
    }

    fn close(self: Box<Self>) -> Result<(), BenchError> {
        let _ = self.writer.shutdown(std::net::Shutdown::Both);
        Ok(())
    }
}

/// One call in slot 0, waited for; the reply message (and the DDP
/// length) to `decode`.
fn call_sync<T>(
    t: &mut dyn NfsTransport,
    expect: Expect,
    encode: &mut Encode<'_>,
    decode: impl FnOnce(&[u8], Option<u32>) -> Result<T, String>,
) -> Result<T, BenchError> {
    let name = t.name();
    t.start(0, expect, encode)?;
    let deadline = Instant::now() + CALL_TIMEOUT;
    let mut decode = Some(decode);
    let mut out = None;
    loop {
        let n = t.poll(&mut |_, msg, ddp| {
            if let Some(f) = decode.take() {
                out = Some(f(msg, ddp));
            }
        })?;
        if n > 0 {
            break;
        }
        if Instant::now() > deadline {
            return Err(call_error(name, "no reply within 60 s"));
        }
    }
    out.unwrap_or_else(|| Err("no reply".to_owned()))
        .map_err(|e| call_error(name, e))
}

fn nfs_encode<'a>(
    args: &'a Nfs3Args<'a>,
) -> impl FnMut(u32, &mut [u8]) -> Option<(usize, Option<DdpItem>)> + 'a {
    move |xid, buf| {
        let e = encode_call(buf, xid, cred(), args).ok()?;
        Some((e.len, e.ddp))
    }
}

/// MNT of `export` (MOUNT v3 on `t`): the root file handle.
///
/// # Errors
/// The call failed or MNT was refused.
pub fn mount(t: &mut dyn NfsTransport, export: &str) -> Result<Vec<u8>, BenchError> {
    let path = DirPath::new(export.as_bytes())
        .map_err(|e| call_error(t.name(), format!("export path {export:?}: {e}")))?;
    let args = MountArgs::Mnt(path);
    call_sync(
        t,
        Expect::Inline,
        &mut |xid, buf| Some((encode_mount_call(buf, xid, cred(), &args).ok()?.len, None)),
        |msg, _| match decode_mount_reply(MountProc::Mnt, msg) {
            Ok(MountRes::Mnt(MntRes3::Ok(ok))) => Ok(ok.fhandle().as_bytes().to_vec()),
            Ok(other) => Err(format!("MNT {export}: {other:?}")),
            Err(e) => Err(format!("MNT {export}: {e}")),
        },
    )
}

/// LOOKUP of `name` in directory `dir`: the handle and size of a regular
/// file.
///
/// # Errors
/// The call failed, the name is missing or not a regular file.
pub fn lookup(
    t: &mut dyn NfsTransport,
    dir: &[u8],
    name: &str,
) -> Result<(Vec<u8>, u64), BenchError> {
    let tname = t.name();
    let bad = |e: dataplane::nfs::Error| call_error(tname, format!("LOOKUP {name}: {e}"));
    let args = Nfs3Args::Lookup(Lookup3Args {
        what: DirOpArgs3 {
            dir: FileHandle::new(dir).map_err(bad)?,
            name: Filename::new(name.as_bytes()).map_err(bad)?,
        },
    });
    let mut enc = nfs_encode(&args);
    call_sync(t, Expect::Inline, &mut enc, |msg, _| {
        match decode_reply(Nfs3Proc::Lookup, msg, None) {
            Ok(Nfs3Res::Lookup(Res3::Ok(ok))) => {
                let a = ok
                    .obj_attributes
                    .ok_or_else(|| format!("LOOKUP {name}: no attributes"))?;
                if a.ftype != Ftype3::Reg {
                    return Err(format!("{name} is a {:?}, not a regular file", a.ftype));
                }
                Ok((ok.object.as_bytes().to_vec(), a.size))
            }
            Ok(other) => Err(format!("LOOKUP {name}: {other:?}")),
            Err(e) => Err(format!("LOOKUP {name}: {e}")),
        }
    })
}

/// COMMIT of the whole of file `fh`.
fn commit(t: &mut dyn NfsTransport, fh: &[u8]) -> Result<(), BenchError> {
    let name = t.name();
    let args = Nfs3Args::Commit(Commit3Args {
        file: FileHandle::new(fh).map_err(|e| call_error(name, e.to_string()))?,
        offset: 0,
        count: 0,
    });
    let mut enc = nfs_encode(&args);
    call_sync(t, Expect::Inline, &mut enc, |msg, _| {
        match decode_reply(Nfs3Proc::Commit, msg, None) {
            Ok(Nfs3Res::Commit(Res3::Ok(_))) => Ok(()),
            Ok(other) => Err(format!("COMMIT: {other:?}")),
            Err(e) => Err(format!("COMMIT: {e}")),
        }
    })
}

/// CPU time of this process (`getrusage(RUSAGE_SELF)`).
pub fn process_cpu_self() -> CpuTimes {
    // SAFETY: getrusage writes into the zeroed struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a rusage.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return CpuTimes::default();
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    CpuTimes {
        user_s: secs(ru.ru_utime),
        sys_s: secs(ru.ru_stime),
    }
}

fn pid_cpu(pid: Option<u32>) -> Option<CpuTimes> {
    crate::tirpc::process_cpu(pid?).ok()
}

/// Runs one point on `t` (see the module doc).
///
/// # Errors
/// A call failed, a reply was not a full success, or no reply came for
/// [`CALL_TIMEOUT`].
pub fn run_point(
    t: &mut dyn NfsTransport,
    files: &Files,
    spec: &PointSpec,
    data: &[u8],
    gateway_pid: Option<u32>,
    server_pid: Option<u32>,
) -> Result<NfsPoint, BenchError> {
    let name = t.name();
    let depth = spec.depth.clamp(1, MAX_DEPTH);
    let size = spec.size.clamp(4, MAX_IO);
    let data = &data[..size as usize];
    // Offsets wrap at a whole number of calls inside the file.
    let span = match spec.op {
        NfsOp::Read => files.read_size,
        NfsOp::Write => files.write_span,
    };
    let calls_per_pass = (span / u64::from(size)).max(1);
    let fh = match spec.op {
        NfsOp::Read => &files.read,
        NfsOp::Write => &files.write,
    };
    let file = FileHandle::new(fh).map_err(|e| call_error(name, e.to_string()))?;
    let mut next = 0u64;
    let start = |t: &mut dyn NfsTransport, slot: u32, next: &mut u64| {
        let offset = (*next % calls_per_pass) * u64::from(size);
        *next += 1;
        match spec.op {
            NfsOp::Read => {
                let args = Nfs3Args::Read(Read3Args {
                    file,
                    offset,
                    count: size,
                });
                let mut enc = nfs_encode(&args);
                t.start(slot, Expect::Data(size), &mut enc)
            }
            NfsOp::Write => {
                let args =
                    Nfs3Args::Write(Write3Args::new(file, offset, StableHow::Unstable, data));
                let mut enc = nfs_encode(&args);
                t.start(slot, Expect::Inline, &mut enc)
            }
        }
    };
    // READ results placed in a write chunk stay there: decoding checks the
    // reply and the count against this stand-in of the placed length.
    let placed = vec![0u8; size as usize];

    let cpu0 = process_cpu_self();
    let (gw0, srv0) = (pid_cpu(gateway_pid), pid_cpu(server_pid));
    let t0 = Instant::now();
    let end = t0 + spec.duration;
    for slot in 0..depth {
        start(t, slot, &mut next)?;
    }
    let mut in_flight = depth;
    let (mut calls, mut bytes) = (0u64, 0u64);
    let mut failure: Option<String> = None;
    let mut restart: Vec<u32> = Vec::with_capacity(depth as usize);
    let mut issuing = true;
    let mut last_progress = Instant::now();
    while in_flight > 0 {
        restart.clear();
        let n = t.poll(&mut |slot, msg, ddp_len| {
            in_flight -= 1;
            let got = match spec.op {
                NfsOp::Read => {
                    let ddp = ddp_len.map(|n| &placed[..(n as usize).min(placed.len())]);
                    match decode_reply(Nfs3Proc::Read, msg, ddp) {
                        Ok(Nfs3Res::Read(Res3::Ok(ok))) => Ok(ok.count),
                        Ok(other) => Err(format!("READ: {other:?}")),
                        Err(e) => Err(format!("READ: {e}")),
                    }
                }
                NfsOp::Write => match decode_reply(Nfs3Proc::Write, msg, None) {
                    Ok(Nfs3Res::Write(Res3::Ok(ok))) => Ok(ok.count),
                    Ok(other) => Err(format!("WRITE: {other:?}")),
                    Err(e) => Err(format!("WRITE: {e}")),
                },
            };
            match got {
                Ok(count) if count == size => {
                    calls += 1;
                    bytes += u64::from(count);
                    restart.push(slot);
                }
                Ok(count) => {
                    failure.get_or_insert(format!("{count} bytes moved, not {size}"));
                }
                Err(e) => {
                    failure.get_or_insert(e);
                }
            }
        })?;
        if let Some(reason) = failure.take() {
            return Err(call_error(name, reason));
        }
        let now = Instant::now();
        if n == 0 {
            if now - last_progress > CALL_TIMEOUT {
                return Err(call_error(name, "no reply for 60 s"));
            }
            continue;
        }
        last_progress = now;
        if issuing && now >= end {
            issuing = false;
        }
        if issuing {
            for &slot in &restart {
                start(t, slot, &mut next)?;
                in_flight += 1;
            }
        }
    }
    if spec.op == NfsOp::Write {
        commit(t, &files.write)?;
    }
    let seconds = t0.elapsed().as_secs_f64();
    let cpu = process_cpu_self().since(cpu0).total_s();
    let per_gb = |s: f64| s / (bytes.max(1) as f64 / 1e9);
    let since = |a: Option<CpuTimes>, b: Option<CpuTimes>| a.zip(b).map(|(a, b)| a.since(b));
    let gw = since(pid_cpu(gateway_pid), gw0).map(|c| per_gb(c.total_s()));
    let srv = since(pid_cpu(server_pid), srv0).map(|c| per_gb(c.total_s()));
    Ok(NfsPoint {
        transport: name.to_owned(),
        op: spec.op,
        size,
        depth,
        seconds,
        calls,
        bytes,
        mb_per_s: bytes as f64 / seconds / 1e6,
        mean_latency_us: if calls == 0 {
            0.0
        } else {
            seconds * 1e6 * f64::from(depth) / calls as f64
        },
        client_cpu_s: cpu,
        client_s_per_gb: per_gb(cpu),
        gateway_s_per_gb: if name == "tcp" { None } else { gw },
        server_s_per_gb: srv,
    })
}

/// Resolves `tcp://HOST:PORT` (or `HOST:PORT`).
///
/// # Errors
/// Not an address.
pub fn tcp_addr(url: &str) -> Result<SocketAddr, String> {
    let rest = url.strip_prefix("tcp://").unwrap_or(url);
    rest.to_socket_addrs()
        .map_err(|e| format!("{url}: {e}"))?
        .next()
        .ok_or_else(|| format!("{url}: no address"))
}

/// The MOUNT v3 TCP address: `tcp://IP:PORT` as given, or `rpcbind://IP`
/// (PMAP v2 GETPORT on port 111 of IP).
///
/// # Errors
/// Not an address, rpcbind did not answer or maps no MOUNT v3 over TCP.
pub fn mount_addr(url: &str) -> Result<SocketAddr, BenchError> {
    let Some(host) = url.strip_prefix("rpcbind://") else {
        return tcp_addr(url).map_err(|e| call_error("tcp", e));
    };
    let pmap = tcp_addr(&format!("{host}:111")).map_err(|e| call_error("tcp", e))?;
    let mut c = TcpNfs::connect("tcp", pmap)?;
    let port = call_sync(
        &mut c,
        Expect::Inline,
        &mut |xid, buf| {
            let mut e = Encoder::new(buf);
            CallHeader::new(xid, PMAP_PROGRAM, 2, 3, OpaqueAuth::None, OpaqueAuth::None)
                .emit(&mut e)
                .ok()?;
            for w in [MOUNT_PROGRAM, 3, IPPROTO_TCP, 0] {
                e.put_u32(w).ok()?;
            }
            Some((e.position(), None))
        },
        |msg, _| {
            let (h, len) = dataplane::wire::rpc::ReplyHeader::parse(msg)
                .map_err(|e| format!("GETPORT reply: {e}"))?;
            match h.body {
                dataplane::wire::rpc::ReplyBody::Accepted(a)
                    if a.status == dataplane::wire::rpc::AcceptStatus::Success => {}
                other => return Err(format!("GETPORT: {other:?}")),
            }
            Decoder::new(&msg[len..])
                .get_u32()
                .map_err(|e| format!("GETPORT result: {e}"))
        },
    )?;
    let _ = Box::new(c).close();
    if port == 0 || port > 65535 {
        return Err(call_error(
            "tcp",
            format!("rpcbind at {pmap} maps no MOUNT v3 over TCP"),
        ));
    }
    Ok(SocketAddr::new(pmap.ip(), port as u16))
}

/// Prints the points as a table, then the RDMA/TCP ratios.
pub fn print_table(out: &mut impl Write, points: &[NfsPoint]) -> std::io::Result<()> {
    use crate::output::size_label;
    let opt = |v: Option<f64>| v.map_or("-".to_owned(), |x| format!("{x:.3}"));
    writeln!(
        out,
        "{:<6} {:<5} {:>5} {:>5} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "transp",
        "op",
        "size",
        "depth",
        "calls",
        "MB/s",
        "mean us",
        "cli s/GB",
        "gw s/GB",
        "srv s/GB"
    )?;
    for p in points {
        writeln!(
            out,
            "{:<6} {:<5} {:>5} {:>5} {:>8} {:>9.1} {:>9.1} {:>9.3} {:>9} {:>9}",
            p.transport,
            p.op.name(),
            size_label(p.size),
            p.depth,
            p.calls,
            p.mb_per_s,
            p.mean_latency_us,
            p.client_s_per_gb,
            opt(p.gateway_s_per_gb),
            opt(p.server_s_per_gb),
        )?;
    }
    let r = ratios(points);
    if !r.is_empty() {
        writeln!(out, "RDMA / TCP (same op, size, depth, this run):")?;
        writeln!(
            out,
            "{:<6} {:<5} {:>5} {:>5} {:>10} {:>12}",
            "transp", "op", "size", "depth", "MB/s x", "cli s/GB x"
        )?;
        for x in &r {
            writeln!(
                out,
                "{:<6} {:<5} {:>5} {:>5} {:>10.2} {:>12.2}",
                x.transport,
                x.op.name(),
                size_label(x.size),
                x.depth,
                x.throughput,
                x.client_cpu_per_gb
            )?;
        }
    }
    Ok(())
}

/// Writes the plots into `dir`: `nfs-<transport>-<op>-throughput.svg`
/// (MB/s vs request size, a line per depth) and `nfs-<op>-cpu-per-gb.svg`
/// (client CPU s/GB vs request size, a line per transport, at the depth
/// nearest `cpu_depth`). Returns their paths.
///
/// # Errors
/// A plot could not be drawn or written.
pub fn plot(
    dir: &std::path::Path,
    points: &[NfsPoint],
    cpu_depth: u32,
) -> Result<Vec<std::path::PathBuf>, String> {
    use std::collections::BTreeSet;
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut written = Vec::new();
    let transports: Vec<&str> = {
        let mut seen = Vec::new();
        for p in points {
            if !seen.contains(&p.transport.as_str()) {
                seen.push(p.transport.as_str());
            }
        }
        seen
    };
    for op in [NfsOp::Read, NfsOp::Write] {
        let runs: Vec<&NfsPoint> = points.iter().filter(|p| p.op == op).collect();
        if runs.is_empty() {
            continue;
        }
        let depths: BTreeSet<u32> = runs.iter().map(|p| p.depth).collect();
        for &t in &transports {
            let series: Vec<crate::output::Series> = depths
                .iter()
                .map(|&d| {
                    let mut pts: Vec<(f64, f64)> = runs
                        .iter()
                        .filter(|p| p.transport == t && p.depth == d)
                        .map(|p| (f64::from(p.size), p.mb_per_s))
                        .collect();
                    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                    (format!("depth {d}"), pts)
                })
                .filter(|s| !s.1.is_empty())
                .collect();
            if series.is_empty() {
                continue;
            }
            let path = dir.join(format!("nfs-{t}-{}-throughput.svg", op.name()));
            let how = if t == "tcp" {
                "TCP straight".to_owned()
            } else {
                format!("{t} through the gateway")
            };
            crate::output::line_chart(
                &path,
                &format!("NFSv3 sequential {} over {how}", op.name()),
                "bytes per call",
                "MB/s (10^6 B/s)",
                true,
                &series,
            )?;
            written.push(path);
        }
        let Some(&depth) = depths
            .iter()
            .min_by_key(|&&d| (i64::from(d) - i64::from(cpu_depth)).abs())
        else {
            continue;
        };
        let series: Vec<crate::output::Series> = transports
            .iter()
            .map(|&t| {
                let mut pts: Vec<(f64, f64)> = runs
                    .iter()
                    .filter(|p| p.transport == t && p.depth == depth)
                    .map(|p| (f64::from(p.size), p.client_s_per_gb))
                    .collect();
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                (t.to_owned(), pts)
            })
            .filter(|s| !s.1.is_empty())
            .collect();
        let path = dir.join(format!("nfs-{}-cpu-per-gb.svg", op.name()));
        crate::output::line_chart(
            &path,
            &format!(
                "NFSv3 {}: client CPU seconds per GB vs size, depth {depth}",
                op.name()
            ),
            "bytes per call",
            "client CPU s / GB",
            true,
            &series,
        )?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(transport: &str, mb: f64, cpu: f64) -> NfsPoint {
        NfsPoint {
            transport: transport.to_owned(),
            op: NfsOp::Read,
            size: 4096,
            depth: 1,
            seconds: 1.0,
            calls: 1,
            bytes: 4096,
            mb_per_s: mb,
            mean_latency_us: 1.0,
            client_cpu_s: cpu,
            client_s_per_gb: cpu,
            gateway_s_per_gb: None,
            server_s_per_gb: None,
        }
    }

    #[test]
    fn ratios_pair_each_rdma_point_with_its_tcp_twin() {
        let r = ratios(&[point("shm", 300.0, 1.0), point("tcp", 100.0, 4.0)]);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].transport, "shm");
        assert!((r[0].throughput - 3.0).abs() < 1e-9);
        assert!((r[0].client_cpu_per_gb - 0.25).abs() < 1e-9);
        assert!(ratios(&[point("shm", 1.0, 1.0)]).is_empty());
    }

    #[test]
    fn tcp_urls_resolve() {
        assert_eq!(
            tcp_addr("tcp://127.0.0.1:2049").unwrap(),
            "127.0.0.1:2049".parse::<SocketAddr>().unwrap()
        );
        assert!(tcp_addr("tcp://nowhere").is_err());
    }
}
