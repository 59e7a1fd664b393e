//! The RPC programs the daemon serves, as rpcbind sees them.
//!
//! The numbers belong to the service layer (`dataplane::service`); this
//! list is what the daemon registers with rpcbind.

use dataplane::wire::conf::{CONFIG_RDMA_PROG, CONFIG_RDMA_VERS};
use dataplane::wire::conf2::CONFIG_RDMA_VERS2;

/// The bench program (echo, sink, source of N bytes; docs/PROTOCOL.md), served by
/// `dataplane::service::bench`: program number 0x2052444D ("RDM" in its
/// low bytes), in the range RFC 5531 appendix B leaves to users
/// (0x20000000-0x3FFFFFFF).
pub const BENCH_PROG: u32 = dataplane::service::bench::PROGRAM;
/// The bench program's only version.
pub const BENCH_VERS: u32 = dataplane::service::bench::VERSION;

/// A served program and version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServedProgram {
    /// Program number.
    pub program: u32,
    /// Version.
    pub version: u32,
    /// Name for logs and docs.
    pub name: &'static str,
}

/// Every program/version the daemon registers with rpcbind. Both
/// versions of CONF_RDMA: the engine answers version 2 (the extension
/// exchange, docs/EXTENSIONS.md) whatever extensions are configured, with
/// an empty list when none are.
pub const SERVED_PROGRAMS: [ServedProgram; 3] = [
    ServedProgram {
        program: CONFIG_RDMA_PROG,
        version: CONFIG_RDMA_VERS,
        name: "rdmaconfig",
    },
    ServedProgram {
        program: CONFIG_RDMA_PROG,
        version: CONFIG_RDMA_VERS2,
        name: "rdmaconfig",
    },
    ServedProgram {
        program: BENCH_PROG,
        version: BENCH_VERS,
        name: "rpcrdma_bench",
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bench_program_is_in_the_user_range() {
        assert!((0x2000_0000..=0x3FFF_FFFF).contains(&BENCH_PROG));
        assert_eq!(BENCH_PROG, 542_262_349);
    }
}
