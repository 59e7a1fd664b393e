//! A live loopback session of the `roce` provider captured with tshark
//! (`tshark -i lo -f 'udp port 4791 and host <our address>'`): IB CM setup
//! (REQ/REP/RTU), Sends (multi-packet, with immediate), RDMA Writes (with
//! immediate), RDMA Reads and ACKs, then teardown (DREQ/DREP). tshark, a
//! decoder nobody here wrote, must decode every frame without a malformed
//! or expert-error report, and our own frame-level ICRC check must accept
//! every captured frame (the ICRC the provider predicted for the IP header
//! Linux actually sent).
//!
//! Needs capture rights on `lo` (root or CAP_NET_RAW); `KEEP_PCAP=1` keeps
//! the capture file in the temp directory for inspection. The real-peer rule:
//! without tshark (or without capture rights) this test fails when
//! `RPCRDMA_REQUIRE_PEERS=1`, else prints `skipped: ...` and passes.
mod support;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dataplane::verbs::*;
use dataplane::wire::roce::icrc;
use support::roce_pair::{pair, pattern, wait, BIG};

fn skip(why: &str) {
    if std::env::var("RPCRDMA_REQUIRE_PEERS").as_deref() == Ok("1") {
        panic!("{why} and RPCRDMA_REQUIRE_PEERS=1");
    }
    println!("skipped: {why}");
}

fn find_tshark() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/bin".into(), "/usr/sbin".into()])
        .map(|d| d.join("tshark"))
        .find(|p| p.is_file())
}

/// Where the capture probes go (discard).
const PROBE_PORT: u16 = 9;

/// RDMA_MSG (xid 0x01020304, version 1, 32 credits, no chunks) carrying an
/// RPC call of NFSv3 NULL with AUTH_NONE.
fn rpc_over_rdma_null_call() -> Vec<u8> {
    [
        0x0102_0304u32,
        1,
        32,
        0,
        0,
        0,
        0,
        0x0102_0304,
        0,
        2,
        100_003,
        3,
        0,
        0,
        0,
        0,
        0,
    ]
    .iter()
    .flat_map(|w| w.to_be_bytes())
    .collect()
}

fn is_send(c: &Completion) -> bool {
    !matches!(c.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm)
}

/// Frames of a pcap file (Ethernet or Linux cooked / loopback headers are
/// skipped up to the IPv4 header).
fn ip_frames(pcap: &[u8]) -> Vec<Vec<u8>> {
    assert!(pcap.len() >= 24, "pcap header");
    let le = pcap[0..4] == [0xd4, 0xc3, 0xb2, 0xa1];
    let rd32 = |b: &[u8]| {
        let a = [b[0], b[1], b[2], b[3]];
        if le {
            u32::from_le_bytes(a)
        } else {
            u32::from_be_bytes(a)
        }
    };
    let linktype = rd32(&pcap[20..24]);
    let skip = match linktype {
        1 => 14,   // Ethernet (lo has a zero MAC header)
        113 => 16, // Linux cooked
        _ => panic!("unexpected link type {linktype}"),
    };
    let mut out = Vec::new();
    let mut at = 24;
    while at + 16 <= pcap.len() {
        let incl = rd32(&pcap[at + 8..at + 12]) as usize;
        let f = &pcap[at + 16..at + 16 + incl];
        let ipf = &f[skip..];
        // Leave out the capture probes (UDP destination port PROBE_PORT).
        if ipf.len() >= 24 && u16::from_be_bytes([ipf[22], ipf[23]]) != PROBE_PORT {
            out.push(ipf.to_vec());
        }
        at += 16 + incl;
    }
    out
}

