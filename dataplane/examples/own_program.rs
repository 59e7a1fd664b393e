//! Serving and calling your own ONC RPC program over RPC-over-RDMA with
//! `dataplane` (docs/EMBEDDING.md walks through it).
//!
//!     cargo run -p dataplane --example own_program
//!
//! The program, in rpcgen's language:
//!
//! ```text
//! program TEXT_PROG {                 /* 0x20001234, the user range */
//!     version TEXT_V1 {
//!         void   NULL(void)          = 0;   /* answered by ServiceTable */
//!         string UPPER(string<4096>) = 1;
//!         opaque REVERSE(opaque<>)   = 2;   /* result DDP-eligible */
//!     } = 1;
//! } = 0x20001234;
//! ```
//!
//! A worker pool on the `shm` provider serves it (one unpinned worker, an
//! acceptor thread); a `Client` connects over the same provider and calls
//! each procedure. REVERSE of 64 KiB travels in a write chunk: the
//! service only marks the result DDP-eligible, the engine moves it by RDMA
//! Write. Everything ends within a deadline and the pool shuts down with
//! every buffer back.

use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dataplane::client::{CallOutcome, Client, ClientConfig, ReplyTarget};
use dataplane::engine::{self, DdpItem};
use dataplane::service::{CallInfo, ProcError, ReplyWriter, RpcService, ServiceTable};
use dataplane::verbs::shm::Shm;
use dataplane::verbs::{Context, Provider};
use dataplane::wire::rpc::{CallHeader, OpaqueAuth, ReplyHeader};
use dataplane::wire::xdr::{Decoder, Encoder};
use dataplane::worker::{EndpointConfig, IdleStrategy, WorkerConfig, WorkerError, WorkerPool};

/// Program number, in the range RFC 5531 appendix B leaves to users.
pub const TEXT_PROG: u32 = 0x2000_1234;
const TEXT_V1: u32 = 1;
const UPPER: u32 = 1;
const REVERSE: u32 = 2;
const MAX_STRING: usize = 4096;

/// The server side: decode arguments with the total `Decoder`, encode
/// results with the `ReplyWriter`. Runs inside a worker, so it must not
/// block or allocate per call.
struct TextService;

impl RpcService for TextService {
    fn program(&self) -> u32 {
        TEXT_PROG
    }

    fn versions(&self) -> RangeInclusive<u32> {
        TEXT_V1..=TEXT_V1
    }

    fn name(&self) -> &'static str {
        "text"
    }

    fn call(&self, call: &CallInfo<'_>, reply: &mut ReplyWriter<'_>) -> Result<(), ProcError> {
        let mut args = call.decoder();
        match call.procedure {
            UPPER => {
                let s = args.get_string(MAX_STRING)?;
                // Encode in place: no buffer of our own.
                let out = reply.encoder().put_opaque_in_place(s.len())?;
                for (o, c) in out.iter_mut().zip(s) {
                    *o = c.to_ascii_uppercase();
                }
                Ok(())
            }
            REVERSE => {
                let data = args.get_opaque(usize::MAX)?;
                // The bulk result: mark it DDP-eligible (RFC 8166 s6.1), so
                // the engine may place it in the caller's write chunk.
                let out = reply.put_ddp_opaque_in_place(data.len())?;
                for (o, b) in out.iter_mut().zip(data.iter().rev()) {
                    *o = *b;
                }
                Ok(())
            }
            _ => Err(ProcError::ProcUnavail),
        }
    }
}

/// Encodes a call to `procedure` with one opaque/string argument; marks a
/// large argument DDP-eligible so that it may go in a read chunk.
fn encode_call(
    buf: &mut [u8],
    xid: u32,
    procedure: u32,
    arg: &[u8],
) -> Option<(usize, Option<DdpItem>)> {
    let mut e = Encoder::new(buf);
    let h = CallHeader::new(
        xid,
        TEXT_PROG,
        TEXT_V1,
        procedure,
        OpaqueAuth::None,
        OpaqueAuth::None,
    );
    h.emit(&mut e).ok()?;
    let offset = e.position() as u32 + 4;
    e.put_opaque(arg).ok()?;
    let ddp = (procedure == REVERSE).then_some(DdpItem {
        offset,
        len: arg.len() as u32,
    });
    Some((e.position(), ddp))
}

/// A procedure's opaque result, and whether it came by RDMA Write.
pub struct Returned {
    /// The bytes.
    pub data: Vec<u8>,
    /// It was placed in our write chunk (not inline).
    pub placed: bool,
}

