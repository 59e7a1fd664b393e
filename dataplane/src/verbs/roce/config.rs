//! Provider configuration: the URL, its options and the environment.
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

use super::io::FaultPolicy;
use crate::verbs::VerbsError;
use crate::wire::roce::seg::Mtu;
use crate::wire::roce::{Psn, ROCEV2_UDP_PORT};

/// Environment variable: UDP port of RoCEv2 traffic (default 4791).
pub const ENV_UDP_PORT: &str = "RPCRDMA_ROCE_UDP_PORT";
/// Environment variable: local IPv4 address `connect` sends from.
pub const ENV_LOCAL_IP: &str = "RPCRDMA_ROCE_LOCAL_IP";
/// Environment variable: `1` verifies inbound ICRCs (see module docs).
pub const ENV_VERIFY_ICRC: &str = "RPCRDMA_ROCE_VERIFY_ICRC";
/// Environment variable: `0` turns UDP GSO/GRO off, `all` sends GSO on
/// every device (see `RoceConfig::gso`, `RoceConfig::gso_everywhere`).
pub const ENV_GSO: &str = "RPCRDMA_ROCE_GSO";
/// Environment variable (tests): `drop,dup,reorder[,seed]` per mille.
pub const ENV_FAULTS: &str = "RPCRDMA_ROCE_FAULTS";

/// Provider configuration, from the URL and the environment.
#[derive(Debug, Clone, Copy)]
pub struct RoceConfig {
    /// UDP port every RoCEv2 endpoint listens on.
    pub udp_port: u16,
    /// Source address for `connect` (else chosen by routing, see docs).
    pub local: Option<Ipv4Addr>,
    /// Path MTU (payload bytes per packet); `None` follows the link the
    /// route to the peer takes (see `io::path_mtu`).
    pub mtu: Option<Mtu>,
    /// Retransmission timeout.
    pub ack_timeout: Duration,
    /// Transport retries before `RetryExcErr`.
    pub retry_count: u8,
    /// Verify inbound ICRCs (peer assumed to send IP ID 0, DF).
    pub verify_icrc: bool,
    /// Test-only fault injection on data-path packets.
    pub faults: FaultPolicy,
    /// Test-only: the PSN every QP of this context expects first (the
    /// Starting PSN it announces) instead of a random one, so a test can
    /// put the wrap of the 24-bit PSN where it wants it. Only the unit
    /// tests' `initial_psn=` URL option sets it: PSNs must be
    /// unpredictable.
    pub initial_psn: Option<Psn>,
    /// How long a shard may go undriven before the device's thread drives
    /// it (a device option: the first context to bind the address sets
    /// it).
    pub idle_after: Duration,
    /// UDP GSO on send and GRO on receive (a device option, like
    /// `idle_after`), on loopback devices. Off, every packet is its own
    /// datagram everywhere, which a capture on loopback or a veth needs
    /// to show one RoCE packet per frame.
    pub gso: bool,
    /// GSO on send and GRO on receive on every device, not only loopback
    /// ones (`gso=all`). Off by default: it is measured on a veth
    /// (docs/ROCE.md) but not against Linux rxe peers or NICs that
    /// segment UDP themselves, which must give segment k the IP ID k the
    /// ICRC was sealed for.
    pub gso_everywhere: bool,
}

impl Default for RoceConfig {
    fn default() -> Self {
        RoceConfig {
            udp_port: ROCEV2_UDP_PORT,
            local: None,
            mtu: None,
            ack_timeout: Duration::from_millis(64),
            retry_count: 7,
            verify_icrc: false,
            faults: FaultPolicy::default(),
            initial_psn: None,
            idle_after: Duration::from_millis(1),
            gso: true,
            gso_everywhere: false,
        }
    }
}

impl RoceConfig {
    /// The path MTU toward `peer`: the configured one, else what the
    /// route's link carries (1024 when the kernel cannot say).
    pub(super) fn mtu_toward(&self, peer: Ipv4Addr) -> Mtu {
        self.mtu
            .unwrap_or_else(|| super::io::path_mtu(peer, self.udp_port).unwrap_or(Mtu::Mtu1024))
    }

    /// The `gso` option: `0` off, `all` on every device, anything else on
    /// loopback devices.
    fn set_gso(&mut self, v: &str) {
        self.gso = v != "0";
        self.gso_everywhere = v == "all";
    }

