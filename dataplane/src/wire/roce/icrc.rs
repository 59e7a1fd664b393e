//! The RoCEv2 invariant CRC (IBTA Vol. 1 Annex A17 and s7.8; Linux `rxe_icrc.c`).
//!
//! The ICRC is CRC-32 (the reflected IEEE polynomial of Ethernet and zlib)
//! over:
//!
//! ```text
//!  8 bytes 0xFF                (stand-in for the InfiniBand LRH)
//!  IP header, masked           IPv4 (20 B): TOS, TTL, header checksum -> all ones
//!                              IPv6 (40 B): traffic class, flow label, hop limit -> all ones
//!  UDP header, checksum masked (ports and length are covered)
//!  BTH, byte 4 masked          (FECN, BECN, resv6a)
//!  extension headers, payload, pad
//! ```
//!
//! and travels as the little-endian bytes of the finished CRC (the value
//! zlib's `crc32` returns). rxe seeds its CRC with 0xDEBB20E3, the state
//! after the eight 0xFF bytes; feeding those bytes gives the same result
//! with a stock CRC-32 implementation ([`crc32fast`]).
//!
//! # The IP header trap
//! The IPv4 total length, identification and flags/fragment offset are
//! covered. A sender that writes through a plain UDP socket does not build
//! its own IP header, so it must know what the kernel will put there:
//! on Linux an unconnected UDP socket with `IP_MTU_DISCOVER =
//! IP_PMTUDISC_DO` sends DF set and ID 0 (`ip_select_ident_segs`); a
//! connected socket uses a per-socket counter and the ICRC becomes a
//! guess. Use [`Ipv4Header::plain_udp_socket`] for that send path.
//! rxe itself picks an unpredictable ID, so a receiver on a plain UDP
//! socket (which never sees the IP header) cannot verify inbound ICRCs;
//! verifying needs the raw frame ([`verify_frame`], e.g. from a packet
//! socket or a capture).

use super::{Error, Result, BTH_LEN, ICRC_LEN};

/// IPv4 "don't fragment" flag in the flags/fragment-offset word.
pub const IPV4_DF: u16 = 0x4000;
/// IP protocol / IPv6 next header number of UDP.
pub const IPPROTO_UDP: u8 = 17;
const IPV4_HDR_LEN: usize = 20;
const IPV6_HDR_LEN: usize = 40;
const UDP_HDR_LEN: usize = 8;
/// Byte of the BTH excluded from the ICRC (FECN, BECN, resv6a).
const BTH_MASKED_BYTE: usize = 4;

/// The IPv4 header fields the ICRC covers and a sender must predict
/// (lengths are derived from the RoCE packet; masked fields are omitted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv4Header {
    /// Source address.
    pub src: [u8; 4],
    /// Destination address.
    pub dst: [u8; 4],
    /// Identification.
    pub ident: u16,
    /// Flags and fragment offset ([`IPV4_DF`] for RoCE).
    pub flags_frag: u16,
}

impl Ipv4Header {
    /// What Linux puts in the header of a datagram sent through an
    /// unconnected UDP socket with path-MTU discovery "do" (DF): ID 0.
    pub const fn plain_udp_socket(src: [u8; 4], dst: [u8; 4]) -> Ipv4Header {
        Ipv4Header {
            src,
            dst,
            ident: 0,
            flags_frag: IPV4_DF,
        }
    }
}

/// The IPv6 header fields the ICRC covers besides lengths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv6Header {
    /// Source address.
    pub src: [u8; 16],
    /// Destination address.
    pub dst: [u8; 16],
}

/// UDP ports (both covered by the ICRC; the checksum is not).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UdpPorts {
    /// Source port (rxe: 0xC000 + hash of the QPN).
    pub src: u16,
    /// Destination port ([`super::ROCEV2_UDP_PORT`]).
    pub dst: u16,
}

fn udp_len(roce: &[u8]) -> Result<u16> {
    if roce.len() < BTH_LEN + ICRC_LEN {
        return Err(Error::Truncated);
    }
    u16::try_from(UDP_HDR_LEN + roce.len()).map_err(|_| Error::LimitExceeded)
}

/// CRC over the already masked IP header, the UDP header (checksum masked
/// here) and the RoCE packet `roce` (BTH .. pad, ICRC slot excluded).
fn crc(ip_masked: &[u8], udp: [u8; UDP_HDR_LEN], roce: &[u8]) -> u32 {
    crc_parts(ip_masked, udp, &roce[..roce.len() - ICRC_LEN], &[])
}