#[test]
fn tshark_decodes_a_live_session_without_errors() {
    let Some(tshark) = find_tshark() else {
        return skip("tshark not installed");
    };
    // GSO off: on loopback a GSO send is never segmented, so the capture
    // would show up to 15 RoCE packets in one frame, which neither tshark
    // nor a per-frame ICRC check reads as RoCE. On a link that segments,
    // each frame is one packet (control/tests/linux_peer.rs checks those).
    let url = support::roce_pair::loopback_url("verify_icrc=1&gso=0");
    let ip = url
        .trim_start_matches("roce://")
        .split(':')
        .next()
        .unwrap()
        .to_owned();
    let file = std::env::temp_dir().join(format!("roce-live-{}.pcap", std::process::id()));
    let _ = std::fs::remove_file(&file);
    // dumpcap (tshark's capture engine) stops cleanly on SIGINT and
    // flushes the file; tshark would leave the tail of it unwritten.
    let dumpcap = tshark.with_file_name("dumpcap");
    let (prog, pcap_flag) = if dumpcap.is_file() {
        (&dumpcap, ["-P"].as_slice())
    } else {
        (&tshark, ["-F", "pcap"].as_slice())
    };
    let mut cap = Command::new(prog)
        .args(["-i", "lo", "-f"])
        .arg(format!(
            "(udp port 4791 or udp port {PROBE_PORT}) and host {ip}"
        ))
        .args(pcap_flag)
        .arg("-w")
        .arg(&file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run tshark");
    // Wait for "Capturing on ..." (or failure) before generating traffic.
    let mut err = BufReader::new(cap.stderr.take().unwrap());
    let mut started = false;
    let mut said = String::new();
    let mut line = String::new();
    while err.read_line(&mut line).unwrap_or(0) > 0 {
        if line.contains("Capturing on") {
            started = true;
            break;
        }
        said.push_str(&line);
        line.clear();
    }
    if !started {
        let _ = cap.wait();
        // Only missing capture rights is a reason to skip.
        assert!(
            said.contains("ermission") || said.contains("not permitted"),
            "capture failed: {said}"
        );
        return skip(&format!("no capture rights on lo ({})", said.trim()));
    }
    // Keep draining stderr so tshark never blocks on it.
    let drain = std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut rest);
        rest
    });

    // "Capturing on" comes before the capture is live: send probe
    // datagrams (to another port, left out of the checks) until the file
    // grows past the pcap header.
    let probe = std::net::UdpSocket::bind((ip.as_str(), 0)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::fs::metadata(&file).map_or(0, |m| m.len()) <= 24 {
        assert!(Instant::now() < deadline, "capture never started");
        let _ = probe.send_to(b"probe", (ip.as_str(), PROBE_PORT));
        std::thread::sleep(Duration::from_millis(20));
    }
    {
        let (mut a, mut b) = pair(&url, 0);
        let key = b.key();
        for (i, len) in [0usize, 100, 4097, 70_000].into_iter().enumerate() {
            let data = pattern(i as u64, len);
            b.post_recv();
            let op = if i % 2 == 1 {
                SendOp::SendWithImm(i as u32)
            } else {
                SendOp::Send
            };
            a.post(op, &data, 0);
            assert!(wait(&a, is_send).is_ok());
            assert!(wait(&b, |c| !is_send(c)).is_ok());
            b.post_recv();
            a.post(SendOp::WriteWithImm(key.at(0), 9), &data, 0);
            assert!(wait(&a, is_send).is_ok());
            assert!(wait(&b, |c| !is_send(c)).is_ok());
            a.post(SendOp::Write(key.at(8)), &data, 0);
            assert!(wait(&a, is_send).is_ok());
            a.post(SendOp::Read(key.at(0)), &[], len.min(BIG) as u32);
            assert!(wait(&a, is_send).is_ok());
        }
        // One real RPC-over-RDMA message (RDMA_MSG, empty chunk lists, an
        // NFSv3 NULL call), which Wireshark's rpcordma dissector must decode.
        b.post_recv();
        a.post(SendOp::Send, &rpc_over_rdma_null_call(), 0);
        assert!(wait(&a, is_send).is_ok());
        assert!(wait(&b, |c| !is_send(c)).is_ok());
        a.qp.disconnect();
        // The peer sees the DREQ and answers DREP.
        let deadline = Instant::now() + Duration::from_secs(30);
        while b.qp.state() != QpState::Error {
            assert!(Instant::now() < deadline);
            let mut out = [Completion::default()];
            b.poll(&mut out);
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // Capture buffers deliver in blocks: send an end marker until it is in
    // the file; everything sent before it is then in the file too.
    let marker = b"rpcrdma-capture-end-marker";
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let _ = probe.send_to(marker, (ip.as_str(), PROBE_PORT));
        let now = std::fs::read(&file).unwrap_or_default();
        if now.windows(marker.len()).any(|w| w == marker) {
            break;
        }
        assert!(Instant::now() < deadline, "end marker never captured");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SIGINT: the capture stops cleanly.
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(cap.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    );
    let _ = cap.wait();
    let stats = drain.join().unwrap_or_default();
    println!("capture: {stats}");

    let pcap = std::fs::read(&file).expect("capture file");
    let frames = ip_frames(&pcap);
    assert!(frames.len() > 50, "captured only {} frames", frames.len());
    for (i, f) in frames.iter().enumerate() {
        assert_eq!(icrc::verify_frame(f), Ok(true), "ICRC of frame {i}");
    }
    let out = Command::new(&tshark)
        .arg("-r")
        .arg(&file)
        // Our test payloads are not RPC-over-RDMA; Wireshark would try to
        // decode Sends on an rdma_cm connection as such.
        .args([
            "--disable-protocol",
            "rpcordma",
            "-Y",
            "udp.port == 4791",
            "-V",
        ])
        .output()
        .expect("run tshark");

    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for bad in ["Malformed", "[Expert Info (Error"] {
        if let Some(at) = text.find(bad) {
            let from = text[..at].rfind("Frame ").unwrap_or(0);
            let to = (at + 400).min(text.len());
            panic!("{bad} in:\n{}", &text[from..to]);
        }
    }
    // Second pass, RPC-over-RDMA on: the real message decodes cleanly.
    let out = Command::new(&tshark)
        .arg("-r")
        .arg(&file)
        .args(["-Y", "rpcordma.xid == 0x01020304", "-V"])
        .output()
        .expect("run tshark");
    assert!(out.status.success());
    let rpc = String::from_utf8_lossy(&out.stdout);
    assert!(!rpc.contains("Malformed"), "{rpc}");
    assert!(!rpc.contains("[Expert Info (Error"), "{rpc}");
    for want in [
        "RPC over RDMA",
        "Message Type: RDMA_MSG (0)",
        "Program: NFS (100003)",
    ] {
        assert!(rpc.contains(want), "rpcordma pass lacks {want:?}:\n{rpc}");
    }
    for want in [
        "CM ConnectRequest",
        "CM ConnectReply",
        "CM ReadyToUse",
        "CM DisconnectRequest",
        "CM DisconnectReply",
        "Reliable Connection (RC) - SEND Only",
        "Reliable Connection (RC) - SEND First",
        "Reliable Connection (RC) - SEND Last with Immediate",
        "Reliable Connection (RC) - RDMA WRITE First",
        "Reliable Connection (RC) - RDMA WRITE Only with Immediate",
        "Reliable Connection (RC) - RDMA READ Request",
        "Reliable Connection (RC) - RDMA READ response First",
        "Reliable Connection (RC) - RDMA READ response Last",
        "Reliable Connection (RC) - Acknowledge",
    ] {
        let cm: Vec<&str> = text.lines().filter(|l| l.contains("CM ")).collect();
        assert!(
            text.contains(want),
            "tshark output lacks {want:?}; CM lines: {cm:?}"
        );
    }
    if std::env::var_os("KEEP_PCAP").is_none() {
        let _ = std::fs::remove_file(&file);
    }
}
