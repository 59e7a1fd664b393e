//! Golden bytes written from the RFC 1813 XDR grammar, round trips,
//! truncation at every byte, limits, DDP marking and hostile input.

use super::*;
use crate::wire::rpc::AuthSys;

/// Hand-assembled XDR: words, hypers and raw bytes (padding is written
/// out explicitly by each test).
#[derive(Default)]
struct B(Vec<u8>);

impl B {
    fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn raw(mut self, b: &[u8]) -> Self {
        self.0.extend_from_slice(b);
        self
    }
    /// RPC call header, AUTH_NONE credential and verifier (RFC 5531 s9).
    fn call(self, xid: u32, prog: u32, proc: u32) -> Self {
        self.u32(xid)
            .u32(0)
            .u32(2)
            .u32(prog)
            .u32(3)
            .u32(proc)
            .u32(0)
            .u32(0)
            .u32(0)
            .u32(0)
    }
    /// Accepted SUCCESS reply header, AUTH_NONE verifier.
    fn reply(self, xid: u32) -> Self {
        self.u32(xid).u32(1).u32(0).u32(0).u32(0).u32(0)
    }
    /// The `fattr3` of [`attrs`], field by field (RFC 1813 s2.5).
    fn fattr(self) -> Self {
        self.u32(1) // NF3REG
            .u32(0o644)
            .u32(1)
            .u32(1000)
            .u32(100)
            .u64(5000)
            .u64(8192)
            .u32(0)
            .u32(0)
            .u64(0x1122_3344_5566_7788)
            .u64(42)
            .u32(1)
            .u32(2)
            .u32(3)
            .u32(4)
            .u32(5)
            .u32(6)
    }
}

fn attrs() -> Fattr3 {
    Fattr3 {
        ftype: Ftype3::Reg,
        mode: 0o644,
        nlink: 1,
        uid: 1000,
        gid: 100,
        size: 5000,
        used: 8192,
        rdev: Specdata3::default(),
        fsid: 0x1122_3344_5566_7788,
        fileid: 42,
        atime: Nfstime3 {
            seconds: 1,
            nseconds: 2,
        },
        mtime: Nfstime3 {
            seconds: 3,
            nseconds: 4,
        },
        ctime: Nfstime3 {
            seconds: 5,
            nseconds: 6,
        },
    }
}

const FH32: [u8; 32] = [
    0x01, 0x00, 0x07, 0x01, 0xaa, 0xbb, 0xcc, 0xdd, 0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17,
    0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f, 0x20, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27,
];

fn fh() -> FileHandle<'static> {
    FileHandle::new(&FH32).unwrap()
}