/// One call and its decoded opaque result. A result that came by RDMA
/// Write is in `client.ddp(call)`; the inline reply then holds only its
/// length word (RFC 8166 s3.4.5). The client hands out views of memory
/// the server wrote, never slices: both are copied out before decoding.
fn call(
    client: &mut Client<Shm>,
    procedure: u32,
    arg: &[u8],
    target: ReplyTarget,
) -> Result<Returned, String> {
    let handle = client
        .call(target, |xid, buf| encode_call(buf, xid, procedure, arg))
        .map_err(|e| format!("call: {e}"))?;
    match client.wait(handle).map_err(|e| format!("wait: {e}"))? {
        CallOutcome::Reply { .. } => {}
        CallOutcome::Failed(f) => return Err(format!("call failed: {f:?}")),
    }
    let message = client.reply(handle).ok_or("no reply")?.to_vec();
    let (_, header_len) = ReplyHeader::parse(&message).map_err(|e| format!("reply: {e}"))?;
    let result = match client.ddp(handle) {
        Some(placed) => Returned {
            data: placed.to_vec(),
            placed: true,
        },
        None => Returned {
            data: Decoder::new(&message[header_len..])
                .get_opaque(usize::MAX)
                .map_err(|e| format!("result: {e}"))?
                .to_vec(),
            placed: false,
        },
    };
    client.release(handle);
    Ok(result)
}

/// Serves the program, calls it, stops; returns what the calls returned.
pub fn run(socket: &std::path::Path) -> Result<(Returned, Returned), String> {
    let url = format!("shm://{}", socket.display());
    let engine = engine::Config {
        max_call_size: 1 << 20,
        max_reply_size: 1 << 20,
        max_ddp_size: (1 << 20) - 4096,
        ..engine::Config::default()
    };
    let idle = IdleStrategy::Adaptive {
        park_max: Duration::from_micros(200),
    };

    // The server: a service table with our program, one worker, a listener
    // and a thread that hands accepted connections to the pool.
    let mut services = ServiceTable::new();
    services
        .register(Arc::new(TextService))
        .map_err(|e| format!("register: {e}"))?;
    let ctx = Arc::new(Shm::open(&url).map_err(|e| format!("open: {e}"))?);
    let listener = ctx.listen(&url).map_err(|e| format!("listen: {e}"))?;
    let config = WorkerConfig {
        endpoint: EndpointConfig {
            engine,
            ..EndpointConfig::default()
        },
        idle,
        ..WorkerConfig::default()
    };
    let pool = Arc::new(
        WorkerPool::<Shm>::spawn(ctx, &[None], config, Arc::new(services))
            .map_err(|e| format!("workers: {e}"))?,
    );
    let stop = Arc::new(AtomicBool::new(false));
    let acceptor = {
        let (pool, stop) = (Arc::clone(&pool), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match pool.accept(&listener, Duration::from_millis(20)) {
                    Ok(_) | Err(WorkerError::Verbs(dataplane::verbs::VerbsError::Timeout)) => {}
                    Err(e) => eprintln!("accept: {e}"),
                }
            }
        })
    };

    // The client: same limits; `wait` gives up after `wait_timeout`.
    let result = (|| {
        let mut client = Client::<Shm>::connect(
            &url,
            ClientConfig {
                endpoint: EndpointConfig {
                    engine,
                    ..EndpointConfig::default()
                },
                conf_rdma: true,
                extensions: dataplane::engine::Extensions::EMPTY,
                idle,
                wait_timeout: Duration::from_secs(30),
            },
        )
        .map_err(|e| format!("connect: {e}"))?;
        let upper = call(&mut client, UPPER, b"hello, rdma", ReplyTarget::Inline)?;
        let data: Vec<u8> = (0..65536u32).map(|i| (i % 251) as u8).collect();
        let reversed = call(
            &mut client,
            REVERSE,
            &data,
            ReplyTarget::WriteChunk {
                max_ddp: data.len() as u32,
            },
        )?;
        Ok((upper, reversed))
    })();

    stop.store(true, Ordering::Relaxed);
    acceptor.join().map_err(|_| "acceptor panicked")?;
    let pool = Arc::try_unwrap(pool).map_err(|_| "pool still shared")?;
    let report = pool.stop(Duration::from_secs(5));
    if !report.is_clean() {
        return Err(format!("the pool did not come back whole: {report:?}"));
    }
    result
}

fn main() {
    let socket = std::env::temp_dir().join(format!("own-program-{}.sock", std::process::id()));
    match run(&socket) {
        Ok((upper, reversed)) => {
            println!(
                "UPPER(\"hello, rdma\") = {:?}",
                String::from_utf8_lossy(&upper.data)
            );
            println!(
                "REVERSE(64 KiB) = {} bytes, first {:?}, {}",
                reversed.data.len(),
                &reversed.data[..4],
                if reversed.placed {
                    "placed by RDMA Write into our write chunk"
                } else {
                    "inline"
                }
            );
        }
        Err(e) => {
            eprintln!("own_program: {e}");
            std::process::exit(1);
        }
    }
}
