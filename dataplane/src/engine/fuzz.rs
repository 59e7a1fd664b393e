//! Fuzzing entry point for the engine, for the lead's cargo-fuzz target
//! (like [`crate::wire::rpcrdma::fuzz_parse`] for the codecs).

use std::collections::VecDeque;

use super::{
    AppChunks, BufId, Config, Connection, Instant, OutgoingCall, OutgoingReply, ReplyExpect,
    WcStatus, WorkRequest, WrId,
};

/// Feeds `data` to one [`Connection`] as the bytes of received messages and
/// the outcomes of its work requests, then closes it and checks that every
/// resource came back.
///
/// Input format, repeated: one control byte, then for a message a
/// big-endian `u16` length and that many bytes. Control byte: bit 0 set =
/// complete the oldest posted non-receive work request (bit 1 picks an
/// error status) instead of delivering a message; bits 2-3 advance virtual
/// time; bit 4 answers the oldest call the engine delivered. Bit 7 of the
/// first byte turns on responder-provided read chunks. Replies are
/// released as soon as they arrive.
///
/// Before the input, the connection has sent calls of several shapes, so
/// replies, RDMA_ERRORs and RDMA_DONE-bearing replies can match them.
///
/// # Panics
/// Only when an engine invariant breaks (resources not returned after the
/// close), or on a panic inside the engine (the bug being looked for).
pub fn fuzz_recv(data: &[u8]) {
    let cfg = Config {
        peer_inline_recv_size: 4096,
        peer_inline_send_size: 4096,
        credits: 4,
        max_outstanding_calls: 4,
        max_call_size: 64 * 1024,
        max_reply_size: 64 * 1024,
        max_ddp_size: 64 * 1024,
        reply_read_chunks: data.first().is_some_and(|b| b & 0x80 != 0),
        call_timeout: Some(core::time::Duration::from_micros(500)),
        done_timeout: core::time::Duration::from_micros(700),
        ..Config::default()
    };
    let Ok(mut c) = Connection::new(cfg) else {
        return;
    };
    let mut now = Instant::ZERO;
    let mut recvs: VecDeque<(WrId, BufId)> = VecDeque::new();
    let mut posted: VecDeque<WrId> = VecDeque::new();
    let mut calls = VecDeque::new();
    let drain =
        |c: &mut Connection, recvs: &mut VecDeque<(WrId, BufId)>, posted: &mut VecDeque<WrId>| {
            while let Some(wr) = c.poll_transmit() {
                match wr {
                    WorkRequest::PostRecv { wr_id, buf } => recvs.push_back((wr_id, buf)),
                    other => posted.push_back(other.wr_id()),
                }
            }
        };
    for (i, len) in [40usize, 9000, 30_000].into_iter().enumerate() {
        let mut msg = vec![0u8; 40 + len.next_multiple_of(4)];
        let xid = i as u32 + 1;
        msg[..4].copy_from_slice(&xid.to_be_bytes());
        msg[36..40].copy_from_slice(&(len as u32).to_be_bytes());
        let _ = c.send_call(
            now,
            &OutgoingCall {
                message: &msg,
                ddp: (i == 1).then_some(super::DdpItem {
                    offset: 40,
                    len: len as u32,
                }),
                reply: ReplyExpect {
                    max_len: 16 * 1024,
                    ddp_max: (i == 2).then_some(32 * 1024),
                },
                app: AppChunks::NONE,
            },
        );
    }
    drain(&mut c, &mut recvs, &mut posted);

    let mut rest = data;
    while let Some((&ctl, tail)) = rest.split_first() {
        rest = tail;
        now = now.saturating_add(core::time::Duration::from_micros(
            u64::from(ctl >> 2 & 3) * 300,
        ));
        if c.poll_timeout().is_some_and(|t| t <= now) {
            c.handle_timeout(now);
        }
        if ctl & 1 == 1 {
            if let Some(id) = posted.pop_front() {
                let status = if ctl & 2 == 0 {
                    WcStatus::Success
                } else {
                    WcStatus::RemoteAccessError
                };
                c.handle_completion(now, id, status);
            }
        } else {
            let Some((lb, tail)) = rest.split_first_chunk::<2>() else {
                break;
            };
            let len = usize::from(u16::from_be_bytes(*lb)).min(tail.len());
            let (msg, tail) = tail.split_at(len);
            rest = tail;
            if let Some((id, buf)) = recvs.pop_front() {
                let room = c.buffers().buf_len(buf) as usize;
                let n = msg.len().min(room);
                c.buffers_mut().write(buf, 0, &msg[..n]);
                c.handle_recv(now, id, msg.len() as u32);
            }
        }
        while let Some(ev) = c.poll_event() {
            match ev {
                super::Event::CallArrived { call, xid, .. } => calls.push_back((call, xid)),
                super::Event::ReplyArrived { call, .. } => {
                    c.release_reply(call);
                }
                _ => {}
            }
        }
        if ctl & 16 != 0 {
            if let Some((call, xid)) = calls.pop_front() {
                let mut reply = [0u8; 28];
                reply[..4].copy_from_slice(&xid.to_be_bytes());
                reply[7] = 1;
                let _ = c.send_reply(
                    now,
                    call,
                    &OutgoingReply {
                        message: &reply,
                        ddp: &[],
                    },
                );
            }
        }
        drain(&mut c, &mut recvs, &mut posted);
    }

    // Tear down like a provider whose queue pair failed: flush everything.
    c.close();
    drain(&mut c, &mut recvs, &mut posted);
    for (id, _) in recvs.drain(..) {
        c.handle_completion(now, id, WcStatus::Flushed);
    }
    for id in posted.drain(..) {
        c.handle_completion(now, id, WcStatus::Flushed);
    }
    while c.poll_event().is_some() {}
    drain(&mut c, &mut recvs, &mut posted);
    let r = c.resources();
    assert!(r.is_idle(), "leak: {r:?}");
}
