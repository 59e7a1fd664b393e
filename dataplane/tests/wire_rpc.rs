//! Property, hostile-input and allocation tests for `dataplane::wire::rpc`
//! (the golden-byte tests live next to the code).

use dataplane::wire::rpc::{
    fuzz_parse, peek_direction, peek_xid, write_record_header, AcceptStatus, AuthFlavor, AuthStat,
    AuthSys, CallHeader, MessageType, OpaqueAuth, RecordMarker, RecordReassembler, RejectedReply,
    ReplyHeader, RpcMessage, MAX_AUTH_BODY_LEN, MAX_AUTH_SYS_GIDS, MAX_CALL_HEADER_LEN,
    MAX_MACHINE_NAME_LEN, MAX_REPLY_HEADER_LEN,
};
use dataplane::wire::xdr::Encoder;
use dataplane::wire::Error;
use proptest::collection::vec;
use proptest::prelude::*;

// ---------------------------------------------------------------------------
// Owned models of the borrowed Repr types, so proptest can generate them.

#[derive(Debug, Clone)]
enum OwnedAuth {
    None,
    Sys {
        stamp: u32,
        machine_name: Vec<u8>,
        uid: u32,
        gid: u32,
        gids: Vec<u32>,
    },
    Other {
        flavor: u32,
        body: Vec<u8>,
    },
}

impl OwnedAuth {
    fn repr(&self) -> OpaqueAuth<'_> {
        match self {
            OwnedAuth::None => OpaqueAuth::None,
            OwnedAuth::Sys {
                stamp,
                machine_name,
                uid,
                gid,
                gids,
            } => OpaqueAuth::Sys(AuthSys::new(*stamp, machine_name, *uid, *gid, gids).unwrap()),
            OwnedAuth::Other { flavor, body } => OpaqueAuth::Other {
                flavor: AuthFlavor(*flavor),
                body,
            },
        }
    }
}

fn auth_strategy() -> impl Strategy<Value = OwnedAuth> {
    prop_oneof![
        Just(OwnedAuth::None),
        (
            any::<u32>(),
            vec(any::<u8>(), 0..=MAX_MACHINE_NAME_LEN),
            any::<u32>(),
            any::<u32>(),
            vec(any::<u32>(), 0..=MAX_AUTH_SYS_GIDS),
        )
            .prop_map(|(stamp, machine_name, uid, gid, gids)| OwnedAuth::Sys {
                stamp,
                machine_name,
                uid,
                gid,
                gids,
            }),
        // Any flavor but AUTH_NONE and AUTH_SYS, any body up to the limit.
        (2u32.., vec(any::<u8>(), 0..=MAX_AUTH_BODY_LEN))
            .prop_map(|(flavor, body)| OwnedAuth::Other { flavor, body }),
        // AUTH_NONE with a non-empty body is kept opaque too.
        vec(any::<u8>(), 1..=MAX_AUTH_BODY_LEN)
            .prop_map(|body| OwnedAuth::Other { flavor: 0, body }),
    ]
}

#[derive(Debug, Clone)]
struct OwnedCall {
    xid: u32,
    rpc_version: u32,
    program: u32,
    version: u32,
    procedure: u32,
    credential: OwnedAuth,
    verifier: OwnedAuth,
}

impl OwnedCall {
    fn repr(&self) -> CallHeader<'_> {
        CallHeader {
            xid: self.xid,
            rpc_version: self.rpc_version,
            program: self.program,
            version: self.version,
            procedure: self.procedure,
            credential: self.credential.repr(),
            verifier: self.verifier.repr(),
        }
    }
}

fn call_strategy() -> impl Strategy<Value = OwnedCall> {
    (
        any::<u32>(),
        prop_oneof![4 => Just(2u32), 1 => any::<u32>()],
        any::<u32>(),
        any::<u32>(),
        any::<u32>(),
        auth_strategy(),
        auth_strategy(),
    )
        .prop_map(
            |(xid, rpc_version, program, version, procedure, credential, verifier)| OwnedCall {
                xid,
                rpc_version,
                program,
                version,
                procedure,
                credential,
                verifier,
            },
        )
}

fn accept_status_strategy() -> impl Strategy<Value = AcceptStatus> {
    prop_oneof![
        Just(AcceptStatus::Success),
        Just(AcceptStatus::ProgUnavail),
        (any::<u32>(), any::<u32>())
            .prop_map(|(low, high)| AcceptStatus::ProgMismatch { low, high }),
        Just(AcceptStatus::ProcUnavail),
        Just(AcceptStatus::GarbageArgs),
        Just(AcceptStatus::SystemErr),
    ]
}

