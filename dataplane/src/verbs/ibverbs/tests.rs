//! Unit tests of the pure parts: URL parsing, work-request translation,
//! status mapping, connection parameters. They need no RDMA device.

use std::sync::Arc;
use std::time::Duration;

use rdma_sys::*;

use super::translate::*;
use super::*;
use crate::mem::{Slab, WrKind};
use crate::verbs::{RemoteAddr, Sge};
use crate::wire::rpcrdma::PrivateData;

fn slab() -> Slab {
    let arena: Arc<Arena> = Arena::new(64 * 1024).unwrap();
    Slab::new(arena, 0, 4096, 16, 0x1234_5678, WrKind::Send).unwrap()
}

#[test]
fn url_parsing() {
    let u = parse_url("ibverbs://127.0.0.1:20049").unwrap();
    assert_eq!(u.addr, "127.0.0.1:20049".parse().unwrap());
    assert_eq!(u.device, None);
    let u = parse_url("ibverbs://[fd00::1]:20049/?device=mlx5_0").unwrap();
    assert_eq!(u.addr, "[fd00::1]:20049".parse().unwrap());
    assert_eq!(u.device.as_deref(), Some("mlx5_0"));
    let u = parse_url("ibverbs://10.0.0.2:4791?device=rxe-0").unwrap();
    assert_eq!(u.device.as_deref(), Some("rxe-0"));
    for bad in [
        "shm:///tmp/x.sock",
        "roce://127.0.0.1:20049",
        "ibverbs://",
        "ibverbs://127.0.0.1",
        "ibverbs://127.0.0.1:0",
        "ibverbs://127.0.0.1:99999",
        "ibverbs://host.example:20049",
        "ibverbs://127.0.0.1:20049?dev=x",
        "ibverbs://127.0.0.1:20049?device=",
        "ibverbs://127.0.0.1:20049?device=a/b",
        "ibverbs://fd00::1:20049",
    ] {
        match parse_url(bad) {
            Err(VerbsError::BadAddress { url, .. }) => assert_eq!(url, bad),
            other => panic!("{bad}: {other:?}"),
        }
    }
}

#[test]
fn every_wc_status_maps() {
    use ibv_wc_status::*;
    let table = [
        (IBV_WC_SUCCESS, WcStatus::Success),
        (IBV_WC_LOC_LEN_ERR, WcStatus::LocLenErr),
        (IBV_WC_LOC_QP_OP_ERR, WcStatus::LocQpOpErr),
        (IBV_WC_LOC_EEC_OP_ERR, WcStatus::LocQpOpErr),
        (IBV_WC_LOC_PROT_ERR, WcStatus::LocProtErr),
        (IBV_WC_WR_FLUSH_ERR, WcStatus::WrFlushErr),
        (IBV_WC_MW_BIND_ERR, WcStatus::MwBindErr),
        (IBV_WC_BAD_RESP_ERR, WcStatus::RemInvReqErr),
        (IBV_WC_LOC_ACCESS_ERR, WcStatus::LocProtErr),
        (IBV_WC_REM_INV_REQ_ERR, WcStatus::RemInvReqErr),
        (IBV_WC_REM_ACCESS_ERR, WcStatus::RemAccessErr),
        (IBV_WC_REM_OP_ERR, WcStatus::RemInvReqErr),
        (IBV_WC_RETRY_EXC_ERR, WcStatus::RetryExcErr),
        (IBV_WC_RNR_RETRY_EXC_ERR, WcStatus::RnrRetryExcErr),
        (IBV_WC_LOC_RDD_VIOL_ERR, WcStatus::LocProtErr),
        (IBV_WC_REM_INV_RD_REQ_ERR, WcStatus::RemInvReqErr),
        (IBV_WC_REM_ABORT_ERR, WcStatus::RemInvReqErr),
        (IBV_WC_INV_EECN_ERR, WcStatus::LocQpOpErr),
        (IBV_WC_INV_EEC_STATE_ERR, WcStatus::LocQpOpErr),
        (IBV_WC_FATAL_ERR, WcStatus::LocQpOpErr),
        (IBV_WC_RESP_TIMEOUT_ERR, WcStatus::RetryExcErr),
        (IBV_WC_GENERAL_ERR, WcStatus::LocQpOpErr),
        (IBV_WC_TM_ERR, WcStatus::LocQpOpErr),
        (IBV_WC_TM_RNDV_INCOMPLETE, WcStatus::LocQpOpErr),
    ];
    // Every status rdma-core 44 defines (0..=23), each exactly once.
    assert_eq!(table.len(), 24);
    for (i, (raw, want)) in table.iter().enumerate() {
        assert_eq!(*raw as usize, i);
        assert_eq!(wc_status(*raw), *want, "status {raw}");
    }
    // Anything newer is a local, fatal error, never success.
    assert_eq!(wc_status(24), WcStatus::LocQpOpErr);
    assert_eq!(wc_status(u32::MAX), WcStatus::LocQpOpErr);
}

