use super::bench::{self, Args};
use super::*;
use crate::wire::rpc::{AuthSys, ReplyBody};
use crate::wire::xdr;
use proptest::prelude::*;

fn call_bytes(args: Args<'_>) -> Vec<u8> {
    let data_len = match args {
        Args::Echo(d) | Args::Sink(d) => d.len(),
        _ => 0,
    };
    let mut buf = vec![0u8; 256 + data_len];
    let enc = bench::encode_call(&mut buf, 0x1234_5678, args).unwrap();
    buf.truncate(enc.len);
    buf
}

fn run(table: &ServiceTable, call: &[u8], out_len: usize) -> (Vec<u8>, Option<DdpItem>) {
    let mut out = vec![0u8; out_len];
    match table.dispatch(call, &mut out) {
        Dispatch::Reply { len, ddp } => {
            out.truncate(len);
            (out, ddp)
        }
        Dispatch::Drop => panic!("dropped"),
    }
}

fn status_of(reply: &[u8]) -> ReplyBody<'_> {
    let (h, _) = ReplyHeader::parse(reply).unwrap();
    assert_eq!(h.xid, 0x1234_5678);
    h.body
}

fn accept_status(reply: &[u8]) -> AcceptStatus {
    match status_of(reply) {
        ReplyBody::Accepted(a) => a.status,
        ReplyBody::Denied(d) => panic!("denied: {d:?}"),
    }
}

#[test]
fn null_reply_golden() {
    let (reply, ddp) = run(&ServiceTable::builtin(), &call_bytes(Args::Null), 64);
    #[rustfmt::skip]
    let golden = [
        0x12, 0x34, 0x56, 0x78, // xid
        0, 0, 0, 1,             // REPLY
        0, 0, 0, 0,             // MSG_ACCEPTED
        0, 0, 0, 0, 0, 0, 0, 0, // verifier AUTH_NONE, empty
        0, 0, 0, 0,             // SUCCESS
    ];
    assert_eq!(reply, golden);
    assert_eq!(ddp, None);
    assert_eq!(bench::decode_void_reply(&reply), Ok(()));
}

#[test]
fn echo_marks_its_result_ddp_eligible() {
    for len in [0usize, 1, 3, 4, 5, 1024, 4097] {
        let data: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
        let call = call_bytes(Args::Echo(&data));
        let (reply, ddp) = run(&ServiceTable::builtin(), &call, 64 + len + 8);
        let ddp = ddp.expect("echo result is DDP-eligible");
        assert_eq!(ddp.len as usize, len);
        // The item is the opaque's data, after its length word (24-byte
        // header + 4).
        assert_eq!(ddp.offset, 28);
        let at = ddp.offset as usize;
        assert_eq!(&reply[at..at + len], &data[..]);
        assert_eq!(reply.len(), at + xdr::roundup(len));
        assert_eq!(bench::decode_data_reply(&reply, None), Ok(&data[..]));
        // The same reply after the engine moved the item by a write chunk:
        // the inline part keeps the length word only.
        assert_eq!(
            bench::decode_data_reply(&reply[..at], Some(&data)),
            Ok(&data[..])
        );
    }
}

#[test]
fn echo_call_marks_its_argument() {
    let data = [9u8; 10];
    let mut buf = [0u8; 128];
    let enc = bench::encode_call(&mut buf, 1, Args::Echo(&data)).unwrap();
    let ddp = enc.ddp.unwrap();
    assert_eq!((ddp.offset, ddp.len), (44, 10));
    assert_eq!(&buf[40..44], &10u32.to_be_bytes());
    assert_eq!(enc.len, 44 + 12);
}

#[test]
fn source_produces_the_pattern_in_place() {
    let (reply, ddp) = run(
        &ServiceTable::builtin(),
        &call_bytes(Args::Source(1000)),
        2048,
    );
    let ddp = ddp.unwrap();
    assert_eq!(ddp.len, 1000);
    let data = bench::decode_data_reply(&reply, None).unwrap();
    assert_eq!(data.len(), 1000);
    assert_eq!(bench::pattern_mismatch(data), None);
    assert_eq!(data[1], 38);
}

#[test]
fn sink_returns_void() {
    let data = vec![1u8; 5000];
    let (reply, ddp) = run(&ServiceTable::builtin(), &call_bytes(Args::Sink(&data)), 64);
    assert_eq!(ddp, None);
    assert_eq!(bench::decode_void_reply(&reply), Ok(()));
}

#[test]
fn source_over_the_limit_is_garbage_args() {
    let (reply, _) = run(
        &ServiceTable::builtin(),
        &call_bytes(Args::Source(bench::MAX_DATA + 1)),
        64,
    );
    assert_eq!(accept_status(&reply), AcceptStatus::GarbageArgs);
}

