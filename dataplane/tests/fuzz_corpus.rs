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

/// Each hand-built engine seed reaches the path it is named after (so a
/// harness or engine change that makes one shallow fails here, not
/// silently in a fuzz run).
#[test]
fn engine_recv_seeds_reach_their_paths() {
    let want: &[(&str, &[&str])] = &[
        ("reply_inline", &["event: ReplyArrived", "call: ReplyReady"]),
        ("reply_write_chunk", &["event: ReplyArrived with DDP"]),
        ("reply_reply_chunk", &["event: ReplyArrived"]),
        ("reply_msgp", &["call: Sent"]),
        ("reply_err_vers", &["event: CallFailed PeerVersionError"]),
        (
            "reply_err_chunk_and_other",
            &[
                "event: CallFailed PeerChunkError",
                "event: CallFailed PeerError",
            ],
        ),
        (
            "reply_read_chunk_done",
            &["wr: RdmaRead", "stats: replies_pulled", "stats: done_sent"],
        ),
        (
            "reply_read_chunk_unnegotiated",
            &["stats: unnegotiated_read_list_replies"],
        ),
        (
            "peer_call_inline",
            &["event: CallArrived", "serve: Executing", "reply sent"],
        ),
        (
            "peer_call_read_chunk",
            &[
                "serve: PullingReadChunks",
                "wr: RdmaRead",
                "wr: RdmaWrite",
                "reply sent with DDP",
            ],
        ),
        (
            "peer_call_nomsg",
            &["serve: PullingReadChunks", "event: CallArrived"],
        ),
        (
            "peer_call_reply_chunk",
            &["wr: RdmaWrite", "serve: AwaitingCompletions"],
        ),
        ("peer_call_two_ddp", &["reply sent with DDP"]),
        ("peer_call_unknown_type", &["stats: err_chunk_sent"]),
        (
            "exposed_reply_done",
            &[
                "stats: replies_exposed",
                "serve: AwaitingDone",
                "stats: done_received",
            ],
        ),
        (
            "exposed_reply_done_invalidate",
            &["wr: Bind", "stats: done_received"],
        ),
        ("exposed_reply_timeout", &["stats: done_timeouts"]),
        ("conf_rdma", &["stats: conf_rdma_answered"]),
        (
            "timeout_then_late_reply",
            &[
                "event: CallFailed Timeout",
                "call: Abandoned",
                "stats: late_replies",
            ],
        ),
        (
            "key_windows_write_chunk",
            &["wr: Bind", "wr: Invalidate", "event: ReplyArrived with DDP"],
        ),
        ("credit_overrun", &["event: ConnectionLost CreditOverrun"]),
        ("parked_calls", &["stats: calls_parked"]),
        ("idle_close", &["event: ConnectionLost Idle"]),
        (
            "completions_any_order",
            &[
                "completion: error status",
                "event: ConnectionLost TransportError",
                "stats: stale_completions",
            ],
        ),
        ("stale_and_errors", &["stats: stale_completions"]),
        ("small_inline_chunks", &["event: ReplyArrived"]),
        ("disconnect", &["event: ConnectionLost PeerDisconnected"]),
        ("qp_failure", &["event: ConnectionLost TransportError"]),
        (
            "reply_read_chunk_pulled_by_requester",
            &["call: PullingReplyReadChunk", "stats: done_sent"],
        ),
        (
            "reply_read_chunk_too_large",
            &["event: CallFailed ReplyTooLarge"],
        ),
        (
            "reply_nomsg_without_reply_chunk",
            &["event: CallFailed MalformedReply"],
        ),
        ("reply_send_with_invalidate", &["wr: Send with invalidate"]),
        ("one_key_window", &["event: CallFailed NoKeyWindow"]),
        ("error_buffers_exhausted", &["stats: error_replies_dropped"]),
        ("raw_reply_unknown_xid", &["stats: unmatched_replies"]),
        ("qp_failure_while_pulling", &["serve: Draining"]),
        ("raw_reply_msg_xid1", &["event: ReplyArrived"]),
        ("raw_done_unknown_xid", &["stats: done_ignored"]),
        ("raw_runt", &["stats: runts_dropped"]),
        ("raw_vers2", &["stats: err_vers_sent"]),
        (
            "placement_peer_call_placed",
            &[
                "stats: items_placed_received",
                "stats: call_groups_received",
                "event: CallArrived",
            ],
        ),
        (
            "placement_peer_call_bad_tbsn",
            &["stats: transmission_errors_sent", "stats: groups_dropped"],
        ),
        (
            "placement_peer_call_bad_offset",
            &["stats: transmission_errors_sent", "stats: groups_dropped"],
        ),
        (
            "placement_reply_directed",
            &["stats: items_placed_sent", "reply sent with DDP"],
        ),
        (
            "placement_engine_call_placed",
            &["stats: items_placed_sent"],
        ),
    ];
    let seeds = seeds("engine_recv");
    let mut failed = Vec::new();
    for (name, labels) in want {
        let (_, input) = seeds
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("seed {name} missing"));
        let cov = engine::fuzz_recv(input);
        for l in *labels {
            assert!(engine::Coverage::LABELS.contains(l), "unknown label {l}");
            if !cov.has(l) {
                failed.push(format!("{name}: {l}"));
            }
        }
    }
    assert!(
        failed.is_empty(),
        "seeds not reaching their paths: {failed:#?}"
    );
}