fn rejected_strategy() -> impl Strategy<Value = RejectedReply> {
    prop_oneof![
        (any::<u32>(), any::<u32>())
            .prop_map(|(low, high)| RejectedReply::RpcMismatch { low, high }),
        (0u32..=14).prop_map(|v| RejectedReply::AuthError(AuthStat::from_wire(v).unwrap())),
    ]
}

#[derive(Debug, Clone)]
enum OwnedReply {
    Accepted {
        xid: u32,
        verifier: OwnedAuth,
        status: AcceptStatus,
    },
    Denied {
        xid: u32,
        reason: RejectedReply,
    },
}

impl OwnedReply {
    fn repr(&self) -> ReplyHeader<'_> {
        match self {
            OwnedReply::Accepted {
                xid,
                verifier,
                status,
            } => ReplyHeader::accepted(*xid, verifier.repr(), *status),
            OwnedReply::Denied { xid, reason } => ReplyHeader::denied(*xid, *reason),
        }
    }
}

fn reply_strategy() -> impl Strategy<Value = OwnedReply> {
    prop_oneof![
        (any::<u32>(), auth_strategy(), accept_status_strategy()).prop_map(
            |(xid, verifier, status)| OwnedReply::Accepted {
                xid,
                verifier,
                status
            }
        ),
        (any::<u32>(), rejected_strategy())
            .prop_map(|(xid, reason)| OwnedReply::Denied { xid, reason }),
    ]
}

/// Emits `m` followed by `body` into `buf`; returns the header length and
/// the total length.
fn emit_with_body(m: &RpcMessage<'_>, body: &[u8], buf: &mut [u8]) -> (usize, usize) {
    let mut enc = Encoder::new(buf);
    m.emit(&mut enc).unwrap();
    let header_len = enc.position();
    enc.put_opaque_fixed(body).unwrap();
    (header_len, enc.position())
}

