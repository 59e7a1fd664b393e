//! The control plane of `rpcrdmad`: configuration, rpcbind registration,
//! the metrics exporter and the daemon's startup and shutdown.
//!
//! Everything here runs on ordinary threads outside the data path: the
//! acceptors hand connections to the pinned workers of `dataplane::worker`
//! (`serve`), and the metrics exporter reads the workers' cache-padded
//! counters.
#![forbid(unsafe_code)]
#![warn(missing_debug_implementations, missing_docs)]

pub mod config;
pub mod daemon;
pub mod gateway;
pub mod metrics;
pub mod programs;
pub mod ratelimit;
pub mod refusal;
pub mod rpcbind;
pub mod serve;
pub mod status;
