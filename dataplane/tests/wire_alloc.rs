//! The decoders allocate nothing, or no more than their input justifies
//! (hostile input costs only what it carries), measured with a counting
//! global allocator over the fuzz corpora plus generated hostile inputs.

mod support;

use std::fs;
use std::path::PathBuf;

use dataplane::nfs;
use dataplane::wire::rpc::{self, RecordReassembler};
use dataplane::wire::rpcrdma::{Limits, PrivateData, TransportHeader};
use dataplane::wire::{conf, conf2, rtrext, xdr};
use support::alloc_counter::{measure, CountingAllocator};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// Every seed and corpus input of every target, plus every truncation of each, plus
/// the same inputs with each aligned word in turn set to 0xFFFFFFFF
/// (hostile counts and discriminators wherever they may sit).
fn hostile_inputs() -> Vec<Vec<u8>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut base = Vec::new();
    for dir in ["seeds", "corpus"] {
        for target in ["rpcrdma_header", "rpc_message", "record_marking", "rtrext"] {
            for entry in fs::read_dir(root.join(dir).join(target)).expect("corpus directory") {
                base.push(fs::read(entry.expect("corpus entry").path()).expect("corpus file"));
            }
        }
    }
    assert!(base.len() >= 10, "corpus too small to mean anything");
    mutations(&base)
}

/// Each input, every truncation of it, and each aligned word in turn set
/// to 0xFFFFFFFF.
fn mutations(base: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for input in base {
        for cut in 0..=input.len().min(512) {
            out.push(input[..cut].to_vec());
        }
        for word in (0..input.len().min(512)).step_by(4) {
            let mut hostile = input.clone();
            let end = (word + 4).min(hostile.len());
            hostile[word..end].fill(0xff);
            out.push(hostile);
        }
    }
    out
}

#[test]
fn warmed_rpcrdma_header_parse_allocates_nothing() {
    let inputs = hostile_inputs();
    let limits = Limits::DEFAULT;
    let mut scratch = TransportHeader::with_capacity(&limits);
    let mut parsed = 0usize;
    for input in &inputs {
        let (result, allocated) = measure(|| scratch.parse_into(input, &limits));
        parsed += usize::from(result.is_ok());
        assert_eq!(allocated.count, 0, "parse_into allocated on {input:02x?}");
    }
    // The measurement covered real messages, not only rejects.
    assert!(parsed > 10, "only {parsed} inputs parsed");
}

#[test]
fn fresh_rpcrdma_header_parse_allocates_in_proportion_to_input() {
    for input in hostile_inputs() {
        let (_, allocated) = measure(|| TransportHeader::parse(&input, &Limits::DEFAULT));
        // In memory a segment or read entry is no larger than on the wire
        // (16 and 24 bytes); vector growth may double a capacity. Beyond
        // that, a small constant for the per-chunk count vector.
        let bound = 2 * input.len() as u64 + 256;
        assert!(
            allocated.bytes <= bound,
            "{} bytes allocated for {} input bytes",
            allocated.bytes,
            input.len()
        );
    }
}

#[test]
fn rpc_conf_and_record_decoders_allocate_nothing() {
    let mut storage = [0u8; 4096];
    for input in hostile_inputs() {
        let ((), allocated) = measure(|| {
            let _ = rpc::RpcMessage::parse(&input);
            let _ = rpc::CallHeader::parse(&input);
            let _ = rpc::ReplyHeader::parse(&input);
            let _ = rpc::peek_xid(&input);
            let _ = conf::ConfigRdmaReq::parse(&input);
            let _ = conf::ConfigRdmaReply::parse(&input);
            let _ = PrivateData::parse(&input);
            let mut d = xdr::Decoder::new(&input);
            let _ = d.get_opaque(usize::MAX);
            let mut reassembler = RecordReassembler::with_buffer(&mut storage[..]);
            let mut rest = &input[..];
            while let Ok(used) = reassembler.push(rest) {
                rest = &rest[used..];
                if reassembler.poll_record().is_none() {
                    break;
                }
            }
        });
        assert_eq!(allocated.count, 0, "allocated on {input:02x?}");
    }
}