fn name(s: &'static [u8]) -> Filename<'static> {
    Filename::new(s).unwrap()
}

fn wcc() -> WccData {
    WccData {
        before: Some(WccAttr {
            size: 4096,
            mtime: Nfstime3 {
                seconds: 7,
                nseconds: 8,
            },
            ctime: Nfstime3 {
                seconds: 9,
                nseconds: 10,
            },
        }),
        after: Some(attrs()),
    }
}

/// Every strict prefix of a message fails to decode (no prefix of these
/// messages is itself a complete message), and never panics.
fn assert_truncations_fail(bytes: &[u8], parse: impl Fn(&[u8]) -> core::result::Result<(), Error>) {
    for cut in 0..bytes.len() {
        let r = parse(&bytes[..cut]);
        assert!(
            r.is_err(),
            "prefix of {cut}/{} bytes parsed: {r:?}",
            bytes.len()
        );
    }
    parse(bytes).expect("whole message parses");
}

fn encode_nfs_call(args: &Nfs3Args<'_>) -> (Vec<u8>, Encoded) {
    let mut out = vec![0u8; 8192];
    let enc = encode_call(&mut out, 0x1234_5678, OpaqueAuth::None, args).unwrap();
    out.truncate(enc.len);
    (out, enc)
}

fn encode_nfs_reply(res: &Nfs3Res<'_>) -> (Vec<u8>, Encoded) {
    let mut out = vec![0u8; 8192];
    let enc = encode_reply(&mut out, 0x1234_5678, OpaqueAuth::None, res).unwrap();
    out.truncate(enc.len);
    (out, enc)
}

/// Splits a message the way it travels when a chunk carries its DDP item:
/// the inline part (up to and including the length word) and the data.
fn split(message: &[u8], item: DdpItem) -> (&[u8], &[u8]) {
    let off = item.offset as usize;
    let len = item.len as usize;
    assert_eq!(off % 4, 0);
    assert_eq!(
        &message[off - 4..off],
        &item.len.to_be_bytes(),
        "the item's length word precedes it"
    );
    assert_eq!(
        off + xdr::roundup(len),
        message.len(),
        "the item ends the message"
    );
    (&message[..off], &message[off..off + len])
}

/// The arguments of a call message whose header is the 40-byte AUTH_NONE one.
fn args_of(message: &[u8]) -> &[u8] {
    let (h, len) = CallHeader::parse(message).unwrap();
    assert_eq!(len, 40);
    assert_eq!(h.program, NFS_PROGRAM);
    &message[len..]
}

#[test]
fn rfc1813_read3args_call_golden() {
    let args = Nfs3Args::Read(Read3Args {
        file: fh(),
        offset: 0x0000_0001_0000_0200,
        count: 65536,
    });
    let (msg, enc) = encode_nfs_call(&args);
    // READ3args: nfs_fh3 file (length 32, no padding), offset3, count3.
    let golden = B::default()
        .call(0x1234_5678, 100_003, 6)
        .u32(32)
        .raw(&FH32)
        .u64(0x0000_0001_0000_0200)
        .u32(65536)
        .0;
    assert_eq!(msg, golden);
    assert_eq!(msg.len(), 40 + 48);
    assert_eq!(enc.ddp, None, "READ arguments carry no DDP item");
    let body = args_of(&msg);
    assert_eq!(Nfs3Args::parse_proc(Nfs3Proc::Read, body, None), Ok(args));
    assert_truncations_fail(body, |b| {
        Nfs3Args::parse_proc(Nfs3Proc::Read, b, None).map(drop)
    });
}

#[test]
fn rfc8267_write3args_data_is_the_ddp_item() {
    let data = b"hello, world";
    let args = Nfs3Args::Write(Write3Args::new(fh(), 8192, StableHow::Unstable, data));
    let (msg, enc) = encode_nfs_call(&args);
    let golden = B::default()
        .call(0x1234_5678, 100_003, 7)
        .u32(32)
        .raw(&FH32)
        .u64(8192)
        .u32(12) // count
        .u32(0) // UNSTABLE
        .u32(12)
        .raw(data)
        .0;
    assert_eq!(msg, golden);
    // 40 header + 36 fh + 8 offset + 4 count + 4 stable + 4 length word.
    assert_eq!(
        enc.ddp,
        Some(DdpItem {
            offset: 96,
            len: 12
        })
    );
    let body = args_of(&msg);
    assert_eq!(Nfs3Args::parse_proc(Nfs3Proc::Write, body, None), Ok(args));
    assert_truncations_fail(body, |b| {
        Nfs3Args::parse_proc(Nfs3Proc::Write, b, None).map(drop)
    });

    // The data pulled by a read chunk: inline stops after the length word.
    let (inline, moved) = split(&msg, enc.ddp.unwrap());
    let parsed = Nfs3Args::parse_proc(Nfs3Proc::Write, &inline[40..], Some(moved)).unwrap();
    assert_eq!(parsed, args);
    // A length word that disagrees with the moved bytes.
    assert_eq!(
        Nfs3Args::parse_proc(Nfs3Proc::Write, &inline[40..], Some(&moved[..5])),
        Err(Error::Malformed)
    );
}

#[test]
fn rfc8267_write_padding_and_odd_lengths() {
    for len in [0usize, 1, 2, 3, 4, 5, 4095] {
        let data: Vec<u8> = (0..len).map(|i| i as u8).collect();
        let args = Nfs3Args::Write(Write3Args::new(fh(), 0, StableHow::FileSync, &data));
        let (msg, enc) = encode_nfs_call(&args);
        let item = enc.ddp.unwrap();
        assert_eq!(item.len as usize, len);
        assert_eq!(&msg[item.offset as usize..][..len], &data[..]);
        assert!(msg[item.offset as usize + len..].iter().all(|&b| b == 0));
        let (inline, moved) = split(&msg, item);
        assert_eq!(
            Nfs3Args::parse_proc(Nfs3Proc::Write, &inline[40..], Some(moved)),
            Ok(args)
        );
    }
}

#[test]
fn rfc1813_read3res_ok_golden_and_write_chunk_decoding() {
    let data = b"abcde";
    let res = Nfs3Res::Read(Res3::Ok(Read3ResOk::new(Some(attrs()), true, data)));
    let (msg, enc) = encode_nfs_reply(&res);
    let golden = B::default()
        .reply(0x1234_5678)
        .u32(0) // NFS3_OK
        .u32(1) // post_op_attr present
        .fattr()
        .u32(5) // count
        .u32(1) // eof
        .u32(5)
        .raw(b"abcde")
        .raw(&[0, 0, 0])
        .0;
    assert_eq!(msg, golden);
    // 24 header + 4 status + 4 + 84 attributes + 4 count + 4 eof + 4 length.
    assert_eq!(
        enc.ddp,
        Some(DdpItem {
            offset: 128,
            len: 5
        })
    );
    assert_eq!(decode_reply(Nfs3Proc::Read, &msg, None), Ok(res));
    assert_truncations_fail(&msg[24..], |b| {
        Nfs3Res::parse_proc(Nfs3Proc::Read, b, None).map(drop)
    });

    // As received when a write chunk carried the data (the engine's
    // reply_ddp): the inline reply ends with the length word.
    let (inline, moved) = split(&msg, enc.ddp.unwrap());
    assert_eq!(decode_reply(Nfs3Proc::Read, inline, Some(moved)), Ok(res));
    assert_eq!(
        decode_reply(Nfs3Proc::Read, inline, Some(b"abcdef")),
        Err(ReplyError::Malformed(Error::Malformed))
    );
    // Data both inline and moved: the inline data is trailing garbage.
    assert_eq!(
        decode_reply(Nfs3Proc::Read, &msg, Some(moved)),
        Err(ReplyError::Malformed(Error::TrailingBytes))
    );
}

#[test]
fn rfc1813_read3res_fail_has_no_ddp_item_and_ignores_an_unused_chunk() {
    let res = Nfs3Res::Read(Res3::Fail(Nfsstat3::Stale, None));
    let (msg, enc) = encode_nfs_reply(&res);
    assert_eq!(msg, B::default().reply(0x1234_5678).u32(70).u32(0).0);
    assert_eq!(enc.ddp, None);
    assert_eq!(decode_reply(Nfs3Proc::Read, &msg, Some(b"")), Ok(res));
    assert_eq!(decode_reply(Nfs3Proc::Read, &msg, None), Ok(res));
}

#[test]
fn rfc1813_getattr_golden_fattr3_is_84_bytes() {
    let args = Nfs3Args::Getattr(Getattr3Args { object: fh() });
    let (msg, enc) = encode_nfs_call(&args);
    assert_eq!(
        msg,
        B::default()
            .call(0x1234_5678, 100_003, 1)
            .u32(32)
            .raw(&FH32)
            .0
    );
    assert_eq!(enc.ddp, None);

    let res = Nfs3Res::Getattr(Res3::Ok(Getattr3ResOk {
        obj_attributes: attrs(),
    }));
    let (msg, _) = encode_nfs_reply(&res);
    let golden = B::default().reply(0x1234_5678).u32(0).fattr().0;
    assert_eq!(msg, golden);
    assert_eq!(msg.len(), 24 + 4 + Fattr3::LEN);
    assert_eq!(decode_reply(Nfs3Proc::Getattr, &msg, None), Ok(res));
    assert_truncations_fail(&msg[24..], |b| {
        Nfs3Res::parse_proc(Nfs3Proc::Getattr, b, None).map(drop)
    });
    // resfail is the status alone.
    let fail = Nfs3Res::Getattr(Res3::Fail(Nfsstat3::Badhandle, ()));
    let (msg, _) = encode_nfs_reply(&fail);
    assert_eq!(msg, B::default().reply(0x1234_5678).u32(10001).0);
    assert_eq!(decode_reply(Nfs3Proc::Getattr, &msg, None), Ok(fail));
}

#[test]
fn rfc1813_lookup_golden_both_arms() {
    let args = Nfs3Args::Lookup(Lookup3Args {
        what: DirOpArgs3 {
            dir: fh(),
            name: name(b"file.txt"),
        },
    });
    let (msg, _) = encode_nfs_call(&args);
    let golden = B::default()
        .call(0x1234_5678, 100_003, 3)
        .u32(32)
        .raw(&FH32)
        .u32(8)
        .raw(b"file.txt")
        .0;
    assert_eq!(msg, golden);
    assert_truncations_fail(args_of(&msg), |b| {
        Nfs3Args::parse_proc(Nfs3Proc::Lookup, b, None).map(drop)
    });

    let child = [9u8; 5];
    let res = Nfs3Res::Lookup(Res3::Ok(Lookup3ResOk {
        object: FileHandle::new(&child).unwrap(),
        obj_attributes: Some(attrs()),
        dir_attributes: None,
    }));
    let (msg, _) = encode_nfs_reply(&res);
    let golden = B::default()
        .reply(0x1234_5678)
        .u32(0)
        .u32(5)
        .raw(&child)
        .raw(&[0, 0, 0])
        .u32(1)
        .fattr()
        .u32(0)
        .0;
    assert_eq!(msg, golden);
    assert_eq!(decode_reply(Nfs3Proc::Lookup, &msg, None), Ok(res));
    assert_truncations_fail(&msg[24..], |b| {
        Nfs3Res::parse_proc(Nfs3Proc::Lookup, b, None).map(drop)
    });

    let fail = Nfs3Res::Lookup(Res3::Fail(Nfsstat3::Noent, Some(attrs())));
    let (msg, _) = encode_nfs_reply(&fail);
    assert_eq!(msg, B::default().reply(0x1234_5678).u32(2).u32(1).fattr().0);
    assert_eq!(decode_reply(Nfs3Proc::Lookup, &msg, None), Ok(fail));
}

#[test]
fn rfc1813_write_and_commit_results_golden() {
    let verf = *b"VERIFIER";
    let res = Nfs3Res::Write(Res3::Ok(Write3ResOk {
        file_wcc: wcc(),
        count: 12,
        committed: StableHow::DataSync,
        verf,
    }));
    let (msg, enc) = encode_nfs_reply(&res);
    let wcc_bytes = B::default()
        .u32(1) // pre_op_attr present
        .u64(4096)
        .u32(7)
        .u32(8)
        .u32(9)
        .u32(10)
        .u32(1) // post_op_attr present
        .fattr()
        .0;
    let golden = B::default()
        .reply(0x1234_5678)
        .u32(0)
        .raw(&wcc_bytes)
        .u32(12)
        .u32(1)
        .raw(b"VERIFIER")
        .0;
    assert_eq!(msg, golden);
    assert_eq!(enc.ddp, None, "WRITE results carry no DDP item");
    assert_eq!(decode_reply(Nfs3Proc::Write, &msg, None), Ok(res));
    assert_truncations_fail(&msg[24..], |b| {
        Nfs3Res::parse_proc(Nfs3Proc::Write, b, None).map(drop)
    });

    let args = Nfs3Args::Commit(Commit3Args {
        file: fh(),
        offset: 0,
        count: 0,
    });
    let (msg, _) = encode_nfs_call(&args);
    assert_eq!(
        msg,
        B::default()
            .call(0x1234_5678, 100_003, 21)
            .u32(32)
            .raw(&FH32)
            .u64(0)
            .u32(0)
            .0
    );
    let res = Nfs3Res::Commit(Res3::Ok(Commit3ResOk {
        file_wcc: wcc(),
        verf,
    }));
    let (msg, _) = encode_nfs_reply(&res);
    let golden = B::default()
        .reply(0x1234_5678)
        .u32(0)
        .raw(&wcc_bytes)
        .raw(b"VERIFIER")
        .0;
    assert_eq!(msg, golden);
    assert_eq!(decode_reply(Nfs3Proc::Commit, &msg, None), Ok(res));
    let fail = Nfs3Res::Commit(Res3::Fail(Nfsstat3::Io, WccData::default()));
    let (msg, _) = encode_nfs_reply(&fail);
    assert_eq!(msg, B::default().reply(0x1234_5678).u32(5).u32(0).u32(0).0);
}

#[test]
fn rfc1813_readdirplus_golden_and_entry_iteration() {
    let args = Nfs3Args::Readdirplus(Readdirplus3Args {
        dir: fh(),
        cookie: 0,
        cookieverf: [0; 8],
        dircount: 4096,
        maxcount: 32768,
    });
    let (msg, _) = encode_nfs_call(&args);
    assert_eq!(
        msg,
        B::default()
            .call(0x1234_5678, 100_003, 17)
            .u32(32)
            .raw(&FH32)
            .u64(0)
            .raw(&[0; 8])
            .u32(4096)
            .u32(32768)
            .0
    );

    let h2 = [0x77u8; 8];
    let entries = [
        EntryPlus3 {
            fileid: 2,
            name: name(b"."),
            cookie: 1,
            name_attributes: None,
            name_handle: None,
        },
        EntryPlus3 {
            fileid: 42,
            name: name(b"data"),
            cookie: 2,
            name_attributes: Some(attrs()),
            name_handle: Some(FileHandle::new(&h2).unwrap()),
        },
    ];
    let res = Nfs3Res::Readdirplus(Res3::Ok(Readdirplus3ResOk {
        dir_attributes: None,
        cookieverf: *b"cookieV!",
        reply: DirListPlus3 {
            entries: EntryList::from_slice(&entries),
            eof: true,
        },
    }));
    let (msg, enc) = encode_nfs_reply(&res);
    let golden = B::default()
        .reply(0x1234_5678)
        .u32(0)
        .u32(0) // no dir attributes
        .raw(b"cookieV!")
        // entry ".": next-present, fileid, name, cookie, no attrs, no fh
        .u32(1)
        .u64(2)
        .u32(1)
        .raw(b".\0\0\0")
        .u64(1)
        .u32(0)
        .u32(0)
        // entry "data"
        .u32(1)
        .u64(42)
        .u32(4)
        .raw(b"data")
        .u64(2)
        .u32(1)
        .fattr()
        .u32(1)
        .u32(8)
        .raw(&h2)
        // end of list, eof
        .u32(0)
        .u32(1)
        .0;
    assert_eq!(msg, golden);
    assert_eq!(enc.ddp, None, "READDIRPLUS has no DDP item");
    let got = decode_reply(Nfs3Proc::Readdirplus, &msg, None).unwrap();
    assert_eq!(got, res);
    let Nfs3Res::Readdirplus(Res3::Ok(ok)) = got else {
        panic!("{got:?}")
    };
    let list = ok.reply.entries;
    assert_eq!(list.len(), 2);
    let names: Vec<&[u8]> = list.iter().map(|e| e.name.as_bytes()).collect();
    assert_eq!(names, [&b"."[..], &b"data"[..]]);
    assert_eq!(list.iter().nth(1), Some(entries[1]));
    assert_truncations_fail(&msg[24..], |b| {
        Nfs3Res::parse_proc(Nfs3Proc::Readdirplus, b, None).map(drop)
    });

    // An empty list.
    let empty = Nfs3Res::Readdirplus(Res3::Ok(Readdirplus3ResOk {
        dir_attributes: None,
        cookieverf: [0; 8],
        reply: DirListPlus3 {
            entries: EntryList::default(),
            eof: false,
        },
    }));
    let (msg, _) = encode_nfs_reply(&empty);
    assert_eq!(
        msg,
        B::default()
            .reply(0x1234_5678)
            .u32(0)
            .u32(0)
            .raw(&[0; 8])
            .u32(0)
            .u32(0)
            .0
    );
    let got = decode_reply(Nfs3Proc::Readdirplus, &msg, None).unwrap();
    assert_eq!(got, empty);
}

#[test]
fn rfc8267_readlink_result_path_is_the_ddp_item() {
    let args = Nfs3Args::Readlink(Readlink3Args { symlink: fh() });
    let (_, enc) = encode_nfs_call(&args);
    assert_eq!(enc.ddp, None);
    let target = NfsPath::new(b"../target/file").unwrap();
    let res = Nfs3Res::Readlink(Res3::Ok(Readlink3ResOk {
        symlink_attributes: None,
        data: target,
    }));
    let (msg, enc) = encode_nfs_reply(&res);
    let golden = B::default()
        .reply(0x1234_5678)
        .u32(0)
        .u32(0)
        .u32(14)
        .raw(b"../target/file\0\0")
        .0;
    assert_eq!(msg, golden);
    assert_eq!(
        enc.ddp,
        Some(DdpItem {
            offset: 36,
            len: 14
        })
    );
    assert_eq!(decode_reply(Nfs3Proc::Readlink, &msg, None), Ok(res));
    let (inline, moved) = split(&msg, enc.ddp.unwrap());
    assert_eq!(
        decode_reply(Nfs3Proc::Readlink, inline, Some(moved)),
        Ok(res)
    );
    assert_truncations_fail(&msg[24..], |b| {
        Nfs3Res::parse_proc(Nfs3Proc::Readlink, b, None).map(drop)
    });
}

#[test]
fn rfc8267_symlink_argument_path_is_the_ddp_item() {
    let args = Nfs3Args::Symlink(Symlink3Args {
        dirop: DirOpArgs3 {
            dir: fh(),
            name: name(b"ln"),
        },
        symlink_attributes: Sattr3 {
            mode: Some(0o777),
            atime: SetTime::ServerTime,
            mtime: SetTime::ClientTime(Nfstime3 {
                seconds: 11,
                nseconds: 12,
            }),
            ..Sattr3::default()
        },
        symlink_data: NfsPath::new(b"/a/b").unwrap(),
    });
    let (msg, enc) = encode_nfs_call(&args);
    let golden = B::default()
        .call(0x1234_5678, 100_003, 10)
        .u32(32)
        .raw(&FH32)
        .u32(2)
        .raw(b"ln\0\0")
        .u32(1)
        .u32(0o777) // set_mode3
        .u32(0) // uid
        .u32(0) // gid
        .u32(0) // size
        .u32(1) // SET_TO_SERVER_TIME
        .u32(2)
        .u32(11)
        .u32(12) // SET_TO_CLIENT_TIME
        .u32(4)
        .raw(b"/a/b")
        .0;
    assert_eq!(msg, golden);
    assert_eq!(
        enc.ddp,
        Some(DdpItem {
            offset: msg.len() as u32 - 4,
            len: 4
        })
    );
    let body = args_of(&msg);
    assert_eq!(
        Nfs3Args::parse_proc(Nfs3Proc::Symlink, body, None),
        Ok(args)
    );
    assert_truncations_fail(body, |b| {
        Nfs3Args::parse_proc(Nfs3Proc::Symlink, b, None).map(drop)
    });
    let (inline, moved) = split(&msg, enc.ddp.unwrap());
    assert_eq!(
        Nfs3Args::parse_proc(Nfs3Proc::Symlink, &inline[40..], Some(moved)),
        Ok(args)
    );

    let res = Nfs3Res::Symlink(Res3::Ok(Symlink3ResOk {
        obj: Some(fh()),
        obj_attributes: None,
        dir_wcc: WccData::default(),
    }));
    let (msg, enc) = encode_nfs_reply(&res);
    assert_eq!(enc.ddp, None);
    assert_eq!(decode_reply(Nfs3Proc::Symlink, &msg, None), Ok(res));
}

#[test]
fn rfc8267_ddp_eligibility_table() {
    for p in Nfs3Proc::ALL {
        let want = match p {
            Nfs3Proc::Write | Nfs3Proc::Symlink => Some(DdpSide::Call),
            Nfs3Proc::Read | Nfs3Proc::Readlink => Some(DdpSide::Reply),
            _ => None,
        };
        assert_eq!(ddp_eligible(p), want, "{p:?}");
        assert_eq!(Nfs3Proc::from_wire(p.to_wire()), Ok(p));
    }
    assert_eq!(Nfs3Proc::from_wire(22), Err(Error::UnknownValue));
}

#[test]
fn null_procedures_are_empty() {
    let (msg, enc) = encode_nfs_call(&Nfs3Args::Null);
    assert_eq!(msg, B::default().call(0x1234_5678, 100_003, 0).0);
    assert_eq!(enc.ddp, None);
    let (msg, _) = encode_nfs_reply(&Nfs3Res::Null);
    assert_eq!(decode_reply(Nfs3Proc::Null, &msg, None), Ok(Nfs3Res::Null));
    assert_eq!(
        Nfs3Res::parse_proc(Nfs3Proc::Null, &[0, 0, 0, 0], None),
        Err(Error::TrailingBytes)
    );
}

#[test]
fn rfc1813_appendix_i_mount_golden() {
    let path = DirPath::new(b"/export").unwrap();
    let mut out = [0u8; 256];
    let cred = OpaqueAuth::Sys(AuthSys::new(0, b"h", 0, 0, &[]).unwrap());
    let enc = encode_mount_call(&mut out, 7, cred, &MountArgs::Mnt(path)).unwrap();
    let golden = B::default()
        .u32(7)
        .u32(0)
        .u32(2)
        .u32(100_005)
        .u32(3)
        .u32(1)
        // AUTH_SYS: flavor, body length 24, stamp, "h", uid, gid, no gids
        .u32(1)
        .u32(24)
        .u32(0)
        .u32(1)
        .raw(b"h\0\0\0")
        .u32(0)
        .u32(0)
        .u32(0)
        .u32(0)
        .u32(0) // verifier
        .u32(7)
        .raw(b"/export\0")
        .0;
    assert_eq!(&out[..enc.len], &golden[..]);
    assert_eq!(enc.ddp, None);
    let (h, hl) = CallHeader::parse(&golden).unwrap();
    assert_eq!(h.procedure, MountProc::Mnt.to_wire());
    assert_eq!(
        MountArgs::parse_proc(MountProc::Mnt, &golden[hl..], None),
        Ok(MountArgs::Mnt(path))
    );
    assert_truncations_fail(&golden[hl..], |b| {
        MountArgs::parse_proc(MountProc::Mnt, b, None).map(drop)
    });

    let ok = MountRes3Ok::new(fh(), &[1, 6]).unwrap();
    let res = MountRes::Mnt(MntRes3::Ok(ok));
    let enc = encode_mount_reply(&mut out, 7, OpaqueAuth::None, &res).unwrap();
    let golden = B::default()
        .reply(7)
        .u32(0)
        .u32(32)
        .raw(&FH32)
        .u32(2)
        .u32(1)
        .u32(6)
        .0;
    assert_eq!(&out[..enc.len], &golden[..]);
    let got = decode_mount_reply(MountProc::Mnt, &golden).unwrap();
    assert_eq!(got, res);
    let MountRes::Mnt(MntRes3::Ok(got)) = got else {
        panic!()
    };
    assert_eq!(got.auth_flavors(), &[1, 6]);
    assert_eq!(got.fhandle().as_bytes(), &FH32);
    assert_truncations_fail(&golden[24..], |b| {
        MountRes::parse_proc(MountProc::Mnt, b, None).map(drop)
    });

    let fail = MountRes::Mnt(MntRes3::Fail(Mountstat3::Acces));
    let enc = encode_mount_reply(&mut out, 7, OpaqueAuth::None, &fail).unwrap();
    assert_eq!(&out[..enc.len], &B::default().reply(7).u32(13).0[..]);
    let enc = encode_mount_call(&mut out, 8, OpaqueAuth::None, &MountArgs::Umnt(path)).unwrap();
    let (_, hl) = CallHeader::parse(&out[..enc.len]).unwrap();
    assert_eq!(
        MountArgs::parse_proc(MountProc::Umnt, &out[hl..enc.len], None),
        Ok(MountArgs::Umnt(path))
    );
    let enc = encode_mount_reply(&mut out, 8, OpaqueAuth::None, &MountRes::Umnt(())).unwrap();
    assert_eq!(
        decode_mount_reply(MountProc::Umnt, &out[..enc.len]),
        Ok(MountRes::Umnt(()))
    );
}

#[test]
fn rfc1813_appendix_i_export_dump_umntall_golden() {
    let mut out = [0u8; 512];
    for (args, proc) in [
        (MountArgs::Export(()), 5),
        (MountArgs::Dump(()), 2),
        (MountArgs::Umntall(()), 4),
    ] {
        let enc = encode_mount_call(&mut out, 3, OpaqueAuth::None, &args).unwrap();
        assert_eq!(
            &out[..enc.len],
            &B::default().call(3, MOUNT_PROGRAM, proc).0[..]
        );
        assert_eq!(MountArgs::parse_proc(args.procedure(), &[], None), Ok(args));
    }

    let groups = [
        MountName::new(b"10.0.0.0/8").unwrap(),
        MountName::new(b"admin").unwrap(),
    ];
    let exports = [
        ExportNode {
            dir: DirPath::new(b"/export").unwrap(),
            groups: GroupList::from_slice(&groups),
        },
        ExportNode {
            dir: DirPath::new(b"/pub").unwrap(),
            groups: GroupList::default(),
        },
    ];
    let res = MountRes::Export(ExportList::from_slice(&exports));
    let enc = encode_mount_reply(&mut out, 3, OpaqueAuth::None, &res).unwrap();
    let golden = B::default()
        .reply(3)
        // exportnode "/export" with two groups
        .u32(1)
        .u32(7)
        .raw(b"/export\0")
        .u32(1)
        .u32(10)
        .raw(b"10.0.0.0/8\0\0")
        .u32(1)
        .u32(5)
        .raw(b"admin\0\0\0")
        .u32(0)
        // exportnode "/pub", no groups
        .u32(1)
        .u32(4)
        .raw(b"/pub")
        .u32(0)
        // end of exports
        .u32(0)
        .0;
    assert_eq!(&out[..enc.len], &golden[..]);
    let got = decode_mount_reply(MountProc::Export, &golden).unwrap();
    assert_eq!(got, res);
    let MountRes::Export(list) = got else {
        panic!("{got:?}")
    };
    let dirs: Vec<&[u8]> = list.iter().map(|e| e.dir.as_bytes()).collect();
    assert_eq!(dirs, [&b"/export"[..], &b"/pub"[..]]);
    let first = list.iter().next().unwrap();
    let names: Vec<&[u8]> = first.groups.iter().map(|g| g.as_bytes()).collect();
    assert_eq!(names, [&b"10.0.0.0/8"[..], &b"admin"[..]]);
    assert_eq!(list.len(), 2);
    assert_truncations_fail(&golden[24..], |b| {
        MountRes::parse_proc(MountProc::Export, b, None).map(drop)
    });

    let mounts = [MountBody {
        hostname: MountName::new(b"client1").unwrap(),
        directory: DirPath::new(b"/export").unwrap(),
    }];
    let res = MountRes::Dump(MountList::from_slice(&mounts));
    let enc = encode_mount_reply(&mut out, 4, OpaqueAuth::None, &res).unwrap();
    let golden = B::default()
        .reply(4)
        .u32(1)
        .u32(7)
        .raw(b"client1\0")
        .u32(7)
        .raw(b"/export\0")
        .u32(0)
        .0;
    assert_eq!(&out[..enc.len], &golden[..]);
    assert_eq!(decode_mount_reply(MountProc::Dump, &golden), Ok(res));
    assert_truncations_fail(&golden[24..], |b| {
        MountRes::parse_proc(MountProc::Dump, b, None).map(drop)
    });
    // An empty list, and a group name over MNTNAMLEN.
    assert_eq!(
        MountRes::parse_proc(MountProc::Export, &[0, 0, 0, 0], None),
        Ok(MountRes::Export(ExportList::default()))
    );
    let long = B::default()
        .u32(1)
        .u32(1)
        .raw(b"/\0\0\0")
        .u32(1)
        .u32(256)
        .raw(&[b'g'; 256])
        .u32(0)
        .u32(0)
        .0;
    assert_eq!(
        MountRes::parse_proc(MountProc::Export, &long, None),
        Err(Error::LimitExceeded)
    );
    assert_eq!(
        MountArgs::Export(()).reply_expect().max_len,
        24 + MAX_MOUNT_LIST_REPLY
    );
}

#[test]
fn limits_are_enforced_both_ways() {
    // nfs_fh3 of 65 bytes: refused to construct and to decode.
    let big = [0u8; 80];
    assert_eq!(FileHandle::new(&big[..65]), Err(Error::LimitExceeded));
    assert!(FileHandle::new(&big[..64]).is_ok());
    let mut bytes = B::default().u32(65).raw(&big[..68]).0;
    assert_eq!(
        Nfs3Args::parse_proc(Nfs3Proc::Getattr, &bytes, None),
        Err(Error::LimitExceeded)
    );
    bytes[3] = 64;
    assert!(Nfs3Args::parse_proc(Nfs3Proc::Getattr, &bytes[..68], None).is_ok());

    // filename3 over 255, nfspath3 over 4096, dirpath over 1024.
    let long = vec![b'x'; 5000];
    assert_eq!(Filename::new(&long[..256]), Err(Error::LimitExceeded));
    assert_eq!(NfsPath::new(&long[..4097]), Err(Error::LimitExceeded));
    assert_eq!(DirPath::new(&long[..1025]), Err(Error::LimitExceeded));
    let lookup = B::default()
        .u32(4)
        .raw(&[1, 2, 3, 4])
        .u32(256)
        .raw(&long[..256])
        .0;
    assert_eq!(
        Nfs3Args::parse_proc(Nfs3Proc::Lookup, &lookup, None),
        Err(Error::LimitExceeded)
    );
    let mnt = B::default().u32(1025).raw(&long[..1028]).0;
    assert_eq!(
        MountArgs::parse_proc(MountProc::Mnt, &mnt, None),
        Err(Error::LimitExceeded)
    );

    // Hostile lengths: no allocation to size, just an error.
    let hostile = B::default().u32(0xffff_ffff).u32(0).0;
    for p in Nfs3Proc::ALL {
        assert!(Nfs3Args::parse_proc(p, &hostile, None).is_err());
    }
    let read = B::default().u32(0).u32(0).u32(0).u32(0).u32(0xffff_ffff).0;
    assert_eq!(
        Nfs3Res::parse_proc(Nfs3Proc::Read, &read, None),
        Err(Error::LimitExceeded)
    );
    // DDP length over the data bound even with the data elsewhere.
    let inline = B::default().u32(0).u32(0).u32(0).u32(0).u32(0x0100_0001).0;
    assert_eq!(
        Nfs3Res::parse_proc(Nfs3Proc::Read, &inline, Some(b"x")),
        Err(Error::LimitExceeded)
    );

    // MNT flavor count over 16.
    let flavors = B::default().u32(0).u32(0).u32(17).raw(&[0; 68]).0;
    assert_eq!(
        MountRes::parse_proc(MountProc::Mnt, &flavors, None),
        Err(Error::LimitExceeded)
    );
    assert!(MountRes3Ok::new(fh(), &[0; 17]).is_err());

    // Encoders: data over the bound, a failure arm with the OK status.
    let huge = vec![0u8; MAX_DATA_LEN + 1];
    let mut out = vec![0u8; MAX_DATA_LEN + 1024];
    let w = Nfs3Args::Write(Write3Args::new(fh(), 0, StableHow::Unstable, &huge));
    assert_eq!(
        encode_call(&mut out, 1, OpaqueAuth::None, &w),
        Err(Error::LimitExceeded)
    );
    let bad = Nfs3Res::Lookup(Res3::Fail(Nfsstat3::Ok, None));
    assert_eq!(
        encode_reply(&mut out, 1, OpaqueAuth::None, &bad),
        Err(Error::Malformed)
    );
    let bad = MountRes::Mnt(MntRes3::Fail(Mountstat3::Ok));
    assert_eq!(
        encode_mount_reply(&mut out, 1, OpaqueAuth::None, &bad),
        Err(Error::Malformed)
    );
}

#[test]
fn unknown_discriminants_are_refused() {
    // nfsstat3 4 is not defined.
    assert_eq!(
        Nfs3Res::parse_proc(Nfs3Proc::Getattr, &[0, 0, 0, 4], None),
        Err(Error::UnknownValue)
    );
    // ftype3 0, stable_how 3, a post_op_attr bool of 2, time_how 3.
    let mut fattr = B::default().u32(0).fattr().0;
    fattr[7] = 0;
    assert_eq!(
        Nfs3Res::parse_proc(Nfs3Proc::Getattr, &fattr, None),
        Err(Error::UnknownValue)
    );
    let write = B::default().u32(0).u64(0).u32(0).u32(3).u32(0).0;
    assert_eq!(
        Nfs3Args::parse_proc(Nfs3Proc::Write, &write, None),
        Err(Error::UnknownValue)
    );
    assert_eq!(
        Nfs3Res::parse_proc(Nfs3Proc::Read, &[0, 0, 0, 5, 0, 0, 0, 2], None),
        Err(Error::UnknownValue)
    );
    // Procedures without a codec.
    for p in [Nfs3Proc::Setattr, Nfs3Proc::Readdir, Nfs3Proc::Fsinfo] {
        assert_eq!(Nfs3Args::parse_proc(p, &[], None), Err(Error::UnknownValue));
        assert_eq!(Nfs3Res::parse_proc(p, &[], None), Err(Error::UnknownValue));
    }
}

#[test]
fn replies_that_are_not_success() {
    let denied = B::default().u32(1).u32(1).u32(1).u32(1).u32(1).0;
    assert_eq!(
        decode_reply(Nfs3Proc::Getattr, &denied, None),
        Err(ReplyError::Denied)
    );
    let garbage = B::default().u32(1).u32(1).u32(0).u32(0).u32(0).u32(4).0;
    assert_eq!(
        decode_reply(Nfs3Proc::Getattr, &garbage, None),
        Err(ReplyError::Status(AcceptStatus::GarbageArgs))
    );
    assert_eq!(
        decode_mount_reply(MountProc::Mnt, &garbage),
        Err(ReplyError::Status(AcceptStatus::GarbageArgs))
    );
}

/// One value of every message with a codec, both directions.
fn samples<'a>(
    entries: &'a [EntryPlus3<'a>],
    data: &'a [u8],
) -> (Vec<Nfs3Args<'a>>, Vec<Nfs3Res<'a>>) {
    let dirop = DirOpArgs3 {
        dir: fh(),
        name: name(b"n"),
    };
    let path = NfsPath::new(b"p/q").unwrap();
    let args = vec![
        Nfs3Args::Null,
        Nfs3Args::Getattr(Getattr3Args { object: fh() }),
        Nfs3Args::Lookup(Lookup3Args { what: dirop }),
        Nfs3Args::Readlink(Readlink3Args { symlink: fh() }),
        Nfs3Args::Read(Read3Args {
            file: fh(),
            offset: 1,
            count: 2,
        }),
        Nfs3Args::Write(Write3Args::new(fh(), 3, StableHow::FileSync, data)),
        Nfs3Args::Symlink(Symlink3Args {
            dirop,
            symlink_attributes: Sattr3 {
                uid: Some(1),
                gid: Some(2),
                size: Some(3),
                ..Sattr3::default()
            },
            symlink_data: path,
        }),
        Nfs3Args::Readdirplus(Readdirplus3Args {
            dir: fh(),
            cookie: 9,
            cookieverf: *b"12345678",
            dircount: 1,
            maxcount: 2,
        }),
        Nfs3Args::Commit(Commit3Args {
            file: fh(),
            offset: 4,
            count: 5,
        }),
    ];
    let res = vec![
        Nfs3Res::Null,
        Nfs3Res::Getattr(Res3::Ok(Getattr3ResOk {
            obj_attributes: attrs(),
        })),
        Nfs3Res::Lookup(Res3::Fail(Nfsstat3::Acces, None)),
        Nfs3Res::Readlink(Res3::Ok(Readlink3ResOk {
            symlink_attributes: Some(attrs()),
            data: path,
        })),
        Nfs3Res::Readlink(Res3::Fail(Nfsstat3::Inval, None)),
        Nfs3Res::Read(Res3::Ok(Read3ResOk::new(None, false, data))),
        Nfs3Res::Write(Res3::Fail(Nfsstat3::Nospc, wcc())),
        Nfs3Res::Symlink(Res3::Fail(Nfsstat3::Exist, WccData::default())),
        Nfs3Res::Readdirplus(Res3::Ok(Readdirplus3ResOk {
            dir_attributes: Some(attrs()),
            cookieverf: [1; 8],
            reply: DirListPlus3 {
                entries: EntryList::from_slice(entries),
                eof: true,
            },
        })),
        Nfs3Res::Readdirplus(Res3::Fail(Nfsstat3::BadCookie, None)),
        Nfs3Res::Commit(Res3::Fail(Nfsstat3::Jukebox, wcc())),
    ];
    (args, res)
}

