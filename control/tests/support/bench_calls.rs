//! Bench-program calls over RPC-over-RDMA from `dataplane::client`, every
//! path a requester can choose (RFC 5666 s3.4, s5): inline, a DDP-eligible
//! argument in a read chunk, a DDP-eligible result in a write chunk, a
//! reply chunk, and a long call (RDMA_NOMSG with a position-zero read
//! chunk). Every byte is checked. Used against the daemon on this host
//! (serve.rs) and on a Linux guest's RDMA device (linux_peer.rs).

use dataplane::client::{CallOutcome, Client, ClientConfig, ReplyTarget};
use dataplane::engine::{self, CallHandle, DdpItem};
use dataplane::service::bench::{self, Args};
use dataplane::tcp::TcpClient;
use dataplane::verbs::Provider;
use dataplane::wire::rpc::{CallHeader, OpaqueAuth};
use dataplane::wire::xdr::Encoder;
use dataplane::worker::{EndpointConfig, IdleStrategy};

use super::PATIENCE;

pub const MIB: u32 = 1 << 20;

/// Client engine limits matching a daemon configured with
/// `max_message` and `credits`.
pub fn client_config(max_message: u32, calls: u32) -> ClientConfig {
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
        extensions: dataplane::engine::Extensions::EMPTY,
        idle: IdleStrategy::Adaptive {
            park_max: std::time::Duration::from_micros(200),
        },
        wait_timeout: PATIENCE,
    }
}

/// How a call travels.
#[derive(Debug, Clone, Copy)]
pub enum EchoPath {
    /// DDP-eligible argument (read chunk when large), result into a write
    /// chunk.
    DdpBothWays,
    /// DDP-eligible argument, whole reply in a reply chunk.
    ReplyChunk,
    /// Argument not marked: a call larger than inline goes as a long call.
    LongCall,
}

