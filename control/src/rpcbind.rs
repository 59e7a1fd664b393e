//! A small blocking rpcbind client (RFC 1833) and the daemon's registrar.
//!
//! The client speaks rpcbind version 4 (program 100000) and falls back to
//! version 3 when the server answers PROG_MISMATCH; both versions share the
//! procedure numbers and the `rpcb` argument used here. Calls travel as
//! record-marked ONC RPC messages (RFC 5531 s9, s11), built and parsed with
//! [`dataplane::wire::rpc`], over TCP or over rpcbind's local stream socket
//! (`/run/rpcbind.sock`). Every socket operation has a timeout.
//!
//! ```text
//! struct rpcb {                 /* RFC 1833 s2.1 */
//!     unsigned long r_prog;
//!     unsigned long r_vers;
//!     string r_netid<>;
//!     string r_addr<>;          /* universal address, RFC 5665 s5.2.3 */
//!     string r_owner<>;
//! };
//! RPCBPROC_SET(rpcb) = 1      -> bool
//! RPCBPROC_UNSET(rpcb) = 2    -> bool
//! RPCBPROC_GETADDR(rpcb) = 3  -> string
//! RPCBPROC_DUMP(void) = 4     -> rpcblist_ptr   /* optional-data list */
//! ```
//!
//! # Access rules of rpcbind
//! rpcbind accepts SET and UNSET only from callers it considers local. Its
//! AF_LOCAL socket always qualifies; whether loopback TCP does depends on
//! the build and its flags (`-L`, `-i`). Debian 12's rpcbind 1.2.6 accepts
//! loopback TCP (the real-rpcbind test shows it), so the default address is
//! `127.0.0.1:111`, where clients look for it. Where rpcbind refuses the caller,
//! [`RpcbindError::Refused`] names the fix: point `rpcbind.address` at the
//! local socket, `/run/rpcbind.sock`, which this client also speaks.

use std::fmt;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use dataplane::wire::rpc::{
    write_record_header, AcceptStatus, CallHeader, OpaqueAuth, RecordReassembler, RejectedReply,
    ReplyBody, ReplyHeader,
};
use dataplane::wire::xdr::{Decoder, Encoder};

/// rpcbind's program number (RFC 1833 s2).
pub const RPCBPROG: u32 = 100_000;
/// rpcbind protocol version 4 (RFC 1833 s2.2), tried first.
pub const RPCBVERS4: u32 = 4;
/// rpcbind protocol version 3 (RFC 1833 s2.1), the fallback.
pub const RPCBVERS3: u32 = 3;
/// `RPCBPROC_SET`: add a mapping.
pub const RPCBPROC_SET: u32 = 1;
/// `RPCBPROC_UNSET`: remove a mapping.
pub const RPCBPROC_UNSET: u32 = 2;
/// `RPCBPROC_GETADDR`: look a mapping up.
pub const RPCBPROC_GETADDR: u32 = 3;
/// `RPCBPROC_DUMP`: list every mapping.
pub const RPCBPROC_DUMP: u32 = 4;

/// Longest string this client accepts in a reply (netids, universal
/// addresses and owners are short; 1 KiB is generous).
const MAX_REPLY_STRING: usize = 1024;
/// Largest reply record accepted (a DUMP of a busy rpcbind is a few KiB).
const MAX_REPLY_RECORD: usize = 1 << 20;

/// Where rpcbind listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RpcbindAddress {
    /// TCP, usually `127.0.0.1:111`.
    Tcp(SocketAddr),
    /// rpcbind's local stream socket, usually `/run/rpcbind.sock`.
    Local(PathBuf),
}

impl fmt::Display for RpcbindAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RpcbindAddress::Tcp(a) => write!(f, "{a}"),
            RpcbindAddress::Local(p) => write!(f, "{}", p.display()),
        }
    }
}

impl std::str::FromStr for RpcbindAddress {
    type Err = String;

    /// An absolute path is the local socket; anything else must be
    /// `IP:PORT`.
    fn from_str(s: &str) -> Result<Self, String> {
        if s.starts_with('/') {
            return Ok(RpcbindAddress::Local(PathBuf::from(s)));
        }
        s.parse::<SocketAddr>()
            .map(RpcbindAddress::Tcp)
            .map_err(|_| {
                format!(
                    "`{s}` is not an rpcbind address: expected IP:PORT (e.g. 127.0.0.1:111) \
                 or an absolute socket path (e.g. /run/rpcbind.sock)"
                )
            })
    }
}