#[test]
fn result_larger_than_the_reply_buffer_is_system_err() {
    let (reply, ddp) = run(
        &ServiceTable::builtin(),
        &call_bytes(Args::Source(4096)),
        1024,
    );
    assert_eq!(accept_status(&reply), AcceptStatus::SystemErr);
    assert_eq!(ddp, None);
    assert_eq!(reply.len(), 24);
}

fn with_header(program: u32, version: u32, procedure: u32, rest: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; 64 + rest.len()];
    let h = CallHeader::new(
        0x1234_5678,
        program,
        version,
        procedure,
        OpaqueAuth::None,
        OpaqueAuth::None,
    );
    let mut e = Encoder::new(&mut buf);
    h.emit(&mut e).unwrap();
    let n = e.position();
    buf.truncate(n);
    buf.extend_from_slice(rest);
    buf
}

#[test]
fn rfc5531_accept_errors() {
    let t = ServiceTable::builtin();
    let (r, _) = run(&t, &with_header(99, 1, 0, &[]), 64);
    assert_eq!(accept_status(&r), AcceptStatus::ProgUnavail);
    let (r, _) = run(&t, &with_header(bench::PROGRAM, 7, 1, &[]), 64);
    assert_eq!(
        accept_status(&r),
        AcceptStatus::ProgMismatch { low: 1, high: 1 }
    );
    let (r, _) = run(&t, &with_header(bench::PROGRAM, 1, 42, &[]), 64);
    assert_eq!(accept_status(&r), AcceptStatus::ProcUnavail);
    // ECHO whose opaque length runs past the message.
    let (r, _) = run(&t, &with_header(bench::PROGRAM, 1, 1, &[0, 0, 1, 0]), 64);
    assert_eq!(accept_status(&r), AcceptStatus::GarbageArgs);
    // Trailing bytes after SOURCE's count.
    let (r, _) = run(&t, &with_header(bench::PROGRAM, 1, 3, &[0; 8]), 64);
    assert_eq!(accept_status(&r), AcceptStatus::GarbageArgs);
    // NULL of the registered program ignores nothing but answers empty.
    let (r, _) = run(&t, &with_header(bench::PROGRAM, 1, 0, &[]), 64);
    assert_eq!(accept_status(&r), AcceptStatus::Success);
    assert_eq!(r.len(), 24);
}

#[test]
fn rfc5531_denials() {
    let t = ServiceTable::builtin();
    let mut v3 = with_header(bench::PROGRAM, 1, 0, &[]);
    v3[8..12].copy_from_slice(&3u32.to_be_bytes());
    let (r, _) = run(&t, &v3, 64);
    assert_eq!(
        status_of(&r),
        ReplyBody::Denied(RejectedReply::RpcMismatch { low: 2, high: 2 })
    );

    // AUTH_DH (3): not served.
    let mut dh = with_header(bench::PROGRAM, 1, 0, &[]);
    dh[24..28].copy_from_slice(&3u32.to_be_bytes());
    let (r, _) = run(&t, &dh, 64);
    assert_eq!(
        status_of(&r),
        ReplyBody::Denied(RejectedReply::AuthError(AuthStat::BadCred))
    );

    // An AUTH_SYS credential is accepted.
    let gids = [1u32, 2];
    let sys = AuthSys::new(1, b"host", 1000, 1000, &gids).unwrap();
    let h = CallHeader::new(
        0x1234_5678,
        bench::PROGRAM,
        1,
        0,
        OpaqueAuth::Sys(sys),
        OpaqueAuth::None,
    );
    let mut buf = [0u8; 128];
    let mut e = Encoder::new(&mut buf);
    h.emit(&mut e).unwrap();
    let n = e.position();
    let (r, _) = run(&t, &buf[..n], 64);
    assert_eq!(accept_status(&r), AcceptStatus::Success);

    // A credential length running past the message: BADCRED.
    let mut bad = with_header(bench::PROGRAM, 1, 0, &[]);
    bad[28..32].copy_from_slice(&400u32.to_be_bytes());
    let (r, _) = run(&t, &bad, 64);
    assert_eq!(
        status_of(&r),
        ReplyBody::Denied(RejectedReply::AuthError(AuthStat::BadCred))
    );
}

#[test]
fn not_a_call_is_dropped() {
    let t = ServiceTable::builtin();
    let mut out = [0u8; 64];
    assert_eq!(t.dispatch(&[], &mut out), Dispatch::Drop);
    assert_eq!(t.dispatch(&[0, 0, 0, 1], &mut out), Dispatch::Drop);
    let (reply, _) = run(&t, &call_bytes(Args::Null), 64);
    assert_eq!(t.dispatch(&reply, &mut out), Dispatch::Drop);
    // No room for even an error reply.
    assert_eq!(
        t.dispatch(&call_bytes(Args::Null), &mut [0u8; 8]),
        Dispatch::Drop
    );
}