fn sample_entries() -> Vec<EntryPlus3<'static>> {
    (0..3)
        .map(|i| EntryPlus3 {
            fileid: i,
            name: name(&b"abc"[..i as usize]),
            cookie: i + 100,
            name_attributes: (i == 1).then(attrs),
            name_handle: (i != 0).then(fh),
        })
        .collect()
}

#[test]
fn every_sample_round_trips_and_short_buffers_write_nothing() {
    let entries = sample_entries();
    let (args, res) = samples(&entries, b"payload");
    for a in &args {
        let mut out = vec![0u8; a.buffer_len()];
        let mut e = Encoder::new(&mut out);
        a.emit(&mut e).unwrap();
        assert_eq!(e.position(), a.buffer_len());
        assert_eq!(Nfs3Args::parse_proc(a.procedure(), &out, None), Ok(*a));
        for short in 0..a.buffer_len() {
            let mut buf = vec![0u8; short];
            let mut e = Encoder::new(&mut buf);
            assert_eq!(a.emit(&mut e), Err(Error::BufferTooShort), "{a:?}");
            assert_eq!(e.position(), 0);
        }
        // The whole call, through the RPC layer.
        let (msg, enc) = encode_nfs_call(a);
        assert_eq!(enc.ddp.is_some(), a.ddp_data().is_some());
        assert_eq!(
            enc.ddp.is_some(),
            ddp_eligible(a.procedure()) == Some(DdpSide::Call)
        );
        let (h, hl) = CallHeader::parse(&msg).unwrap();
        let p = Nfs3Proc::from_wire(h.procedure).unwrap();
        assert_eq!(Nfs3Args::parse_proc(p, &msg[hl..], None), Ok(*a));
        let mut short = vec![0u8; msg.len() - 1];
        assert_eq!(
            encode_call(&mut short, 1, OpaqueAuth::None, a),
            Err(Error::BufferTooShort)
        );
        assert!(short.iter().all(|&b| b == 0), "wrote into a short buffer");
    }
    for r in &res {
        let (msg, enc) = encode_nfs_reply(r);
        let p = r.procedure();
        assert_eq!(decode_reply(p, &msg, None), Ok(*r));
        if let Some(item) = enc.ddp {
            assert_eq!(ddp_eligible(p), Some(DdpSide::Reply));
            let (inline, moved) = split(&msg, item);
            assert_eq!(decode_reply(p, inline, Some(moved)), Ok(*r));
        }
        for short in 0..r.buffer_len() {
            let mut buf = vec![0u8; short];
            let mut e = Encoder::new(&mut buf);
            assert_eq!(r.emit(&mut e), Err(Error::BufferTooShort), "{r:?}");
            assert_eq!(e.position(), 0);
        }
        // A decoder left where it was on error.
        let body = &msg[24..];
        for cut in 0..body.len() {
            let mut d = Decoder::new(&body[..cut]);
            if Nfs3Res::decode_proc(p, &mut d, None).is_err() {
                assert_eq!(d.position(), 0);
            }
        }
    }
}