/// One rpcbind mapping, the `rpcb` structure of RFC 1833.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    /// Program number.
    pub program: u32,
    /// Program version.
    pub version: u32,
    /// Network id: `rdma`, `rdma6`, `tcp`, `tcp6`, ...
    pub netid: String,
    /// Universal address (RFC 5665 s5.2.3); empty in UNSET calls.
    pub addr: String,
    /// Owner; rpcbind replaces it with the caller's uid on its local socket.
    pub owner: String,
}

impl Mapping {
    fn encode(&self, enc: &mut Encoder<'_>) -> dataplane::wire::Result<()> {
        enc.put_u32(self.program)?;
        enc.put_u32(self.version)?;
        enc.put_string(&self.netid)?;
        enc.put_string(&self.addr)?;
        enc.put_string(&self.owner)
    }

    fn decode(dec: &mut Decoder<'_>) -> dataplane::wire::Result<Self> {
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        Ok(Mapping {
            program: dec.get_u32()?,
            version: dec.get_u32()?,
            netid: text(dec.get_string(MAX_REPLY_STRING)?),
            addr: text(dec.get_string(MAX_REPLY_STRING)?),
            owner: text(dec.get_string(MAX_REPLY_STRING)?),
        })
    }
}

/// The universal address of `addr` (RFC 5665 s5.2.3.3, s5.2.3.4): the
/// textual IP address followed by the port's high and low bytes, e.g.
/// `127.0.0.1.78.81` for port 20049, `::1.78.81` for IPv6 (RFC 5952 text,
/// which is what `inet_ntop` prints). IPv6 scope ids are not represented.
pub fn universal_address(addr: SocketAddr) -> String {
    let port = addr.port();
    format!("{}.{}.{}", addr.ip(), port >> 8, port & 0xff)
}

/// Parses a universal address of an IPv4 or IPv6 transport (the inverse of
/// [`universal_address`]). `None` for anything else.
pub fn parse_universal_address(uaddr: &str) -> Option<SocketAddr> {
    let mut parts = uaddr.rsplitn(3, '.');
    let lo: u8 = parts.next()?.parse().ok()?;
    let hi: u8 = parts.next()?.parse().ok()?;
    let ip: IpAddr = parts.next()?.parse().ok()?;
    Some(SocketAddr::new(ip, u16::from(hi) << 8 | u16::from(lo)))
}

/// What can go wrong talking to rpcbind. Each message is one line that
/// names the address.
#[derive(Debug, thiserror::Error)]
pub enum RpcbindError {
    /// The connection could not be made.
    #[error("rpcbind at {addr} unreachable: {source}")]
    Unreachable {
        /// Where we tried.
        addr: RpcbindAddress,
        /// Why it failed.
        source: std::io::Error,
    },
    /// Sending or receiving failed or timed out.
    #[error("rpcbind at {addr}: {source}")]
    Io {
        /// The peer.
        addr: RpcbindAddress,
        /// Why it failed.
        source: std::io::Error,
    },
    /// rpcbind refused the caller (a denied reply): some rpcbind builds
    /// accept SET and UNSET only on their local socket.
    #[error(
        "rpcbind at {addr} refused the call ({reason}): rpcbind may accept registrations only \
         on its local socket: set rpcbind.address = \"/run/rpcbind.sock\" or start rpcbind with -L"
    )]
    Refused {
        /// The peer.
        addr: RpcbindAddress,
        /// The reject reason as received.
        reason: String,
    },
    /// The server did not run the call (version or program unavailable,
    /// garbage args, system error).
    #[error("rpcbind at {addr} did not accept the call: {status}")]
    NotAccepted {
        /// The peer.
        addr: RpcbindAddress,
        /// The accept status as received.
        status: String,
    },
    /// The reply did not decode.
    #[error("rpcbind at {addr} sent an undecodable reply: {source}")]
    BadReply {
        /// The peer.
        addr: RpcbindAddress,
        /// The decoding error.
        source: dataplane::wire::Error,
    },
}

enum Stream {
    Tcp(TcpStream),
    Local(UnixStream),
}