    pub(super) fn from_env() -> RoceConfig {
        let mut c = RoceConfig::default();
        if let Some(p) = std::env::var(ENV_UDP_PORT)
            .ok()
            .and_then(|v| v.parse().ok())
        {
            c.udp_port = p;
        }
        if let Some(ip) = std::env::var(ENV_LOCAL_IP)
            .ok()
            .and_then(|v| v.parse().ok())
        {
            c.local = Some(ip);
        }
        c.verify_icrc = std::env::var(ENV_VERIFY_ICRC).is_ok_and(|v| v == "1");
        if let Ok(v) = std::env::var(ENV_GSO) {
            c.set_gso(&v);
        }
        if let Some(f) = std::env::var(ENV_FAULTS)
            .ok()
            .and_then(|v| FaultPolicy::parse(&v))
        {
            c.faults = f;
        }
        c
    }

    /// ACK timeout as the IB 5-bit code (4.096 us x 2^code), for the REQ.
    pub(super) fn ack_timeout_code(&self) -> u8 {
        let us = self.ack_timeout.as_micros() as f64;
        let mut code = 0u8;
        while code < 31 && 4.096 * f64::from(1u32 << code) < us {
            code += 1;
        }
        code
    }
}

/// Parses `roce://a.b.c.d:port[?options]`, applying options onto `base`.
pub(super) fn parse_url(
    url: &str,
    base: RoceConfig,
) -> Result<(SocketAddrV4, RoceConfig), VerbsError> {
    let bad = |why| VerbsError::BadAddress {
        url: url.to_owned(),
        why,
    };
    let rest = url
        .strip_prefix("roce://")
        .ok_or_else(|| bad("scheme is not roce://"))?;
    let (addr, query) = match rest.split_once('?') {
        Some((a, q)) => (a, Some(q)),
        None => (rest, None),
    };
    let addr: SocketAddrV4 = addr.parse().map_err(|_| bad("expected roce://IPv4:PORT"))?;
    let mut cfg = base;
    for kv in query.into_iter().flat_map(|q| q.split('&')) {
        if kv.is_empty() {
            continue;
        }
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        match k {
            "udp_port" => cfg.udp_port = v.parse().map_err(|_| bad("bad udp_port"))?,
            "local" => cfg.local = Some(v.parse().map_err(|_| bad("bad local address"))?),
            "mtu" => {
                cfg.mtu = Some(
                    v.parse()
                        .ok()
                        .and_then(Mtu::from_bytes)
                        .ok_or_else(|| bad("mtu must be 256, 512, 1024, 2048 or 4096"))?,
                )
            }
            "ack_timeout_ms" => {
                let ms: u64 = v.parse().map_err(|_| bad("bad ack_timeout_ms"))?;
                if ms == 0 {
                    return Err(bad("ack_timeout_ms must be positive"));
                }
                cfg.ack_timeout = Duration::from_millis(ms);
            }
            "retry" => {
                cfg.retry_count = v
                    .parse()
                    .ok()
                    .filter(|&r: &u8| r <= 7)
                    .ok_or_else(|| bad("retry must be 0..=7"))?
            }
            "verify_icrc" => cfg.verify_icrc = v != "0",
            "gso" => cfg.set_gso(v),
            "idle_ms" => {
                let ms: u64 = v.parse().map_err(|_| bad("bad idle_ms"))?;
                if ms == 0 {
                    return Err(bad("idle_ms must be positive"));
                }
                cfg.idle_after = Duration::from_millis(ms);
            }
            "faults" => cfg.faults = FaultPolicy::parse(v).ok_or_else(|| bad("bad faults"))?,
            // Unit tests only: a URL of a real deployment cannot make PSNs
            // predictable.
            #[cfg(test)]
            "initial_psn" => {
                let psn = v.parse().ok().and_then(Psn::new);
                cfg.initial_psn = Some(psn.ok_or_else(|| bad("initial_psn must be 0..2^24"))?);
            }
            _ => return Err(bad("unknown option")),
        }
    }
    if cfg.udp_port == 0 {
        return Err(bad("udp_port must not be 0"));
    }
    Ok((addr, cfg))
}