#[test]
fn completion_opcodes() {
    let ra = RemoteAddr { addr: 1, rkey: 2 };
    assert_eq!(send_wc_opcode(&SendOp::Send), WcOpcode::Send);
    assert_eq!(send_wc_opcode(&SendOp::SendWithImm(1)), WcOpcode::Send);
    assert_eq!(send_wc_opcode(&SendOp::SendWithInv(1)), WcOpcode::Send);
    assert_eq!(send_wc_opcode(&SendOp::Write(ra)), WcOpcode::RdmaWrite);
    assert_eq!(
        send_wc_opcode(&SendOp::WriteWithImm(ra, 1)),
        WcOpcode::RdmaWrite
    );
    assert_eq!(send_wc_opcode(&SendOp::Read(ra)), WcOpcode::RdmaRead);
    assert_eq!(send_wc_opcode(&SendOp::LocalInv(1)), WcOpcode::LocalInv);
    let b = crate::verbs::Window::new(0, 0x1234_5600, 0xff).bind(
        0x1234_5601,
        7,
        0,
        1,
        Access::REMOTE_READ,
    );
    assert_eq!(send_wc_opcode(&SendOp::Bind(b)), WcOpcode::Bind);
    assert_eq!(recv_wc_opcode(ibv_wc_opcode::IBV_WC_RECV), WcOpcode::Recv);
    assert_eq!(
        recv_wc_opcode(ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM),
        WcOpcode::RecvRdmaWithImm
    );
}

fn send_wr(slab: &Slab, op: SendOp, lens: &[u32]) -> SendWr {
    let mut sgl = SgeList::new();
    for &len in lens {
        let mut b = slab.alloc().unwrap();
        b.set_len(len);
        sgl.push(Sge {
            buf: b,
            offset: 8,
            len,
        })
        .unwrap();
    }
    SendWr::new(WrId::new(WrKind::Send, 3, 4), op, sgl)
}