#[test]
fn fuzz_entry_point_accepts_the_samples_and_their_mutations() {
    let entries = sample_entries();
    let (args, res) = samples(&entries, b"payload!!");
    let mut inputs: Vec<Vec<u8>> = Vec::new();
    for a in &args {
        inputs.push(encode_nfs_call(a).0);
        inputs.push(encode_nfs_call(a).0[40..].to_vec());
    }
    for r in &res {
        inputs.push(encode_nfs_reply(r).0);
        inputs.push(encode_nfs_reply(r).0[24..].to_vec());
    }
    for input in &inputs {
        fuzz_parse(input);
        for cut in 0..input.len() {
            fuzz_parse(&input[..cut]);
        }
        for word in (0..input.len()).step_by(4) {
            for v in [0u32, 1, 2, 0xffff_ffff, 0x8000_0000] {
                let mut m = input.clone();
                let end = (word + 4).min(m.len());
                m[word..end].copy_from_slice(&v.to_be_bytes()[..end - word]);
                fuzz_parse(&m);
            }
        }
    }
}

#[test]
fn reply_expect_covers_the_largest_replies_exactly() {
    let fh64 = FileHandle::new(&[0xfe; 64]).unwrap();
    let full_wcc = wcc();
    let data = [7u8; 13];
    let path = [b'p'; MAX_PATH_LEN];
    let cases: Vec<(Nfs3Args, Nfs3Res)> = vec![
        (Nfs3Args::Null, Nfs3Res::Null),
        (
            Nfs3Args::Getattr(Getattr3Args { object: fh() }),
            Nfs3Res::Getattr(Res3::Ok(Getattr3ResOk {
                obj_attributes: attrs(),
            })),
        ),
        (
            Nfs3Args::Lookup(Lookup3Args {
                what: DirOpArgs3 {
                    dir: fh(),
                    name: name(b"x"),
                },
            }),
            Nfs3Res::Lookup(Res3::Ok(Lookup3ResOk {
                object: fh64,
                obj_attributes: Some(attrs()),
                dir_attributes: Some(attrs()),
            })),
        ),
        (
            Nfs3Args::Readlink(Readlink3Args { symlink: fh() }),
            Nfs3Res::Readlink(Res3::Ok(Readlink3ResOk {
                symlink_attributes: Some(attrs()),
                data: NfsPath::new(&path).unwrap(),
            })),
        ),
        (
            Nfs3Args::Read(Read3Args {
                file: fh(),
                offset: 0,
                count: 13,
            }),
            Nfs3Res::Read(Res3::Ok(Read3ResOk::new(Some(attrs()), false, &data))),
        ),
        (
            Nfs3Args::Write(Write3Args::new(fh(), 0, StableHow::Unstable, &data)),
            Nfs3Res::Write(Res3::Ok(Write3ResOk {
                file_wcc: full_wcc,
                count: 13,
                committed: StableHow::FileSync,
                verf: [0; 8],
            })),
        ),
        (
            Nfs3Args::Symlink(Symlink3Args {
                dirop: DirOpArgs3 {
                    dir: fh(),
                    name: name(b"l"),
                },
                symlink_attributes: Sattr3::default(),
                symlink_data: NfsPath::new(b"t").unwrap(),
            }),
            Nfs3Res::Symlink(Res3::Ok(Symlink3ResOk {
                obj: Some(fh64),
                obj_attributes: Some(attrs()),
                dir_wcc: full_wcc,
            })),
        ),
        (
            Nfs3Args::Commit(Commit3Args {
                file: fh(),
                offset: 0,
                count: 0,
            }),
            Nfs3Res::Commit(Res3::Ok(Commit3ResOk {
                file_wcc: full_wcc,
                verf: [0; 8],
            })),
        ),
    ];
    for (args, res) in &cases {
        let expect = args.reply_expect();
        let (msg, enc) = encode_nfs_reply(res);
        assert_eq!(expect.max_len as usize, msg.len(), "{args:?}");
        assert_eq!(expect.ddp_max, enc.ddp.map(|d| d.len), "{args:?}");
    }
    // READDIRPLUS: maxcount bounds resok.
    let rdp = Nfs3Args::Readdirplus(Readdirplus3Args {
        dir: fh(),
        cookie: 0,
        cookieverf: [0; 8],
        dircount: 512,
        maxcount: 8192,
    });
    assert_eq!(rdp.reply_expect().max_len, 24 + 4 + 8192);
    assert_eq!(rdp.reply_expect().ddp_max, None);
    let huge = Nfs3Args::Readdirplus(Readdirplus3Args {
        dir: fh(),
        cookie: 0,
        cookieverf: [0; 8],
        dircount: 0,
        maxcount: u32::MAX,
    });
    assert_eq!(huge.reply_expect().max_len, u32::MAX);
    // MNT with a 64-byte handle and 16 flavors.
    let ok = MountRes3Ok::new(fh64, &[1; MAX_AUTH_FLAVORS]).unwrap();
    let mut out = [0u8; 512];
    let enc = encode_mount_reply(
        &mut out,
        1,
        OpaqueAuth::None,
        &MountRes::Mnt(MntRes3::Ok(ok)),
    )
    .unwrap();
    let mnt = MountArgs::Mnt(DirPath::new(b"/").unwrap());
    assert_eq!(mnt.reply_expect().max_len as usize, enc.len);
}