/// ECHO with the argument marked DDP-eligible or not.
pub fn encode_echo(
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

/// ECHO of `data` by `path`, checked byte for byte; returns the XID used.
pub fn echo<P: Provider>(client: &mut Client<P>, data: &[u8], path: EchoPath) -> u32 {
    let target = match path {
        EchoPath::DdpBothWays => ReplyTarget::WriteChunk {
            max_ddp: (data.len() as u32).max(4),
        },
        EchoPath::ReplyChunk | EchoPath::LongCall => ReplyTarget::ReplyChunk,
    };
    let mark = !matches!(path, EchoPath::LongCall);
    let mut used = 0;
    let call = client
        .call(target, |xid, buf| {
            used = xid;
            encode_echo(buf, xid, data, mark)
        })
        .unwrap_or_else(|e| panic!("echo {} via {path:?}: {e}", data.len()));
    let outcome = client.wait(call).expect("echo reply");
    let CallOutcome::Reply { len, ddp_len } = outcome else {
        panic!("echo {} via {path:?}: {outcome:?}", data.len());
    };
    // The path was really taken: a result larger than our inline receive
    // arrived in the write chunk, or (no write chunk) in the reply chunk.
    if data.len() > 4096 {
        match path {
            EchoPath::DdpBothWays => assert_eq!(ddp_len, Some(data.len() as u32)),
            EchoPath::ReplyChunk | EchoPath::LongCall => {
                assert_eq!(ddp_len, None);
                assert!(len as usize > data.len(), "reply of {len} bytes");
            }
        }
    }
    let (message, ddp) = reply_copies(client, call);
    let got = bench::decode_data_reply(&message, ddp.as_deref())
        .unwrap_or_else(|e| panic!("echo {} via {path:?}: {e}", data.len()));
    assert!(
        got == data,
        "echo of {} bytes via {path:?} differs",
        data.len()
    );
    assert!(client.release(call));
    used
}

/// Copies of a finished call's reply message and DDP result (the client
/// hands out views of memory the server wrote, never slices).
pub fn reply_copies<P: Provider>(
    client: &Client<P>,
    call: CallHandle,
) -> (Vec<u8>, Option<Vec<u8>>) {
    let message = client.reply(call).expect("reply message").to_vec();
    (message, client.ddp(call).map(|d| d.to_vec()))
}

/// A call of the bench program, every result byte decoded; returns the
/// result data.
pub fn simple_call<P: Provider>(
    client: &mut Client<P>,
    args: Args<'_>,
    target: ReplyTarget,
) -> Vec<u8> {
    call_with_xid(client, args, target).1
}

/// [`simple_call`], also returning the XID the call went with.
pub fn call_with_xid<P: Provider>(
    client: &mut Client<P>,
    args: Args<'_>,
    target: ReplyTarget,
) -> (u32, Vec<u8>) {
    let mut used = 0;
    let call = client
        .call(target, |xid, buf| {
            used = xid;
            bench::encode_call(buf, xid, args)
                .ok()
                .map(|e| (e.len, e.ddp))
        })
        .expect("call");
    let CallOutcome::Reply { .. } = client.wait(call).expect("reply") else {
        panic!("{args:?} failed");
    };
    let (message, ddp) = reply_copies(client, call);
    let out = match args {
        Args::Null | Args::Sink(_) => {
            bench::decode_void_reply(&message).expect("void reply");
            Vec::new()
        }
        _ => bench::decode_data_reply(&message, ddp.as_deref())
            .expect("data reply")
            .to_vec(),
    };
    assert!(client.release(call));
    (used, out)
}

pub fn test_data(size: usize, seed: usize) -> Vec<u8> {
    (0..size)
        .map(|i| (i.wrapping_mul(7) ^ (i >> 8) ^ seed) as u8)
        .collect()
}

/// NULL, ECHO of every size in `sizes` by every path, SOURCE into a write
/// chunk and inline, SINK from a read chunk, over one connection; every
/// byte checked. Returns the number of calls made and the connected
/// client.
pub fn rdma_calls<P: Provider>(
    url: &str,
    max_message: u32,
    sizes: &[usize],
    seed: usize,
) -> (u64, Client<P>) {
    let mut client = Client::<P>::connect(url, client_config(max_message, 4)).expect("connect");
    // CONF_RDMA (RFC 5666 s6) ran at connect: the server's limits.
    let conf = client.conf_rdma_reply().expect("CONF_RDMA reply");
    assert_eq!(conf.maxcall_sendsize, 4096);
    assert!(conf.align >= 4 && conf.align.is_power_of_two(), "{conf:?}");
    assert_eq!(conf.maxrdmaread, 16);

    simple_call(&mut client, Args::Null, ReplyTarget::Inline);
    let mut calls = 1;
    for &size in sizes {
        let data = test_data(size, seed);
        for path in [
            EchoPath::DdpBothWays,
            EchoPath::ReplyChunk,
            EchoPath::LongCall,
        ] {
            echo(&mut client, &data, path);
            calls += 1;
        }
    }
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
    (calls + 7, client)
}

/// One call over TCP, waited for with the adaptive idler (a generous
/// timeout catches a hang); returns the data of ECHO and SOURCE.
pub fn tcp_call(client: &mut TcpClient, args: Args<'_>) -> Vec<u8> {
    let xid = client
        .call(args, 0)
        .unwrap_or_else(|e| panic!("{args:?}: {e}"))
        .expect("a free slot (one call at a time)");
    let mut out = None;
    let mut idler = dataplane::worker::Idler::new(IdleStrategy::default());
    let deadline = std::time::Instant::now() + PATIENCE;
    while out.is_none() {
        let work = client
            .poll(|r| {
                assert_eq!(r.xid, xid);
                out = Some(match args {
                    Args::Null | Args::Sink(_) => {
                        r.check_void().expect("void reply");
                        Vec::new()
                    }
                    _ => r.data().expect("data reply").to_vec(),
                });
            })
            .unwrap_or_else(|e| panic!("{args:?}: {e}"));
        if work == 0 {
            assert!(std::time::Instant::now() < deadline, "{args:?}: no reply");
            idler.idle(None);
        } else {
            idler.reset();
        }
    }
    out.unwrap_or_default()
}