#[test]
fn register_rejects_duplicates_and_lists_programs() {
    let mut t = ServiceTable::builtin();
    assert_eq!(
        t.register(Arc::new(bench::BenchService)),
        Err(RegisterError::Duplicate(bench::PROGRAM))
    );
    let listed: Vec<_> = t.programs().collect();
    assert_eq!(listed, [(bench::PROGRAM, 1, "rpcrdma_bench")]);
}

proptest! {
    // Total: any bytes, any reply buffer size, no panic; a reply always
    // fits the buffer and starts with the call's XID.
    #[test]
    fn dispatch_is_total(bytes in proptest::collection::vec(any::<u8>(), 0..200), out_len in 0usize..300) {
        let t = ServiceTable::builtin();
        let mut out = vec![0u8; out_len];
        if let Dispatch::Reply { len, ddp } = t.dispatch(&bytes, &mut out) {
            prop_assert!(len <= out_len);
            prop_assert_eq!(&out[..4], &bytes[..4]);
            if let Some(d) = ddp {
                prop_assert!(d.offset as usize + d.len as usize <= len);
            }
        }
    }

    // `dispatch_known` answers byte for byte as `dispatch`, for the header
    // the parse found and for any other `known`: calls to the bench program
    // or others, any procedure, AUTH_NONE, AUTH_SYS or another flavor,
    // arguments or garbage after the header, a mutated byte anywhere.
    #[test]
    fn dispatch_known_answers_as_dispatch(
        program in prop_oneof![Just(bench::PROGRAM), any::<u32>()],
        version in 0u32..3,
        procedure in 0u32..6,
        flavor in 0u32..3,
        rest in proptest::collection::vec(any::<u8>(), 0..64),
        flip in proptest::option::of((0usize..120, any::<u8>())),
        lie in proptest::option::of((0usize..5, any::<u32>())),
        out_len in 0usize..300,
    ) {
        let sys = AuthSys::new(7, b"host", 1000, 1000, &[1000, 27]).unwrap();
        let credential = match flavor {
            0 => OpaqueAuth::None,
            1 => OpaqueAuth::Sys(sys),
            _ => OpaqueAuth::Other { flavor: crate::wire::rpc::AuthFlavor(6), body: b"gss!" },
        };
        let h = CallHeader::new(0x1234_5678, program, version, procedure, credential, OpaqueAuth::None);
        let mut bytes = vec![0u8; h.buffer_len()];
        h.emit(&mut Encoder::new(&mut bytes)).unwrap();
        bytes.extend_from_slice(&rest);
        if let Some((at, v)) = flip {
            if let Some(b) = bytes.get_mut(at) {
                *b = v;
            }
        }
        let parsed = CallHeader::parse(&bytes).ok();
        let mut known = match parsed {
            Some((h, header_len)) => KnownCall { xid: h.xid, program: h.program, version: h.version, procedure: h.procedure, header_len },
            None => KnownCall { xid: 0x1234_5678, program, version, procedure, header_len: 40 },
        };
        if let Some((field, v)) = lie {
            match field {
                0 => known.xid = v,
                1 => known.program = v,
                2 => known.version = v,
                3 => known.procedure = v,
                _ => known.header_len = v as usize % 200,
            }
        }
        let t = ServiceTable::builtin();
        let (mut a, mut b) = (vec![0u8; out_len], vec![0u8; out_len]);
        let da = t.dispatch(&bytes, &mut a);
        let db = t.dispatch_known(&bytes, &known, &mut b);
        match (da, db) {
            (Dispatch::Reply { len: la, ddp: pa }, Dispatch::Reply { len: lb, ddp: pb }) => {
                prop_assert_eq!(&a[..la], &b[..lb]);
                prop_assert_eq!(pa, pb);
            }
            (Dispatch::Drop, Dispatch::Drop) => {}
            (x, y) => prop_assert!(false, "dispatch {:?}, dispatch_known {:?}", x, y),
        }
    }

    // Round trip of the client encoders through the table.
    #[test]
    fn echo_round_trip(data in proptest::collection::vec(any::<u8>(), 0..3000)) {
        let call = call_bytes(Args::Echo(&data));
        let (reply, _) = run(&ServiceTable::builtin(), &call, 64 + data.len() + 4);
        prop_assert_eq!(bench::decode_data_reply(&reply, None), Ok(&data[..]));
    }
}