/// A toy NFS server on the service table: it answers GETATTR, READ (five
/// pattern bytes, or NFS3ERR_STALE for an empty handle) and READLINK.
struct ToyNfs;

impl crate::service::RpcService for ToyNfs {
    fn program(&self) -> u32 {
        NFS_PROGRAM
    }
    fn versions(&self) -> core::ops::RangeInclusive<u32> {
        NFS_V3..=NFS_V3
    }
    fn name(&self) -> &'static str {
        "toy_nfs"
    }
    fn call(
        &self,
        call: &crate::service::CallInfo<'_>,
        reply: &mut crate::service::ReplyWriter<'_>,
    ) -> core::result::Result<(), ProcError> {
        let res = match decode_args(call)? {
            Nfs3Args::Getattr(_) => Nfs3Res::Getattr(Res3::Ok(Getattr3ResOk {
                obj_attributes: attrs(),
            })),
            Nfs3Args::Read(a) if a.file.is_empty() => {
                Nfs3Res::Read(Res3::Fail(Nfsstat3::Stale, None))
            }
            Nfs3Args::Read(_) => Nfs3Res::Read(Res3::Ok(Read3ResOk::new(None, true, b"abcde"))),
            Nfs3Args::Readlink(_) => Nfs3Res::Readlink(Res3::Ok(Readlink3ResOk {
                symlink_attributes: None,
                data: NfsPath::new(b"/t").unwrap(),
            })),
            _ => return Err(ProcError::ProcUnavail),
        };
        write_results(&res, reply)
    }
}

