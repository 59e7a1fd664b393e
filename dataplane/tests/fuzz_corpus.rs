//! Replays the hand-written seeds in `fuzz/seeds/` and the fuzzing corpora
//! in `fuzz/corpus/` (what `deploy/fuzz` found, minimised and committed)
//! through the same entry points the cargo-fuzz targets call. Long fuzzing
//! runs are not a CI step; this is how CI keeps what they found.

use std::fs;
use std::path::{Path, PathBuf};

use dataplane::engine;
use dataplane::nfs;
use dataplane::wire::{conf2, rpc, rpcrdma, rtrext};

fn read_dir_sorted(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut inputs: Vec<_> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| {
            let path = entry.expect("readable directory").path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, fs::read(&path).expect("readable input file"))
        })
        .collect();
    inputs.sort();
    inputs
}

/// The seeds of `target`: real messages in the RFC layouts, which must
/// parse successfully, not merely not panic.
fn seeds(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/seeds")
        .join(target);
    let seeds = read_dir_sorted(&dir);
    assert!(!seeds.is_empty(), "{}: no seeds", dir.display());
    seeds
}

/// The fuzzer-grown corpus of `target`.
fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target);
    let corpus = read_dir_sorted(&dir);
    assert!(corpus.len() >= 10, "{}: corpus missing", dir.display());
    corpus
}

#[test]
fn replay_rpcrdma_header_corpus() {
    for (name, input) in seeds("rpcrdma_header") {
        rpcrdma::fuzz_parse(&input);
        let is_header = !matches!(name.as_str(), "private_data" | "conf_req" | "vers2_header");
        if is_header {
            let parsed = rpcrdma::TransportHeader::parse(&input, &rpcrdma::Limits::DEFAULT);
            assert!(parsed.is_ok(), "{name}: {parsed:?}");
        }
    }
    for (_, input) in corpus("rpcrdma_header") {
        rpcrdma::fuzz_parse(&input);
    }
}

#[test]
fn replay_rpc_message_corpus() {
    for (name, input) in seeds("rpc_message") {
        rpc::fuzz_parse(&input);
        assert!(rpc::RpcMessage::parse(&input).is_ok(), "{name}");
    }
    for (_, input) in corpus("rpc_message") {
        rpc::fuzz_parse(&input);
    }
}

#[test]
fn replay_record_marking_corpus() {
    for (_, input) in seeds("record_marking")
        .into_iter()
        .chain(corpus("record_marking"))
    {
        rpc::fuzz_reassembly(&input);
    }
}

#[test]
fn replay_rtrext_corpus() {
    let limits = rtrext::Limits::DEFAULT;
    for (name, input) in seeds("rtrext") {
        conf2::fuzz_parse(&input);
        if name.starts_with("conf2_req") {
            let r = conf2::ConfigRdmaReqV2::parse(&input, &limits);
            assert!(r.is_ok(), "{name}: {r:?}");
        } else if name.starts_with("conf2_reply") {
            let r = conf2::ConfigRdmaReplyV2::parse(&input, &limits);
            assert!(r.is_ok(), "{name}: {r:?}");
        } else {
            let r = rtrext::OptionalHeader::parse(&input, &limits);
            assert!(r.is_ok(), "{name}: {r:?}");
        }
    }
    for (_, input) in corpus("rtrext") {
        conf2::fuzz_parse(&input);
    }
}

#[test]
fn replay_engine_recv_corpus() {
    for (_, input) in seeds("engine_recv")
        .into_iter()
        .chain(corpus("engine_recv"))
    {
        engine::fuzz_recv(&input);
    }
}

#[test]
fn replay_roce_packet_corpus() {
    for (_, input) in seeds("roce_packet")
        .into_iter()
        .chain(corpus("roce_packet"))
    {
        // What the roce_packet target runs: the packet codec, then IB CM.
        dataplane::wire::roce::fuzz_parse(&input);
        dataplane::wire::ibcm::fuzz_parse(&input);
    }
}

/// NFSv3 and MOUNT v3 (no fuzzer-grown corpus yet, seeds only). `call_*`
/// seeds are whole calls whose arguments must decode; `reply_<proc>_*`
/// seeds are whole replies that must decode as `<proc>`'s results.
#[test]
fn replay_nfs3_seeds() {
    use dataplane::wire::rpc::CallHeader;
    for (name, input) in seeds("nfs3") {
        nfs::fuzz_parse(&input);
        if name.starts_with("call_") {
            let (call, len) = CallHeader::parse(&input).expect(&name);
            let args = &input[len..];
            let ok = match call.program {
                nfs::NFS_PROGRAM => nfs::Nfs3Proc::from_wire(call.procedure)
                    .and_then(|p| nfs::Nfs3Args::parse_proc(p, args, None))
                    .is_ok(),
                nfs::MOUNT_PROGRAM => nfs::MountProc::from_wire(call.procedure)
                    .and_then(|p| nfs::MountArgs::parse_proc(p, args, None))
                    .is_ok(),
                other => panic!("{name}: program {other}"),
            };
            assert!(ok, "{name}");
        } else {
            let proc = name.split('_').nth(1).expect("reply_<proc>_...");
            let ok = match proc {
                "getattr" => nfs::decode_reply(nfs::Nfs3Proc::Getattr, &input, None).is_ok(),
                "lookup" => nfs::decode_reply(nfs::Nfs3Proc::Lookup, &input, None).is_ok(),
                "readlink" => nfs::decode_reply(nfs::Nfs3Proc::Readlink, &input, None).is_ok(),
                "read" => nfs::decode_reply(nfs::Nfs3Proc::Read, &input, None).is_ok(),
                "write" => nfs::decode_reply(nfs::Nfs3Proc::Write, &input, None).is_ok(),
                "symlink" => nfs::decode_reply(nfs::Nfs3Proc::Symlink, &input, None).is_ok(),
                "readdirplus" => {
                    nfs::decode_reply(nfs::Nfs3Proc::Readdirplus, &input, None).is_ok()
                }
                "commit" => nfs::decode_reply(nfs::Nfs3Proc::Commit, &input, None).is_ok(),
                "mnt" => nfs::decode_mount_reply(nfs::MountProc::Mnt, &input).is_ok(),
                "umnt" => nfs::decode_mount_reply(nfs::MountProc::Umnt, &input).is_ok(),
                "dump" => nfs::decode_mount_reply(nfs::MountProc::Dump, &input).is_ok(),
                "umntall" => nfs::decode_mount_reply(nfs::MountProc::Umntall, &input).is_ok(),
                "export" => nfs::decode_mount_reply(nfs::MountProc::Export, &input).is_ok(),
                other => panic!("{name}: unknown procedure {other}"),
            };
            assert!(ok, "{name}");
        }
    }
}