/// [`crc`] of a packet whose bytes before the ICRC are `head` (BTH and
/// the other headers, at least [`BTH_LEN`] bytes) then `payload`.
fn crc_parts(ip_masked: &[u8], udp: [u8; UDP_HDR_LEN], head: &[u8], payload: &[u8]) -> u32 {
    // The masked prefix laid out in one buffer and hashed in one update:
    // six updates of a few bytes each took the hasher's slow path for
    // short inputs, 4 % of a sending core at 4 GB/s.
    let mut prefix = [0xFFu8; PREFIX_MAX];
    let mut at = 8;
    let mut put = |b: &[u8]| {
        prefix[at..at + b.len()].copy_from_slice(b);
        at += b.len();
    };
    put(ip_masked);
    put(&udp[..6]);
    at += 2; // UDP checksum masked
    let masked = at + BTH_MASKED_BYTE;
    let head_in = head.len().min(PREFIX_MAX - at);
    prefix[at..at + head_in].copy_from_slice(&head[..head_in]);
    prefix[masked] = 0xFF;
    let mut h = crc32fast::Hasher::new();
    h.update(&prefix[..at + head_in]);
    h.update(&head[head_in..]);
    h.update(payload);
    h.finalize()
}

/// The masked prefix `crc_parts` hashes at once: the 8 bytes of ones, an
/// IPv6 header, the UDP header and the longest RoCE headers (BTH, RETH,
/// ImmDt and more fit in 64).
const PREFIX_MAX: usize = 8 + 40 + UDP_HDR_LEN + 64;

fn udp_header(ports: UdpPorts, len: u16) -> [u8; UDP_HDR_LEN] {
    let mut u = [0u8; UDP_HDR_LEN];
    u[0..2].copy_from_slice(&ports.src.to_be_bytes());
    u[2..4].copy_from_slice(&ports.dst.to_be_bytes());
    u[4..6].copy_from_slice(&len.to_be_bytes());
    u
}

/// ICRC of `roce` (a UDP payload: BTH .. ICRC slot, whose content is
/// ignored) sent over IPv4 with the given header values. The wire bytes
/// are `to_le_bytes()` of the result.
///
/// # Errors
/// [`Error::Truncated`] when `roce` is shorter than BTH + ICRC;
/// [`Error::LimitExceeded`] when the IP datagram would exceed 65535 bytes.
pub fn compute_ipv4(ip: &Ipv4Header, ports: UdpPorts, roce: &[u8]) -> Result<u32> {
    let ulen = udp_len(roce)?;
    let p = ipv4_masked(ip, ulen)?;
    Ok(crc(&p, udp_header(ports, ulen), roce))
}

/// [`compute_ipv4`] of the packet `head`, `payload`, then its ICRC: the
/// headers and the payload need not be contiguous (a payload sent from
/// where it lies).
///
/// # Errors
/// [`Error::Truncated`] when `head` is shorter than the BTH;
/// [`Error::LimitExceeded`] when the IP datagram would exceed 65535 bytes.
pub fn compute_ipv4_parts(
    ip: &Ipv4Header,
    ports: UdpPorts,
    head: &[u8],
    payload: &[u8],
) -> Result<u32> {
    if head.len() < BTH_LEN {
        return Err(Error::Truncated);
    }
    let ulen = UDP_HDR_LEN + head.len() + payload.len() + ICRC_LEN;
    let ulen = u16::try_from(ulen).map_err(|_| Error::LimitExceeded)?;
    let p = ipv4_masked(ip, ulen)?;
    Ok(crc_parts(&p, udp_header(ports, ulen), head, payload))
}

/// The IPv4 header as the ICRC covers it (variant fields masked to ones)
/// for a UDP datagram of `ulen` bytes.
fn ipv4_masked(ip: &Ipv4Header, ulen: u16) -> Result<[u8; IPV4_HDR_LEN]> {
    let total = ulen
        .checked_add(IPV4_HDR_LEN as u16)
        .ok_or(Error::LimitExceeded)?;
    let mut p = [0u8; IPV4_HDR_LEN];
    p[0] = 0x45;
    p[1] = 0xFF; // TOS masked
    p[2..4].copy_from_slice(&total.to_be_bytes());
    p[4..6].copy_from_slice(&ip.ident.to_be_bytes());
    p[6..8].copy_from_slice(&ip.flags_frag.to_be_bytes());
    p[8] = 0xFF; // TTL masked
    p[9] = IPPROTO_UDP;
    p[10] = 0xFF; // header checksum masked
    p[11] = 0xFF;
    p[12..16].copy_from_slice(&ip.src);
    p[16..20].copy_from_slice(&ip.dst);
    Ok(p)
}

/// ICRC of `roce` sent over IPv6; see [`compute_ipv4`].
///
/// # Errors
/// As [`compute_ipv4`].
pub fn compute_ipv6(ip: &Ipv6Header, ports: UdpPorts, roce: &[u8]) -> Result<u32> {
    let ulen = udp_len(roce)?;
    let mut p = [0u8; IPV6_HDR_LEN];
    // Version 6, then traffic class and flow label masked to ones.
    p[0..4].copy_from_slice(&[0x6F, 0xFF, 0xFF, 0xFF]);
    p[4..6].copy_from_slice(&ulen.to_be_bytes());
    p[6] = IPPROTO_UDP;
    p[7] = 0xFF; // hop limit masked
    p[8..24].copy_from_slice(&ip.src);
    p[24..40].copy_from_slice(&ip.dst);
    Ok(crc(&p, udp_header(ports, ulen), roce))
}

