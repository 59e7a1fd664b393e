//! Replays the fuzzing corpora in `fuzz/corpus/` (seeds plus whatever
//! `deploy/fuzz` found and was committed) through the same entry points the
//! cargo-fuzz targets call. Long fuzzing runs are not a CI step; this is
//! how CI keeps what they found.

use std::fs;
use std::path::PathBuf;

use dataplane::wire::{conf2, rpc, rpcrdma, rtrext};

fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target);
    let mut inputs: Vec<_> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| {
            let path = entry.expect("readable corpus directory").path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, fs::read(&path).expect("readable corpus file"))
        })
        .collect();
    inputs.sort();
    assert!(
        inputs.iter().any(|(name, _)| name.starts_with("seed_")),
        "{}: the hand-written seeds are missing",
        dir.display()
    );
    inputs
}

#[test]
fn replay_rpcrdma_header_corpus() {
    for (name, input) in corpus("rpcrdma_header") {
        rpcrdma::fuzz_parse(&input);
        // The seeds are real messages: they must parse, not merely not panic.
        let is_header_seed = ["seed_msg", "seed_nomsg", "seed_err", "seed_done"]
            .iter()
            .any(|p| name.starts_with(p));
        if is_header_seed {
            let parsed = rpcrdma::TransportHeader::parse(&input, &rpcrdma::Limits::DEFAULT);
            assert!(parsed.is_ok(), "{name}: {parsed:?}");
        }
    }
}

#[test]
fn replay_rpc_message_corpus() {
    for (name, input) in corpus("rpc_message") {
        rpc::fuzz_parse(&input);
        if name.starts_with("seed_") {
            assert!(rpc::RpcMessage::parse(&input).is_ok(), "{name}");
        }
    }
}

#[test]
fn replay_record_marking_corpus() {
    for (_, input) in corpus("record_marking") {
        rpc::fuzz_reassembly(&input);
    }
}

#[test]
fn replay_rtrext_corpus() {
    let limits = rtrext::Limits::DEFAULT;
    for (name, input) in corpus("rtrext") {
        rtrext::fuzz_parse(&input);
        // The seeds are real messages: they must parse, not merely not panic.
        if name.starts_with("seed_conf2_req") {
            let r = conf2::ConfigRdmaReqV2::parse(&input, &limits);
            assert!(r.is_ok(), "{name}: {r:?}");
        } else if name.starts_with("seed_conf2_reply") {
            let r = conf2::ConfigRdmaReplyV2::parse(&input, &limits);
            assert!(r.is_ok(), "{name}: {r:?}");
        } else if name.starts_with("seed_") {
            let r = rtrext::OptionalHeader::parse(&input, &limits);
            assert!(r.is_ok(), "{name}: {r:?}");
        }
    }
}
