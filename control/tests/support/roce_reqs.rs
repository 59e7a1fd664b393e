//! Raw roce connection requests for the hostile-peer tests: what a
//! flooder that never completes a connection sends, and the REJs it reads.
#![allow(dead_code)]

/// RoCEv2's UDP port.
pub const ROCE_UDP: u16 = 4791;

/// `count` connection requests from `from` to the rdma_cm service `port`
/// at `server`, none of which it will complete, from a UDP socket of its
/// own (the provider takes a REQ only if its path GID is its source
/// address). Returns the socket: the caller keeps it open until the
/// daemon has answered, since a closed one turns the answers into ICMP
/// errors at the daemon's socket.
pub fn flood_reqs(
    from: std::net::Ipv4Addr,
    server: std::net::Ipv4Addr,
    port: u16,
    count: u32,
    first_comm_id: u32,
) -> std::net::UdpSocket {
    use dataplane::wire::ibcm::{
        self, gsi_packet, ipv4_mapped_gid, CmMad, CmMessage, CmPath, RdmaCmHeader, Req, MAD_LEN,
    };
    use dataplane::wire::roce::icrc::{self, Ipv4Header, UdpPorts};
    use dataplane::wire::roce::seg::Mtu;
    use dataplane::wire::roce::Psn;
    let path = CmPath {
        local_lid: 0xFFFF,
        remote_lid: 0xFFFF,
        local_gid: ipv4_mapped_gid(from),
        remote_gid: ipv4_mapped_gid(server),
        flow_label: 0,
        packet_rate: 0,
        traffic_class: 0,
        hop_limit: 64,
        sl: 0,
        subnet_local: false,
        local_ack_timeout: 18,
    };
    let sock = std::net::UdpSocket::bind((from, ROCE_UDP)).unwrap();
    let mut private = [0u8; ibcm::private_len::REQ];
    RdmaCmHeader {
        src_port: 40000,
        src: std::net::IpAddr::V4(from),
        dst: std::net::IpAddr::V4(server),
    }
    .emit(&mut private)
    .unwrap();
    for i in 0..count {
        let comm_id = first_comm_id + i;
        let req = Req {
            local_comm_id: comm_id,
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
            primary_path: path,
            alternate_path: CmPath::default(),
            private_data: &private,
        };
        let mut mad = [0u8; MAD_LEN];
        CmMad::new(u64::from(comm_id), CmMessage::Req(req))
            .emit(&mut mad)
            .unwrap();
        let pkt = gsi_packet(Psn::from_masked(i), &mad);
        let mut b = vec![0u8; pkt.buffer_len()];
        pkt.emit(&mut b).unwrap();
        let ip = Ipv4Header::plain_udp_socket(from.octets(), server.octets());
        let ports = UdpPorts {
            src: ROCE_UDP,
            dst: ROCE_UDP,
        };
        icrc::seal_ipv4(&ip, ports, &mut b).unwrap();
        sock.send_to(&b, std::net::SocketAddrV4::new(server, ROCE_UDP))
            .unwrap();
    }
    sock
}

/// REJs "no resources" waiting in a flooder's socket.
pub fn refusals_received(sock: &std::net::UdpSocket) -> u64 {
    use dataplane::wire::ibcm::{rej_reason, CmMad, CmMessage};
    use dataplane::wire::roce::RocePacket;
    sock.set_nonblocking(true).unwrap();
    let mut buf = vec![0u8; 4096];
    let mut n = 0;
    while let Ok(len) = sock.recv(&mut buf) {
        let Ok(p) = RocePacket::parse(&buf[..len]) else {
            continue;
        };
        if let Ok(CmMad {
            message: CmMessage::Rej(r),
            ..
        }) = CmMad::parse(p.payload)
        {
            n += u64::from(r.reason == rej_reason::NO_RESOURCES);
        }
    }
    n
}