#[test]
fn send_wr_translation_is_one_to_one() {
    let slab = slab();
    let ra = RemoteAddr {
        addr: 0xdead_beef_0000,
        rkey: 0xabcd_0102,
    };
    use ibv_wr_opcode::*;
    let cases: [(SendOp, u32); 7] = [
        (SendOp::Send, IBV_WR_SEND),
        (SendOp::SendWithImm(0x0102_0304), IBV_WR_SEND_WITH_IMM),
        (SendOp::SendWithInv(0x1111_2222), IBV_WR_SEND_WITH_INV),
        (SendOp::Write(ra), IBV_WR_RDMA_WRITE),
        (
            SendOp::WriteWithImm(ra, 0xfeed_f00d),
            IBV_WR_RDMA_WRITE_WITH_IMM,
        ),
        (SendOp::Read(ra), IBV_WR_RDMA_READ),
        (SendOp::LocalInv(0x3333_4444), IBV_WR_LOCAL_INV),
    ];
    for (op, want_opcode) in cases {
        let lens: &[u32] = if matches!(op, SendOp::LocalInv(_)) {
            &[]
        } else {
            &[100, 200]
        };
        let mut wr = send_wr(&slab, op, lens);
        for (signaled, inline) in [(true, false), (false, false), (true, true)] {
            wr.signaled = signaled;
            wr.inline = inline && !matches!(op, SendOp::Read(_) | SendOp::LocalInv(_));
            check_send(&wr, 1024).unwrap();
            let mut sges = NO_SGES;
            let mut hw = zeroed_send_wr();
            fill_send_wr(&wr, 77, &mut sges, &mut hw);
            assert_eq!(hw.wr_id, 77);
            assert_eq!(hw.opcode, want_opcode, "{op:?}");
            assert!(hw.next.is_null());
            let mut flags = 0;
            if wr.signaled {
                flags |= ibv_send_flags::IBV_SEND_SIGNALED.0;
            }
            if wr.inline {
                flags |= ibv_send_flags::IBV_SEND_INLINE.0;
            }
            assert_eq!(hw.send_flags, flags, "{op:?}");
            assert_eq!(hw.num_sge as usize, lens.len());
            if lens.is_empty() {
                assert!(hw.sg_list.is_null());
            } else {
                assert_eq!(hw.sg_list, sges.as_mut_ptr());
            }
            for (i, s) in wr.sgl.iter().enumerate() {
                assert_eq!(sges[i].addr, s.buf.addr() + 8);
                assert_eq!(sges[i].length, lens[i]);
                assert_eq!(sges[i].lkey, 0x1234_5678);
            }
            // SAFETY (test): reading the union members the opcode uses.
            let (imm, inv, rdma) = unsafe {
                (
                    hw.imm_data_invalidated_rkey_union.imm_data,
                    hw.imm_data_invalidated_rkey_union.invalidated_rkey,
                    hw.wr.rdma,
                )
            };
            match op {
                SendOp::SendWithImm(v) | SendOp::WriteWithImm(_, v) => {
                    // Network byte order on the wire.
                    assert_eq!(imm, v.to_be());
                }
                SendOp::SendWithInv(k) | SendOp::LocalInv(k) => assert_eq!(inv, k),
                _ => assert_eq!(imm, 0),
            }
            match op {
                SendOp::Write(r) | SendOp::WriteWithImm(r, _) | SendOp::Read(r) => {
                    assert_eq!(rdma.remote_addr, r.addr);
                    assert_eq!(rdma.rkey, r.rkey);
                }
                _ => {
                    assert_eq!(rdma.remote_addr, 0);
                    assert_eq!(rdma.rkey, 0);
                }
            }
        }
    }
}

#[test]
fn malformed_send_wrs_are_refused() {
    let slab = slab();
    let ra = RemoteAddr::default();
    // SGEs on a local invalidate.
    let wr = send_wr(&slab, SendOp::LocalInv(1), &[10]);
    assert_eq!(check_send(&wr, 256), Err(PostError::Invalid));
    // Inline read.
    let mut wr = send_wr(&slab, SendOp::Read(ra), &[10]);
    wr.inline = true;
    assert_eq!(check_send(&wr, 256), Err(PostError::Invalid));
    // Inline above max_inline (total over all SGEs).
    let mut wr = send_wr(&slab, SendOp::Send, &[200, 100]);
    wr.inline = true;
    assert_eq!(check_send(&wr, 256), Err(PostError::Invalid));
    assert_eq!(check_send(&wr, 300), Ok(()));
    // SGE beyond its buffer.
    let b = slab.alloc().unwrap();
    let wr = SendWr::new(
        b.wr_id(),
        SendOp::Send,
        SgeList::one(Sge {
            buf: b,
            offset: 4000,
            len: 97,
        }),
    );
    assert_eq!(check_send(&wr, 256), Err(PostError::Invalid));
}

#[test]
fn recv_wr_translation() {
    let slab = slab();
    let mut sgl = SgeList::one(Sge::whole(slab.alloc().unwrap()));
    sgl.push(Sge::whole(slab.alloc().unwrap())).unwrap();
    let addrs: Vec<u64> = sgl.iter().map(|s| s.addr()).collect();
    let wr = RecvWr {
        wr_id: WrId::new(WrKind::Recv, 1, 1),
        sgl,
    };
    check_recv(&wr).unwrap();
    let mut sges = NO_SGES;
    let mut hw = zeroed_recv_wr();
    fill_recv_wr(&wr, RECV_BIT | 5, &mut sges, &mut hw);
    assert_eq!(hw.wr_id, RECV_BIT | 5);
    assert_eq!(hw.num_sge, 2);
    assert_eq!(hw.sg_list, sges.as_mut_ptr());
    for i in 0..2 {
        assert_eq!(sges[i].addr, addrs[i]);
        assert_eq!(sges[i].length, 4096);
        assert_eq!(sges[i].lkey, 0x1234_5678);
    }
}