/// Checks `parse(emit(m)) == m`, lengths, peeks and the fuzz entry point
/// on the emitted bytes (with a body after the header).
fn check_round_trip(m: RpcMessage<'_>, body: &[u8]) -> Result<(), TestCaseError> {
    let mut buf = vec![0u8; MAX_CALL_HEADER_LEN + body.len() + 4];
    let (header_len, total) = emit_with_body(&m, body, &mut buf);
    let bytes = &buf[..total];
    prop_assert_eq!(header_len, m.buffer_len());
    let (again, len) = RpcMessage::parse(bytes).unwrap();
    prop_assert_eq!(again, m);
    prop_assert_eq!(len, header_len);
    prop_assert_eq!(peek_xid(bytes), Some(m.xid()));
    prop_assert_eq!(peek_direction(bytes), Some(m.direction()));
    match m {
        RpcMessage::Call(c) => {
            prop_assert!(header_len <= MAX_CALL_HEADER_LEN);
            prop_assert_eq!(CallHeader::parse(bytes), Ok((c, header_len)));
            prop_assert_eq!(c.is_supported_version(), c.rpc_version == 2);
        }
        RpcMessage::Reply(r) => {
            prop_assert!(header_len <= MAX_REPLY_HEADER_LEN);
            prop_assert_eq!(ReplyHeader::parse(bytes), Ok((r, header_len)));
        }
    }
    fuzz_parse(bytes);
    // Every truncation inside the header is `Truncated`, never a panic.
    for cut in [0, 1, 4, 7, 8, header_len / 2, header_len - 1] {
        prop_assert_eq!(RpcMessage::parse(&bytes[..cut]), Err(Error::Truncated));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn call_headers_round_trip(call in call_strategy(), body in vec(any::<u8>(), 0..16)) {
        check_round_trip(RpcMessage::Call(call.repr()), &body)?;
    }

    #[test]
    fn reply_headers_round_trip(reply in reply_strategy(), body in vec(any::<u8>(), 0..16)) {
        check_round_trip(RpcMessage::Reply(reply.repr()), &body)?;
    }

    #[test]
    fn opaque_auth_round_trips(auth in auth_strategy()) {
        let a = auth.repr();
        let mut buf = [0u8; 4 + 4 + MAX_AUTH_BODY_LEN];
        let mut enc = Encoder::new(&mut buf);
        a.emit(&mut enc).unwrap();
        let n = enc.position();
        prop_assert_eq!(n, a.buffer_len());
        let mut d = dataplane::wire::xdr::Decoder::new(&buf[..n]);
        prop_assert_eq!(OpaqueAuth::decode(&mut d), Ok(a));
        prop_assert_eq!(d.position(), n);
    }

    /// Arbitrary bytes through every parser: they return, never panic, and
    /// whatever parses round-trips (checked inside `fuzz_parse`).
    #[test]
    fn arbitrary_bytes_never_panic(data in vec(any::<u8>(), 0..1024)) {
        fuzz_parse(&data);
    }

    /// Valid messages with one word overwritten: closer to the parsers'
    /// edges than uniformly random bytes.
    #[test]
    fn corrupted_messages_never_panic(
        call in call_strategy(),
        reply in reply_strategy(),
        word_index in 0usize..64,
        value in prop_oneof![
            Just(0u32), Just(1), Just(2), Just(15), Just(16), Just(17), Just(255),
            Just(256), Just(400), Just(401), Just(0x7fff_ffff), Just(0x8000_0000),
            Just(0xffff_ffff), any::<u32>()
        ],
    ) {
        for m in [RpcMessage::Call(call.repr()), RpcMessage::Reply(reply.repr())] {
            let mut buf = vec![0u8; MAX_CALL_HEADER_LEN];
            let mut enc = Encoder::new(&mut buf);
            m.emit(&mut enc).unwrap();
            let n = enc.position();
            let at = (word_index * 4) % n;
            buf[at..at + 4].copy_from_slice(&value.to_be_bytes());
            fuzz_parse(&buf[..n]);
            fuzz_parse(&buf[..n / 2]);
        }
    }

    /// Records cut into random fragments, streamed in random chunks,
    /// come back whole and in order.
    #[test]
    fn record_splits_reassemble_identically(
        records in vec(vec(any::<u8>(), 0..200), 1..6),
        fragment_seeds in vec(1usize..64, 1..16),
        chunk_sizes in vec(1usize..50, 1..16),
    ) {
        let max = records.iter().map(Vec::len).max().unwrap_or(0);
        let stream = frame(&records, &fragment_seeds);
        let got = reassemble(&stream, max, &chunk_sizes).unwrap();
        prop_assert_eq!(&got, &records);
        // Byte by byte gives the same.
        prop_assert_eq!(&reassemble(&stream, max, &[1]).unwrap(), &records);
        // One byte less room fails at the longest record (when it has data).
        if max > 0 {
            prop_assert_eq!(
                reassemble(&stream, max - 1, &chunk_sizes),
                Err(Error::LimitExceeded)
            );
        }
    }
}

/// Frames `records` with record marking, cutting record `i` into fragments
/// whose sizes cycle through `fragment_sizes`.
fn frame(records: &[Vec<u8>], fragment_sizes: &[usize]) -> Vec<u8> {
    let mut stream = Vec::new();
    let mut k = 0;
    for record in records {
        let mut rest = &record[..];
        loop {
            let n = fragment_sizes[k % fragment_sizes.len()].min(rest.len());
            k += 1;
            let last = n == rest.len();
            let mut word = [0u8; 4];
            RecordMarker::new(n, last).unwrap().emit(&mut word).unwrap();
            stream.extend_from_slice(&word);
            stream.extend_from_slice(&rest[..n]);
            rest = &rest[n..];
            if last {
                break;
            }
        }
    }
    stream
}

/// Streams `stream` through a reassembler in chunks of the given sizes.
fn reassemble(stream: &[u8], max: usize, chunk_sizes: &[usize]) -> Result<Vec<Vec<u8>>, Error> {
    let mut r = RecordReassembler::new(max);
    let mut records = Vec::new();
    let mut pos = 0;
    let mut i = 0;
    while pos < stream.len() {
        let end = (pos + chunk_sizes[i % chunk_sizes.len()]).min(stream.len());
        i += 1;
        let mut chunk = &stream[pos..end];
        pos = end;
        loop {
            let used = r.push(chunk)?;
            chunk = &chunk[used..];
            match r.poll_record() {
                Some(record) => records.push(record.to_vec()),
                None => break,
            }
        }
        assert!(chunk.is_empty());
    }
    assert!(!r.is_mid_record());
    Ok(records)
}

// ---------------------------------------------------------------------------
// Hostile-input corpus, kept as regression tests: each was, or could be, a
// way to crash or exhaust a careless decoder.

/// A call header (NULL, AUTH_SYS) with its fields in words, easy to poke.
fn auth_sys_call_words(name_len: u32, name_words: usize, gid_count: u32, gids: usize) -> Vec<u8> {
    let body_words = 1 + 1 + name_words + 1 + 1 + 1 + gids;
    let mut words = vec![0x1, 0, 2, 100_003, 3, 0, 1, (body_words * 4) as u32];
    words.push(7); // stamp
    words.push(name_len);
    words.extend(std::iter::repeat_n(0x6161_6161, name_words));
    words.extend([0, 0, gid_count]);
    words.extend(std::iter::repeat_n(9, gids));
    words.extend([0, 0]); // verifier AUTH_NONE
    words.iter().flat_map(|w| w.to_be_bytes()).collect()
}

#[test]
fn hostile_corpus() {
    let corpus: Vec<(&str, Vec<u8>, Error)> = vec![
        (
            "machinename length 0xFFFFFFFF",
            auth_sys_call_words(0xffff_ffff, 2, 0, 0),
            Error::LimitExceeded,
        ),
        (
            "machinename of 256 bytes",
            auth_sys_call_words(256, 64, 0, 0),
            Error::LimitExceeded,
        ),
        (
            "gids count 0xFFFFFFFF",
            auth_sys_call_words(8, 2, 0xffff_ffff, 4),
            Error::LimitExceeded,
        ),
        (
            "17 gids, all present",
            auth_sys_call_words(8, 2, 17, 17),
            Error::LimitExceeded,
        ),
        (
            "gids count beyond the body",
            auth_sys_call_words(8, 2, 5, 4),
            Error::LimitExceeded,
        ),
        (
            "credential length 0xFFFFFFFF",
            [
                0u8, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0,
            ]
            .into_iter()
            .chain([0, 0, 0, 6, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0])
            .collect(),
            Error::LimitExceeded,
        ),
        (
            "msg_type 0xFFFFFFFF",
            vec![0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0],
            Error::UnknownValue,
        ),
    ];
    for (name, bytes, want) in &corpus {
        assert_eq!(RpcMessage::parse(bytes).map(|_| ()), Err(*want), "{name}");
        fuzz_parse(bytes);
        for cut in 0..bytes.len() {
            assert!(
                RpcMessage::parse(&bytes[..cut]).is_err(),
                "{name} cut {cut}"
            );
            fuzz_parse(&bytes[..cut]);
        }
    }
    // The boundary cases just inside the limits parse.
    for ok in [
        auth_sys_call_words(255, 64, 16, 16),
        auth_sys_call_words(0, 0, 0, 0),
    ] {
        let (m, len) = RpcMessage::parse(&ok).unwrap();
        assert_eq!(len, ok.len());
        assert_eq!(m.direction(), MessageType::Call);
    }
    // Record fragment header 0x7FFFFFFF, and 0xFFFFFFFF (last + max).
    for word in [0x7fff_ffffu32, 0xffff_ffff] {
        let mut r = RecordReassembler::new(1 << 20);
        assert_eq!(r.push(&word.to_be_bytes()), Err(Error::LimitExceeded));
        fuzz_parse(&word.to_be_bytes());
    }
}

// ---------------------------------------------------------------------------
// The data path in caller buffers only: emit, frame, reassemble, parse.
// (Counting allocations needs a `#[global_allocator]`, i.e. `unsafe` or a
// crate that installs one for every test binary of this crate: left to the
// crate-wide counting-allocator test (tests/wire_alloc.rs), which can wrap this
// sequence or `fuzz_parse`.)

#[test]
fn data_path_in_caller_buffers() {
    let gids = [1, 2, 3];
    let sys = AuthSys::new(1, b"client.example", 1000, 100, &gids).unwrap();
    let call = RpcMessage::Call(CallHeader::new(
        9,
        100_003,
        3,
        6,
        OpaqueAuth::Sys(sys),
        OpaqueAuth::None,
    ));
    let reply = RpcMessage::Reply(ReplyHeader::accepted(
        9,
        OpaqueAuth::None,
        AcceptStatus::Success,
    ));
    let mut stream = [0u8; 2 * (4 + MAX_CALL_HEADER_LEN)];
    let mut storage = [0u8; MAX_CALL_HEADER_LEN];
    let mut reassembler = RecordReassembler::with_buffer(&mut storage[..]);
    assert_eq!(reassembler.max_record_len(), MAX_CALL_HEADER_LEN);
    let mut headers = [0u8; MAX_CALL_HEADER_LEN];

    for _ in 0..10 {
        // Two records, each a header in one fragment.
        let mut pos = 0;
        for m in [&call, &reply] {
            let len = m.buffer_len();
            pos += write_record_header(&mut stream[pos..], len).unwrap();
            m.emit(&mut Encoder::new(&mut stream[pos..pos + len]))
                .unwrap();
            pos += len;
        }
        // Reassemble in 7-byte chunks and parse what comes out.
        let mut parsed = [None, None];
        let mut n = 0;
        for chunk in stream[..pos].chunks(7) {
            let mut rest = chunk;
            loop {
                let used = reassembler.push(rest).unwrap();
                rest = &rest[used..];
                let Some(record) = reassembler.poll_record() else {
                    break;
                };
                headers[..record.len()].copy_from_slice(record);
                let (m, len) = RpcMessage::parse(&headers[..record.len()]).unwrap();
                assert_eq!(len, record.len());
                parsed[n] = Some(m.direction());
                n += 1;
            }
        }
        assert_eq!(parsed, [Some(MessageType::Call), Some(MessageType::Reply)]);
    }
}
