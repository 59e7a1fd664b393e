//! `[[gateway]]` routes made ready for the workers: each backend's TCP
//! address (asked of rpcbind for `rpcbind://` backends), the relay's
//! limits, and the counters the workers share and the metrics read.

use std::sync::Arc;
use std::time::Duration;

use dataplane::gateway::{GatewayConfig, Route};
use dataplane::worker::GatewaySetup;

use crate::config::{Backend, Config, GatewayRoute, ProviderUrl};
use crate::rpcbind::{parse_universal_address, Mapping, RpcbindAddress, RpcbindClient};

/// Why a route's backend could not be found.
#[derive(Debug, thiserror::Error)]
#[error("gateway[{index}] (program {program}): {reason}")]
pub struct GatewayError {
    /// The route's place in `[[gateway]]`.
    pub index: usize,
    /// Its program.
    pub program: u32,
    /// What went wrong and what to do.
    pub reason: String,
}

/// The relay's setup for `config`'s routes; `None` when there are none.
///
/// # Errors
/// A [`GatewayError`] for the first backend that rpcbind does not know.
pub fn setup(config: &Config) -> Result<Option<GatewaySetup>, GatewayError> {
    if config.gateway.is_empty() {
        return Ok(None);
    }
    let timeout = Duration::from_millis(config.rpcbind.timeout_ms.into());
    let mut routes = Vec::with_capacity(config.gateway.len());
    for (index, r) in config.gateway.iter().enumerate() {
        let backend = match r.backend {
            Backend::Tcp(a) => a,
            Backend::Rpcbind(at) => resolve(r, at, timeout).map_err(|reason| GatewayError {
                index,
                program: r.program,
                reason,
            })?,
        };
        // rpcbind may map the program to this daemon itself (the gateway
        // registers routed programs for its TCP listener): relaying there
        // would loop.
        let own = config.listeners.iter().any(|l| match &l.url {
            ProviderUrl::Tcp(a) => {
                a.port() == backend.port() && (a.ip() == backend.ip() || a.ip().is_unspecified())
            }
            _ => false,
        });
        if own {
            return Err(GatewayError {
                index,
                program: r.program,
                reason: format!(
                    "the backend {backend} is this daemon's own tcp listener (rpcbind still maps the program to the gateway?); give the backend as IP:PORT"
                ),
            });
        }
        tracing::info!(
            "gateway: program {} versions {:?} -> tcp {backend} ({} connection(s) per worker)",
            r.program,
            r.versions,
            r.connections
        );
        let lo = r.versions.iter().copied().min().unwrap_or(0);
        let hi = r.versions.iter().copied().max().unwrap_or(0);
        routes.push(Route {
            program: r.program,
            versions: lo..=hi,
            backend,
            connections: r.connections,
        });
    }
    let relay = GatewayConfig {
        routes,
        // Every call a worker's connections may have outstanding, up to
        // the table's limit.
        max_in_flight: (u64::from(config.transport.credits)
            * u64::from(config.workers.max_connections))
        .clamp(1024, 65536) as u32,
        max_message: config.transport.max_message as usize,
        ..GatewayConfig::default()
    };
    relay.validate().map_err(|e| GatewayError {
        index: 0,
        program: config.gateway[0].program,
        reason: e.to_string(),
    })?;
    Ok(Some(GatewaySetup {
        config: Arc::new(relay),
    }))
}

/// The TCP address the rpcbind at `at` holds for the route's program (its
/// highest listed version first).
fn resolve(
    r: &GatewayRoute,
    at: std::net::SocketAddr,
    timeout: Duration,
) -> Result<std::net::SocketAddr, String> {
    let mut client = RpcbindClient::connect(&RpcbindAddress::Tcp(at), timeout)
        .map_err(|e| format!("{e}; start rpcbind there or give the backend as IP:PORT"))?;
    let mut versions = r.versions.clone();
    versions.sort_unstable_by(|a, b| b.cmp(a));
    for v in versions {
        let netid = if at.is_ipv4() { "tcp" } else { "tcp6" };
        let m = Mapping {
            program: r.program,
            version: v,
            netid: netid.to_string(),
            addr: String::new(),
            owner: String::new(),
        };
        let found = client.getaddr(&m).map_err(|e| e.to_string())?;
        if let Some(addr) = found.as_deref().and_then(parse_universal_address) {
            // rpcbind answers with the address the server registered, which
            // may be the wildcard: the server is then on rpcbind's host.
            return Ok(if addr.ip().is_unspecified() {
                std::net::SocketAddr::new(at.ip(), addr.port())
            } else {
                addr
            });
        }
    }
    Err(format!(
        "rpcbind at {at} has no tcp address for versions {:?}; start the server first or give the backend as IP:PORT",
        r.versions
    ))
}