#[test]
fn receive_lengths_scatter_in_order() {
    let slab = slab();
    let mut sgl = SgeList::one(Sge {
        buf: slab.alloc().unwrap(),
        offset: 16,
        len: 100,
    });
    sgl.push(Sge::whole(slab.alloc().unwrap())).unwrap();
    scatter_lengths(&mut sgl, 150);
    let lens: Vec<u32> = sgl.iter().map(|s| s.buf.len()).collect();
    assert_eq!(lens, [116, 50]);
    scatter_lengths(&mut sgl, 0);
    let lens: Vec<u32> = sgl.iter().map(|s| s.buf.len()).collect();
    assert_eq!(lens, [16, 0]);
}

#[test]
fn rfc8797_private_data_rides_in_conn_params() {
    let pd = PrivateData {
        remote_invalidate: true,
        max_send_size: 4096,
        max_recv_size: 8192,
    };
    let mut bytes = [0u8; 8];
    assert_eq!(pd.emit(&mut bytes).unwrap(), 8);
    let caps = QpCaps::default();
    for msg in [CmMessage::Connect, CmMessage::Accept] {
        let p = conn_param(msg, &bytes, 0x00ab_cdef, &caps, 16).unwrap();
        assert_eq!(p.raw.private_data_len, 8);
        assert_eq!(p.raw.private_data, bytes.as_ptr().cast());
        // SAFETY (test): the pointer borrows `bytes`, alive here.
        let carried = unsafe { std::slice::from_raw_parts(p.raw.private_data.cast::<u8>(), 8) };
        assert_eq!(PrivateData::parse(carried), Some(pd));
        assert_eq!(p.raw.qp_num, 0x00ab_cdef);
        assert_eq!(p.raw.responder_resources, 16);
        assert_eq!(p.raw.initiator_depth, 16);
        assert_eq!(p.raw.retry_count, 7);
        assert_eq!(p.raw.rnr_retry_count, caps.rnr_retry);
        assert_eq!(p.raw.srq, 0);
    }
    // What the peer sees on IB/RoCE: the REQ's 56-byte area, zero-padded.
    let mut padded = [0u8; MAX_CONNECT_PRIVATE_DATA];
    padded[..8].copy_from_slice(&bytes);
    // SAFETY (test): 56 readable bytes.
    let got = unsafe { copy_private_data(padded.as_ptr().cast(), 56) };
    assert_eq!(got.len(), 56);
    assert_eq!(PrivateData::parse(&got), Some(pd));
    // SAFETY (test): null pointer means none.
    assert!(unsafe { copy_private_data(std::ptr::null(), 56) }.is_empty());
}

#[test]
fn conn_param_limits() {
    let caps = QpCaps {
        rnr_retry: 9,
        ..QpCaps::default()
    };
    let p = conn_param(CmMessage::Connect, &[], 1, &caps, 0).unwrap();
    assert!(p.raw.private_data.is_null());
    assert_eq!(p.raw.private_data_len, 0);
    assert_eq!(p.raw.rnr_retry_count, 7, "IB has 3 bits: 7 = forever");
    assert!(conn_param(CmMessage::Connect, &[1; 56], 1, &caps, 0).is_ok());
    assert!(matches!(
        conn_param(CmMessage::Connect, &[1; 57], 1, &caps, 0),
        Err(VerbsError::Limit(_))
    ));
    assert!(conn_param(CmMessage::Accept, &[1; 196], 1, &caps, 0).is_ok());
    assert!(matches!(
        conn_param(CmMessage::Accept, &[1; 197], 1, &caps, 0),
        Err(VerbsError::Limit(_))
    ));
}