#[test]
fn a_service_answers_with_the_ddp_item_marked() {
    use crate::service::{Dispatch, ServiceTable};
    let mut table = ServiceTable::new();
    table.register(std::sync::Arc::new(ToyNfs)).unwrap();
    let empty = FileHandle::new(&[]).unwrap();
    let calls = [
        Nfs3Args::Getattr(Getattr3Args { object: fh() }),
        Nfs3Args::Read(Read3Args {
            file: fh(),
            offset: 0,
            count: 5,
        }),
        Nfs3Args::Read(Read3Args {
            file: empty,
            offset: 0,
            count: 5,
        }),
        Nfs3Args::Readlink(Readlink3Args { symlink: fh() }),
    ];
    for args in calls {
        let (msg, _) = encode_nfs_call(&args);
        let (header, parsed) = decode_call(&msg, None).unwrap();
        assert_eq!(parsed, args);
        assert_eq!(header.xid, 0x1234_5678);
        let mut out = [0u8; 1024];
        let Dispatch::Reply { len, ddp } = table.dispatch(&msg, &mut out) else {
            panic!("dropped")
        };
        let res = decode_reply(args.procedure(), &out[..len], None).unwrap();
        // The same bytes and the same DDP item as encode_reply gives.
        let (again, enc) = encode_nfs_reply(&res);
        assert_eq!(&out[..len], &again[..]);
        assert_eq!(ddp, enc.ddp, "{res:?}");
        assert!(args.reply_expect().max_len as usize >= len);
        if let Some(item) = ddp {
            let (inline, moved) = split(&out[..len], item);
            assert_eq!(decode_reply(args.procedure(), inline, Some(moved)), Ok(res));
        }
    }
    // A procedure without a codec, and garbage arguments.
    let mut out = [0u8; 256];
    let call = B::default().call(1, NFS_PROGRAM, 2).0;
    let Dispatch::Reply { len, .. } = table.dispatch(&call, &mut out) else {
        panic!()
    };
    assert_eq!(
        decode_reply(Nfs3Proc::Setattr, &out[..len], None),
        Err(ReplyError::Status(AcceptStatus::ProcUnavail))
    );
    let call = B::default().call(1, NFS_PROGRAM, 1).u32(65).0;
    let Dispatch::Reply { len, .. } = table.dispatch(&call, &mut out) else {
        panic!()
    };
    assert_eq!(
        decode_reply(Nfs3Proc::Getattr, &out[..len], None),
        Err(ReplyError::Status(AcceptStatus::GarbageArgs))
    );
    // Not NFS version 3.
    let call = B::default().call(1, MOUNT_PROGRAM, 1).0;
    assert_eq!(decode_call(&call, None).err(), Some(Error::UnknownValue));
}