impl Stream {
    fn io(&mut self) -> &mut dyn ReadWrite {
        match self {
            Stream::Tcp(s) => s,
            Stream::Local(s) => s,
        }
    }
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

/// A blocking rpcbind client on one connection.
pub struct RpcbindClient {
    addr: RpcbindAddress,
    stream: Stream,
    version: u32,
    xid: u32,
    reassembler: RecordReassembler,
    pending: Vec<u8>,
}

impl fmt::Debug for RpcbindClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RpcbindClient")
            .field("addr", &self.addr)
            .field("version", &self.version)
            .finish()
    }
}

impl RpcbindClient {
    /// Connects to rpcbind; `timeout` bounds the connect and every later
    /// read and write.
    ///
    /// # Errors
    /// [`RpcbindError::Unreachable`] when the connection fails.
    pub fn connect(addr: &RpcbindAddress, timeout: Duration) -> Result<Self, RpcbindError> {
        let unreachable = |source| RpcbindError::Unreachable {
            addr: addr.clone(),
            source,
        };
        let stream = match addr {
            RpcbindAddress::Tcp(a) => {
                let s = TcpStream::connect_timeout(a, timeout).map_err(unreachable)?;
                s.set_read_timeout(Some(timeout)).map_err(unreachable)?;
                s.set_write_timeout(Some(timeout)).map_err(unreachable)?;
                s.set_nodelay(true).map_err(unreachable)?;
                Stream::Tcp(s)
            }
            RpcbindAddress::Local(p) => {
                let s = UnixStream::connect(p).map_err(unreachable)?;
                s.set_read_timeout(Some(timeout)).map_err(unreachable)?;
                s.set_write_timeout(Some(timeout)).map_err(unreachable)?;
                Stream::Local(s)
            }
        };
        // An XID that differs between runs, so a reply to an earlier
        // process's call is never taken for ours.
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0)
            ^ std::process::id().rotate_left(16);
        Ok(RpcbindClient {
            addr: addr.clone(),
            stream,
            version: RPCBVERS4,
            xid: seed,
            reassembler: RecordReassembler::new(MAX_REPLY_RECORD),
            pending: Vec::new(),
        })
    }

    /// The rpcbind version in use: 4, or 3 after a PROG_MISMATCH.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// RPCBPROC_SET: returns rpcbind's answer (false when another address
    /// is registered for the same program, version and netid).
    ///
    /// # Errors
    /// Any [`RpcbindError`] but `Unreachable`.
    pub fn set(&mut self, m: &Mapping) -> Result<bool, RpcbindError> {
        let body = self.call(RPCBPROC_SET, |e| m.encode(e))?;
        self.decode(&body, |d| d.get_bool())
    }

    /// RPCBPROC_UNSET: removes the mapping of `m`'s program and version for
    /// `m.netid` (every netid when empty); `m.addr` is ignored by rpcbind.
    /// Returns whether anything was removed.
    ///
    /// # Errors
    /// Any [`RpcbindError`] but `Unreachable`.
    pub fn unset(&mut self, m: &Mapping) -> Result<bool, RpcbindError> {
        let body = self.call(RPCBPROC_UNSET, |e| m.encode(e))?;
        self.decode(&body, |d| d.get_bool())
    }

    /// RPCBPROC_GETADDR: the universal address registered for `m`'s
    /// program, version and netid, `None` when there is none.
    ///
    /// # Errors
    /// Any [`RpcbindError`] but `Unreachable`.
    pub fn getaddr(&mut self, m: &Mapping) -> Result<Option<String>, RpcbindError> {
        let body = self.call(RPCBPROC_GETADDR, |e| m.encode(e))?;
        let addr = self.decode(&body, |d| {
            d.get_string(MAX_REPLY_STRING)
                .map(|s| String::from_utf8_lossy(s).into_owned())
        })?;
        Ok((!addr.is_empty()).then_some(addr))
    }

    /// RPCBPROC_DUMP: every mapping rpcbind holds.
    ///
    /// # Errors
    /// Any [`RpcbindError`] but `Unreachable`.
    pub fn dump(&mut self) -> Result<Vec<Mapping>, RpcbindError> {
        let body = self.call(RPCBPROC_DUMP, |_| Ok(()))?;
        self.decode(&body, |d| {
            let mut list = Vec::new();
            while d.get_present()? {
                list.push(Mapping::decode(d)?);
            }
            Ok(list)
        })
    }

    fn decode<T>(
        &self,
        body: &[u8],
        f: impl FnOnce(&mut Decoder<'_>) -> dataplane::wire::Result<T>,
    ) -> Result<T, RpcbindError> {
        let mut d = Decoder::new(body);
        f(&mut d).map_err(|source| RpcbindError::BadReply {
            addr: self.addr.clone(),
            source,
        })
    }

    /// Sends one call and returns the result body of a successful reply,
    /// retrying once with version 3 when the server does not speak 4.
    fn call(
        &mut self,
        procedure: u32,
        args: impl Fn(&mut Encoder<'_>) -> dataplane::wire::Result<()>,
    ) -> Result<Vec<u8>, RpcbindError> {
        match self.call_once(procedure, &args)? {
            Ok(body) => Ok(body),
            Err(AcceptStatus::ProgMismatch { low, high })
                if self.version == RPCBVERS4 && (low..=high).contains(&RPCBVERS3) =>
            {
                tracing::debug!(addr = %self.addr, "rpcbind speaks versions {low}..={high}: using 3");
                self.version = RPCBVERS3;
                match self.call_once(procedure, &args)? {
                    Ok(body) => Ok(body),
                    Err(status) => Err(self.not_accepted(status)),
                }
            }
            Err(status) => Err(self.not_accepted(status)),
        }
    }

    fn not_accepted(&self, status: AcceptStatus) -> RpcbindError {
        RpcbindError::NotAccepted {
            addr: self.addr.clone(),
            status: format!("{status:?}"),
        }
    }

    /// One call: `Ok(Ok(results))` on SUCCESS, `Ok(Err(status))` on any
    /// other accepted status.
    fn call_once(
        &mut self,
        procedure: u32,
        args: &dyn Fn(&mut Encoder<'_>) -> dataplane::wire::Result<()>,
    ) -> Result<Result<Vec<u8>, AcceptStatus>, RpcbindError> {
        self.xid = self.xid.wrapping_add(1);
        let xid = self.xid;
        let header = CallHeader::new(
            xid,
            RPCBPROG,
            self.version,
            procedure,
            OpaqueAuth::None,
            OpaqueAuth::None,
        );
        let mut buf = vec![0u8; 4096];
        let len = {
            let mut enc = Encoder::new(&mut buf[4..]);
            header
                .emit(&mut enc)
                .and_then(|()| args(&mut enc))
                .map_err(|source| RpcbindError::BadReply {
                    addr: self.addr.clone(),
                    source,
                })?;
            enc.position()
        };
        write_record_header(&mut buf, len).map_err(|source| RpcbindError::BadReply {
            addr: self.addr.clone(),
            source,
        })?;
        let io_err = |addr: &RpcbindAddress, source| RpcbindError::Io {
            addr: addr.clone(),
            source,
        };
        self.stream
            .io()
            .write_all(&buf[..4 + len])
            .map_err(|e| io_err(&self.addr, e))?;

        loop {
            let record = self.read_record()?;
            let (reply, hlen) =
                ReplyHeader::parse(&record).map_err(|source| RpcbindError::BadReply {
                    addr: self.addr.clone(),
                    source,
                })?;
            if reply.xid != xid {
                // A late reply to an earlier call of ours: skip it.
                continue;
            }
            return match reply.body {
                ReplyBody::Accepted(a) => match a.status {
                    AcceptStatus::Success => Ok(Ok(record[hlen..].to_vec())),
                    other => Ok(Err(other)),
                },
                ReplyBody::Denied(RejectedReply::AuthError(stat)) => Err(RpcbindError::Refused {
                    addr: self.addr.clone(),
                    reason: format!("auth error {stat:?}"),
                }),
                ReplyBody::Denied(RejectedReply::RpcMismatch { low, high }) => {
                    Err(RpcbindError::Refused {
                        addr: self.addr.clone(),
                        reason: format!("RPC version mismatch {low}..={high}"),
                    })
                }
            };
        }
    }

    /// Reads stream bytes until one whole record is reassembled. Bytes
    /// after that record stay in `pending` for the next call.
    fn read_record(&mut self) -> Result<Vec<u8>, RpcbindError> {
        loop {
            if let Some(record) = self.reassembler.poll_record() {
                return Ok(record.to_vec());
            }
            if self.pending.is_empty() {
                let mut chunk = [0u8; 4096];
                let n = self
                    .stream
                    .io()
                    .read(&mut chunk)
                    .map_err(|source| RpcbindError::Io {
                        addr: self.addr.clone(),
                        source,
                    })?;
                if n == 0 {
                    return Err(RpcbindError::Io {
                        addr: self.addr.clone(),
                        source: std::io::Error::new(
                            std::io::ErrorKind::UnexpectedEof,
                            "connection closed before the reply",
                        ),
                    });
                }
                self.pending.extend_from_slice(&chunk[..n]);
            }
            let used =
                self.reassembler
                    .push(&self.pending)
                    .map_err(|source| RpcbindError::BadReply {
                        addr: self.addr.clone(),
                        source,
                    })?;
            self.pending.drain(..used);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn universal_address_ipv4() {
        let a: SocketAddr = "127.0.0.1:20049".parse().unwrap();
        assert_eq!(universal_address(a), "127.0.0.1.78.81");
        let a: SocketAddr = "192.0.2.10:111".parse().unwrap();
        assert_eq!(universal_address(a), "192.0.2.10.0.111");
        let a: SocketAddr = "0.0.0.0:65535".parse().unwrap();
        assert_eq!(universal_address(a), "0.0.0.0.255.255");
    }

    #[test]
    fn universal_address_ipv6() {
        let a: SocketAddr = "[::1]:20049".parse().unwrap();
        assert_eq!(universal_address(a), "::1.78.81");
        let a: SocketAddr = "[2001:db8:0:0:0:0:0:10]:2049".parse().unwrap();
        assert_eq!(universal_address(a), "2001:db8::10.8.1");
        let a: SocketAddr = "[fe80::1%2]:1".parse().unwrap();
        assert_eq!(universal_address(a), "fe80::1.0.1");
    }

    #[test]
    fn universal_address_round_trips() {
        for s in [
            "127.0.0.1:20049",
            "[::1]:1",
            "[2001:db8::10]:65535",
            "10.1.2.3:0",
        ] {
            let a: SocketAddr = s.parse().unwrap();
            assert_eq!(
                parse_universal_address(&universal_address(a)),
                Some(a),
                "{s}"
            );
        }
        assert_eq!(parse_universal_address("127.0.0.1.78"), None);
        assert_eq!(parse_universal_address("127.0.0.1.256.1"), None);
        assert_eq!(parse_universal_address("/run/rpcbind.sock"), None);
    }

    #[test]
    fn rpcbind_address_parses() {
        assert_eq!(
            "127.0.0.1:111".parse::<RpcbindAddress>(),
            Ok(RpcbindAddress::Tcp("127.0.0.1:111".parse().unwrap()))
        );
        assert_eq!(
            "/run/rpcbind.sock".parse::<RpcbindAddress>(),
            Ok(RpcbindAddress::Local("/run/rpcbind.sock".into()))
        );
        assert!("localhost".parse::<RpcbindAddress>().is_err());
    }

    #[test]
    fn rpcb_golden_bytes() {
        let m = Mapping {
            program: 100_417,
            version: 1,
            netid: "rdma".into(),
            addr: "127.0.0.1.78.81".into(),
            owner: "0".into(),
        };
        let mut buf = [0u8; 64];
        let mut enc = Encoder::new(&mut buf);
        m.encode(&mut enc).unwrap();
        let n = enc.position();
        let expect: &[u8] = &[
            0, 1, 0x88, 0x41, // 100417
            0, 0, 0, 1, // version 1
            0, 0, 0, 4, b'r', b'd', b'm', b'a', // netid
            0, 0, 0, 15, b'1', b'2', b'7', b'.', b'0', b'.', b'0', b'.', b'1', b'.', b'7', b'8',
            b'.', b'8', b'1', 0, // uaddr + 1 pad byte
            0, 0, 0, 1, b'0', 0, 0, 0, // owner
        ];
        assert_eq!(&buf[..n], expect);
        let mut dec = Decoder::new(expect);
        assert_eq!(Mapping::decode(&mut dec).unwrap(), m);
    }

    /// A one-connection fake rpcbind: answers each call with what `reply`
    /// returns for (version, procedure), or stays silent on `None`.
    fn fake_rpcbind(
        reply: impl Fn(u32, u32) -> Option<(AcceptStatus, Option<bool>)> + Send + 'static,
    ) -> (SocketAddr, std::thread::JoinHandle<Vec<(u32, u32)>>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut seen = Vec::new();
            let mut re = RecordReassembler::new(1 << 16);
            let mut buf = [0u8; 4096];
            loop {
                let n = match s.read(&mut buf) {
                    Ok(0) | Err(_) => return seen,
                    Ok(n) => n,
                };
                let mut rest = &buf[..n];
                while !rest.is_empty() {
                    let used = re.push(rest).unwrap();
                    rest = &rest[used..];
                    let Some(rec) = re.poll_record() else { break };
                    let (call, _) = CallHeader::parse(rec).unwrap();
                    assert_eq!(call.program, RPCBPROG);
                    seen.push((call.version, call.procedure));
                    let Some((status, result)) = reply(call.version, call.procedure) else {
                        continue;
                    };
                    let mut out = [0u8; 256];
                    let mut enc = Encoder::new(&mut out[4..]);
                    ReplyHeader::accepted(call.xid, OpaqueAuth::None, status)
                        .emit(&mut enc)
                        .unwrap();
                    if let Some(b) = result {
                        enc.put_bool(b).unwrap();
                    }
                    let len = enc.position();
                    write_record_header(&mut out, len).unwrap();
                    s.write_all(&out[..4 + len]).unwrap();
                }
            }
        });
        (addr, t)
    }

    fn mapping() -> Mapping {
        Mapping {
            program: 100_417,
            version: 1,
            netid: "rdma".into(),
            addr: "127.0.0.1.78.81".into(),
            owner: "0".into(),
        }
    }

    #[test]
    fn falls_back_to_version_3_on_prog_mismatch() {
        let (addr, server) = fake_rpcbind(|vers, _| {
            Some(if vers == RPCBVERS4 {
                (AcceptStatus::ProgMismatch { low: 2, high: 3 }, None)
            } else {
                (AcceptStatus::Success, Some(true))
            })
        });
        let mut c =
            RpcbindClient::connect(&RpcbindAddress::Tcp(addr), Duration::from_secs(30)).unwrap();
        assert!(c.set(&mapping()).unwrap());
        assert_eq!(c.version(), RPCBVERS3);
        assert!(c.unset(&mapping()).unwrap());
        drop(c);
        assert_eq!(
            server.join().unwrap(),
            vec![(4, RPCBPROC_SET), (3, RPCBPROC_SET), (3, RPCBPROC_UNSET)]
        );
    }

    #[test]
    fn other_statuses_are_errors_that_name_the_address() {
        let (addr, server) = fake_rpcbind(|_, _| Some((AcceptStatus::ProcUnavail, None)));
        let mut c =
            RpcbindClient::connect(&RpcbindAddress::Tcp(addr), Duration::from_secs(30)).unwrap();
        let e = c.set(&mapping()).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("rpcbind at {addr} did not accept the call: ProcUnavail")
        );
        drop(c);
        server.join().unwrap();
    }

    #[test]
    fn a_silent_server_times_out() {
        let (addr, server) = fake_rpcbind(|_, _| None);
        let mut c =
            RpcbindClient::connect(&RpcbindAddress::Tcp(addr), Duration::from_millis(200)).unwrap();
        match c.set(&mapping()) {
            Err(RpcbindError::Io { source, .. }) => assert!(
                matches!(
                    source.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ),
                "{source}"
            ),
            other => panic!("expected a timeout, got {other:?}"),
        }
        drop(c);
        server.join().unwrap();
    }

    #[test]
    fn unreachable_names_the_address() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let e = RpcbindClient::connect(&RpcbindAddress::Tcp(closed), Duration::from_secs(5))
            .unwrap_err();
        assert!(
            e.to_string()
                .starts_with(&format!("rpcbind at {closed} unreachable: ")),
            "{e}"
        );
        let e = RpcbindClient::connect(
            &RpcbindAddress::Local("/nonexistent/rpcbind.sock".into()),
            Duration::from_secs(5),
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("rpcbind at /nonexistent/rpcbind.sock unreachable: "),
            "{e}"
        );
    }
}
