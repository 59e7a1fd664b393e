//! The roce provider's own refusals reach the daemon's metrics: a flood
//! of connection requests from one address that never complete (no RTU)
//! gets its requests past the per-address half-open bound rejected by the
//! provider's connection manager, and the daemon counts them in
//! `rpcrdma_listener_rejected_total{reason="half_open"}`.
mod support;

use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};

use dataplane::wire::ibcm::{
    self, gsi_packet, ipv4_mapped_gid, CmMad, CmMessage, CmPath, RdmaCmHeader, Req, MAD_LEN,
};
use dataplane::wire::roce::icrc::{self, Ipv4Header, UdpPorts};
use dataplane::wire::roce::seg::Mtu;
use dataplane::wire::roce::Psn;
use support::*;

/// RoCEv2's UDP port.
const ROCE_UDP: u16 = 4791;

fn path(local: Ipv4Addr, remote: Ipv4Addr) -> CmPath {
    CmPath {
        local_lid: 0xFFFF,
        remote_lid: 0xFFFF,
        local_gid: ipv4_mapped_gid(local),
        remote_gid: ipv4_mapped_gid(remote),
        flow_label: 0,
        packet_rate: 0,
        traffic_class: 0,
        hop_limit: 64,
        sl: 0,
        subnet_local: false,
        local_ack_timeout: 18,
    }
}

#[test]
fn a_req_flood_from_one_address_shows_as_half_open_refusals() {
    let dir = scratch_dir("roce-refusals");
    let (server, flooder) = (Ipv4Addr::new(127, 0, 0, 66), Ipv4Addr::new(127, 0, 0, 67));
    let port = 20661;
    let url = format!("roce://{server}:{port}");
    let metrics: SocketAddr = "127.0.0.1:19506".parse().unwrap();
    let cfg = write_file(
        &dir,
        "roce.toml",
        &format!(
            "[[listeners]]\nurl = \"{url}\"\n\n[workers]\ncores = [0]\nidle = \"adaptive\"\n\n\
             [metrics]\naddress = \"{metrics}\"\n\n[rpcbind]\nregister = false\n\n\
             [control]\nsocket = \"{}/ctl.sock\"\n",
            dir.display()
        ),
    );
    let mut d = Daemon::spawn(&["--config", cfg.to_str().unwrap()]);
    d.wait_for_line("started");

    // Requests from one address, each a new connection, none completed.
    let sock = UdpSocket::bind((flooder, ROCE_UDP)).unwrap();
    let mut private = [0u8; ibcm::private_len::REQ];
    RdmaCmHeader {
        src_port: 40000,
        src: IpAddr::V4(flooder),
        dst: IpAddr::V4(server),
    }
    .emit(&mut private)
    .unwrap();
    const FLOOD: u32 = 40;
    for i in 0..FLOOD {
        let req = Req {
            local_comm_id: 0x7000 + i,
            service_id: ibcm::tcp_service_id(port),
            local_ca_guid: 2,
            local_qkey: 0,
            local_qpn: 0x100 + i,
            responder_resources: 1,
            local_eecn: 0,
            initiator_depth: 1,
            remote_eecn: 0,
            remote_cm_response_timeout: 20,
            transport_type: 0,
            end_to_end_flow_control: false,
            starting_psn: Psn::new(1).unwrap(),
            local_cm_response_timeout: 20,
            retry_count: 6,
            pkey: 0xFFFF,
            path_mtu: Mtu::Mtu1024,
            rdc_exists: false,
            rnr_retry_count: 7,
            max_cm_retries: 15,
            srq: false,
            extended_transport: 0,
            primary_path: path(flooder, server),
            alternate_path: CmPath::default(),
            private_data: &private,
        };
        let mut mad = [0u8; MAD_LEN];
        CmMad::new(0x100 + u64::from(i), CmMessage::Req(req))
            .emit(&mut mad)
            .unwrap();
        let pkt = gsi_packet(Psn::from_masked(i), &mad);
        let mut b = vec![0u8; pkt.buffer_len()];
        pkt.emit(&mut b).unwrap();
        let ip = Ipv4Header::plain_udp_socket(flooder.octets(), server.octets());
        let ports = UdpPorts {
            src: ROCE_UDP,
            dst: ROCE_UDP,
        };
        icrc::seal_ipv4(&ip, ports, &mut b).unwrap();
        sock.send_to(&b, SocketAddrV4::new(server, ROCE_UDP))
            .unwrap();
    }

    let name =
        format!("rpcrdma_listener_rejected_total{{listener=\"{url}\",reason=\"half_open\"}}");
    let body = scrape_until(metrics, &name, 1);
    let refused = metric(&body, &name);
    assert!(refused >= 1 && refused <= u64::from(FLOOD), "{body}");
    d.wait_for_line("half-open");
    promtool_accepts(&body);
    d.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(d.wait().code(), Some(0), "{}", d.stderr());
    let _ = std::fs::remove_dir_all(dir);
}