fn write_icrc(roce: &mut [u8], value: u32) {
    let at = roce.len() - ICRC_LEN;
    roce[at..].copy_from_slice(&value.to_le_bytes());
}

/// Computes the IPv4 ICRC of `roce` and writes it into its last 4 bytes.
///
/// # Errors
/// As [`compute_ipv4`]; nothing is written on error.
pub fn seal_ipv4(ip: &Ipv4Header, ports: UdpPorts, roce: &mut [u8]) -> Result<()> {
    let v = compute_ipv4(ip, ports, roce)?;
    write_icrc(roce, v);
    Ok(())
}

/// Computes the IPv6 ICRC of `roce` and writes it into its last 4 bytes.
///
/// # Errors
/// As [`compute_ipv4`]; nothing is written on error.
pub fn seal_ipv6(ip: &Ipv6Header, ports: UdpPorts, roce: &mut [u8]) -> Result<()> {
    let v = compute_ipv6(ip, ports, roce)?;
    write_icrc(roce, v);
    Ok(())
}

/// Splits an IP frame (starting at the IP header, no link layer) into the
/// masked IP header copy, the UDP header and the UDP payload, bounded by
/// the UDP length (Ethernet padding after it is ignored).
/// The pieces of a frame the CRC runs over: masked IP header (first
/// `.1` bytes valid), UDP header, UDP payload.
type FrameParts<'a> = ([u8; IPV6_HDR_LEN], usize, [u8; UDP_HDR_LEN], &'a [u8]);

fn split_frame(frame: &[u8]) -> Result<FrameParts<'_>> {
    let first = *frame.first().ok_or(Error::Truncated)?;
    let mut ip = [0u8; IPV6_HDR_LEN];
    let ip_len = match first >> 4 {
        4 => {
            let h = frame.get(..IPV4_HDR_LEN).ok_or(Error::Truncated)?;
            // rxe assumes a 20-byte header; options would shift the BTH.
            if first & 0x0F != 5 || h[9] != IPPROTO_UDP {
                return Err(Error::Malformed);
            }
            let total = usize::from(u16::from_be_bytes([h[2], h[3]]));
            if total > frame.len() {
                return Err(Error::Truncated);
            }
            ip[..IPV4_HDR_LEN].copy_from_slice(h);
            ip[1] = 0xFF;
            ip[8] = 0xFF;
            ip[10] = 0xFF;
            ip[11] = 0xFF;
            IPV4_HDR_LEN
        }
        6 => {
            let h = frame.get(..IPV6_HDR_LEN).ok_or(Error::Truncated)?;
            if h[6] != IPPROTO_UDP {
                return Err(Error::Malformed);
            }
            ip.copy_from_slice(h);
            ip[0] |= 0x0F;
            ip[1] = 0xFF;
            ip[2] = 0xFF;
            ip[3] = 0xFF;
            ip[7] = 0xFF;
            IPV6_HDR_LEN
        }
        _ => return Err(Error::UnknownValue),
    };
    let u = frame
        .get(ip_len..ip_len + UDP_HDR_LEN)
        .ok_or(Error::Truncated)?;
    let mut udp = [0u8; UDP_HDR_LEN];
    udp.copy_from_slice(u);
    let ulen = usize::from(u16::from_be_bytes([udp[4], udp[5]]));
    if ulen < UDP_HDR_LEN + BTH_LEN + ICRC_LEN {
        return Err(Error::Malformed);
    }
    let roce = frame
        .get(ip_len + UDP_HDR_LEN..ip_len + ulen)
        .ok_or(Error::Truncated)?;
    Ok((ip, ip_len, udp, roce))
}

/// ICRC of a whole IPv4 or IPv6 frame (starting at the IP header) carrying
/// UDP and a RoCE packet, as a receiver with the raw frame computes it.
///
/// # Errors
/// [`Error::Truncated`] when the frame is shorter than its headers say;
/// [`Error::Malformed`] for an IPv4 header with options, a non-UDP
/// protocol or a UDP length too small for BTH + ICRC;
/// [`Error::UnknownValue`] for an IP version other than 4 or 6.
pub fn compute_frame(frame: &[u8]) -> Result<u32> {
    let (ip, ip_len, udp, roce) = split_frame(frame)?;
    Ok(crc(&ip[..ip_len], udp, roce))
}

/// True when the ICRC in the frame's last RoCE bytes is correct.
///
/// # Errors
/// As [`compute_frame`].
pub fn verify_frame(frame: &[u8]) -> Result<bool> {
    let (ip, ip_len, udp, roce) = split_frame(frame)?;
    let got = super::Packet::new_unchecked(roce).icrc();
    Ok(crc(&ip[..ip_len], udp, roce) == got)
}