/// How many of `inputs` reach each [`engine::Coverage`] label through
/// `run`, printed as the Markdown table docs/FUZZING.md carries.
fn tabulate(
    target: &str,
    inputs: &[(String, Vec<u8>)],
    run: fn(&[u8]) -> engine::Coverage,
) -> Vec<(&'static str, usize)> {
    let mut counts: Vec<_> = engine::Coverage::LABELS.iter().map(|l| (*l, 0)).collect();
    for (_, input) in inputs {
        let cov = run(input);
        for (l, n) in counts.iter_mut() {
            *n += usize::from(cov.has(l));
        }
    }
    println!("{target}: {} inputs (seeds and corpus)", inputs.len());
    println!("| reached | inputs |\n|---|---|");
    for (l, n) in &counts {
        println!("| {l} | {n} |");
    }
    counts
}

/// The labels no input reached, but those `unreachable` names (states
/// the target's configuration cannot produce).
fn never_reached(counts: &[(&'static str, usize)], unreachable: &[&str]) -> Vec<&'static str> {
    counts
        .iter()
        .filter(|(l, n)| *n == 0 && !unreachable.contains(l))
        .map(|(l, _)| *l)
        .collect()
}

/// Coverage per engine state over the `engine_recv` seeds and corpus: how
/// many inputs reach each slot state, event, work-request kind and
/// counter (`Coverage::LABELS`). The table in docs/FUZZING.md is this
/// test's output (`cargo test -p dataplane --test fuzz_corpus coverage --
/// --nocapture`). Every engine label must be reached by some input: a
/// state the corpus never reaches is a hole in the harness.
#[test]
fn engine_recv_coverage_per_state() {
    let inputs: Vec<_> = seeds("engine_recv")
        .into_iter()
        .chain(corpus("engine_recv"))
        .collect();
    let counts = tabulate("engine_recv", &inputs, engine::fuzz_recv);
    // The endpoint's labels belong to engine_worker.
    let endpoint: Vec<&str> = engine::Coverage::LABELS
        .iter()
        .copied()
        .filter(|l| l.starts_with("endpoint:"))
        .collect();
    let missing = never_reached(&counts, &endpoint);
    assert!(missing.is_empty(), "never reached: {missing:?}");
}

#[test]
fn replay_engine_worker_corpus() {
    for (_, input) in seeds("engine_worker")
        .into_iter()
        .chain(corpus("engine_worker"))
    {
        dataplane::worker::fuzz_endpoint(&input);
    }
}

/// [`engine_recv_coverage_per_state`] for `engine_worker` (the engine
/// through the worker's endpoint layer and a fake provider).
#[test]
fn engine_worker_coverage_per_state() {
    let inputs: Vec<_> = seeds("engine_worker")
        .into_iter()
        .chain(corpus("engine_worker"))
        .collect();
    let counts = tabulate("engine_worker", &inputs, dataplane::worker::fuzz_endpoint);
    // Not configured in this target: idle timeouts, a shortage of key
    // windows, 1 KiB error buffers exhausted; and the fake provider never
    // refuses a work request as malformed.
    let unreachable = [
        "event: ConnectionLost Idle",
        "stats: idle_closes",
        "event: CallFailed NoKeyWindow",
        "stats: error_replies_dropped",
        "endpoint: post_invalid",
    ];
    let missing = never_reached(&counts, &unreachable);
    assert!(missing.is_empty(), "never reached: {missing:?}");
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

/// NFSv3 and MOUNT v3. `call_*` seeds are whole calls whose arguments
/// must decode; `reply_<proc>_*` seeds are whole replies that must decode
/// as `<proc>`'s results; the fuzzer-grown corpus must not panic.
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
    for (_, input) in corpus("nfs3") {
        nfs::fuzz_parse(&input);
    }
}