#[test]
fn access_flags() {
    use ibv_access_flags as A;
    let lw = A::IBV_ACCESS_LOCAL_WRITE.0;
    let rw = A::IBV_ACCESS_REMOTE_WRITE.0;
    let rr = A::IBV_ACCESS_REMOTE_READ.0;
    let mw = A::IBV_ACCESS_MW_BIND.0;
    assert_eq!(mr_access(Access::NONE, true), 0);
    assert_eq!(mr_access(Access::LOCAL_WRITE, true), lw);
    assert_eq!(
        mr_access(Access::LOCAL_WRITE | Access::REMOTE_WRITE, true),
        lw | rw | mw
    );
    assert_eq!(
        mr_access(Access::LOCAL_WRITE | Access::REMOTE_READ, false),
        lw | rr
    );
    assert_eq!(mw_access(Access::LOCAL_WRITE | Access::REMOTE_READ), rr);
    assert_eq!(
        mw_access(Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ),
        rw | rr
    );
}

#[test]
fn rnr_timer_codes_round_up() {
    assert_eq!(rnr_timer_code(Duration::ZERO), 1);
    assert_eq!(rnr_timer_code(Duration::from_micros(10)), 1);
    assert_eq!(rnr_timer_code(Duration::from_micros(11)), 2);
    assert_eq!(rnr_timer_code(Duration::from_millis(1)), 14);
    assert_eq!(rnr_timer_code(Duration::from_millis(10)), 20);
    assert_eq!(rnr_timer_code(Duration::from_micros(491_520)), 31);
    assert_eq!(rnr_timer_code(Duration::from_secs(5)), 31);
}

#[test]
fn window_keys_change_only_the_key_byte() {
    assert_eq!(next_rkey(0x1234_5600), 0x1234_5601);
    assert_eq!(next_rkey(0x1234_56ff), 0x1234_5600);
    assert_eq!(next_rkey(u32::MAX), 0xffff_ff00);
}

#[test]
fn no_device_message_is_one_line_naming_the_way_out() {
    let m = no_device_message("ibverbs://127.0.0.1:20049");
    assert!(!m.contains('\n'));
    assert!(m.starts_with("ibverbs://127.0.0.1:20049: no RDMA device found"));
    assert!(m.contains("shm://"));
    assert!(m.contains("docs/VERBS.md"));
}

/// On this host: without a device, opening fails with exactly the one
/// line above; with one (rxe, a NIC), the probe succeeds.
#[test]
fn probe_reports_a_missing_device() {
    let url = "ibverbs://127.0.0.1:20049";
    let devices = super::sys::DeviceList::get().names();
    match probe(url) {
        Err(VerbsError::Unavailable(m)) if devices.is_empty() => {
            assert_eq!(m, no_device_message(url));
            assert_eq!(
                Ibverbs::open(url).unwrap_err().to_string(),
                no_device_message(url)
            );
        }
        Ok(()) if !devices.is_empty() => {}
        other => panic!("devices {devices:?}: {other:?}"),
    }
    // A malformed URL is reported as such, device or not.
    assert!(matches!(
        probe("ibverbs://nowhere"),
        Err(VerbsError::BadAddress { .. })
    ));
}

#[test]
fn invalidated_rkey_flag() {
    let with_inv = ibv_wc_flags::IBV_WC_WITH_INV.0;
    let csum_ok = ibv_wc_flags::IBV_WC_IP_CSUM_OK.0;
    let grh_imm = ibv_wc_flags::IBV_WC_GRH.0 | ibv_wc_flags::IBV_WC_WITH_IMM.0;
    // libibverbs' own flag, on any device.
    assert!(recv_invalidated(with_inv, false));
    assert!(recv_invalidated(with_inv, true));
    // The kernel's bit 2 is an invalidation only on rxe; elsewhere it is
    // a checksum-offload report.
    assert_eq!(csum_ok, 1 << 2);
    assert!(!recv_invalidated(csum_ok | grh_imm, false));
    assert!(recv_invalidated(csum_ok | ibv_wc_flags::IBV_WC_GRH.0, true));
    // GRH and immediate data say nothing about invalidation.
    assert!(!recv_invalidated(grh_imm, false));
    assert!(!recv_invalidated(grh_imm, true));
    assert!(!recv_invalidated(0, true));
}