mod prop {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn random_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..600)) {
            fuzz_parse(&data);
        }

        /// Word-shaped input: small words (plausible lengths, booleans and
        /// discriminants) reach far deeper than uniform bytes.
        #[test]
        fn random_words_never_panic(words in proptest::collection::vec(
            prop_oneof![0u32..4, 0u32..300, Just(0xffff_ffffu32), any::<u32>()], 0..120)
        ) {
            let data: Vec<u8> = words.iter().flat_map(|w| w.to_be_bytes()).collect();
            fuzz_parse(&data);
        }

        #[test]
        fn write_args_round_trip_with_and_without_ddp(
            fh_bytes in proptest::collection::vec(any::<u8>(), 0..=64),
            offset in any::<u64>(),
            data in proptest::collection::vec(any::<u8>(), 0..300),
        ) {
            let args = Nfs3Args::Write(Write3Args::new(
                FileHandle::new(&fh_bytes).unwrap(), offset, StableHow::DataSync, &data));
            let (msg, enc) = encode_nfs_call(&args);
            let item = enc.ddp.unwrap();
            prop_assert_eq!(Nfs3Args::parse_proc(Nfs3Proc::Write, &msg[40..], None), Ok(args));
            let (inline, moved) = split(&msg, item);
            prop_assert_eq!(
                Nfs3Args::parse_proc(Nfs3Proc::Write, &inline[40..], Some(moved)), Ok(args));
        }
    }
}