#[test]
fn warmed_rtrext_parsers_allocate_nothing() {
    let inputs = hostile_inputs();
    let limits = rtrext::Limits::DEFAULT;
    let mut header = rtrext::OptionalHeader::with_capacity(&limits);
    let mut req = conf2::ConfigRdmaReqV2::with_capacity(&limits);
    let mut reply = conf2::ConfigRdmaReplyV2::with_capacity(&limits);
    let mut parsed = 0usize;
    for input in &inputs {
        let (ok, allocated) = measure(|| {
            let a = header.parse_into(input, &limits).is_ok();
            let b = req.parse_into(input, &limits).is_ok();
            let c = reply.parse_into(input, &limits).is_ok();
            usize::from(a) + usize::from(b) + usize::from(c)
        });
        parsed += ok;
        assert_eq!(allocated.count, 0, "allocated on {input:02x?}");
    }
    assert!(parsed > 10, "only {parsed} inputs parsed");
}

#[test]
fn fresh_rtrext_parse_allocates_in_proportion_to_input() {
    let limits = rtrext::Limits::DEFAULT;
    for input in hostile_inputs() {
        let (_, allocated) = measure(|| {
            let _ = rtrext::OptionalHeader::parse(&input, &limits);
            let _ = rtrext::PropertyList::parse(&input, &limits);
            let _ = conf2::ConfigRdmaReqV2::parse(&input, &limits);
        });
        // Stored records are at most twice their wire size (segments 16
        // in memory for 16 on the wire, items 24 for at least 12); vector
        // growth may double that; a constant for the first allocations.
        let bound = 8 * input.len() as u64 + 512;
        assert!(
            allocated.bytes <= bound,
            "{} bytes allocated for {} input bytes",
            allocated.bytes,
            input.len()
        );
    }
}

/// The NFSv3 and MOUNT seeds, mutated like the other targets' inputs, as
/// whole messages and as bare arguments/results (after the RPC header).
fn nfs3_inputs() -> Vec<Vec<u8>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/nfs3");
    let mut base = Vec::new();
    for entry in fs::read_dir(dir).expect("seed directory") {
        let msg = fs::read(entry.expect("seed entry").path()).expect("seed file");
        let header = match rpc::RpcMessage::parse(&msg) {
            Ok((_, len)) => len,
            Err(_) => 0,
        };
        base.push(msg[header..].to_vec());
        base.push(msg);
    }
    assert!(base.len() >= 10, "seeds missing");
    mutations(&base)
}

#[test]
fn nfs3_decoders_allocate_nothing() {
    let mut parsed = 0usize;
    for input in nfs3_inputs() {
        let (ok, allocated) = measure(|| {
            let mut ok = 0usize;
            for p in 0..22 {
                let proc = nfs::Nfs3Proc::from_wire(p).expect("defined procedure");
                ok += usize::from(nfs::Nfs3Args::parse_proc(proc, &input, None).is_ok());
                if let Ok(nfs::Nfs3Res::Readdirplus(nfs::Res3::Ok(r))) =
                    nfs::Nfs3Res::parse_proc(proc, &input, None)
                {
                    ok += r.reply.entries.iter().count();
                }
                ok += usize::from(nfs::decode_reply(proc, &input, None).is_ok());
            }
            for p in 0..6 {
                let proc = nfs::MountProc::from_wire(p).expect("defined procedure");
                ok += usize::from(nfs::MountArgs::parse_proc(proc, &input, None).is_ok());
                ok += usize::from(nfs::decode_mount_reply(proc, &input).is_ok());
            }
            ok
        });
        parsed += ok;
        assert_eq!(allocated.count, 0, "allocated on {input:02x?}");
    }
    assert!(parsed > 10, "only {parsed} inputs parsed");
}

#[test]
fn the_counter_sees_allocations() {
    let (v, allocated) = measure(|| vec![1u8; 100]);
    assert_eq!(v.len(), 100);
    assert_eq!(allocated.count, 1);
    assert!(allocated.bytes >= 100);
}
