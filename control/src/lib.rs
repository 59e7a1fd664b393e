//! The control plane of `rpcrdmad`: configuration, rpcbind registration,
//! the metrics exporter and the daemon's startup and shutdown.
//!
//! Everything here runs on ordinary threads outside the data path; the
//! only thing shared with the (future) polling workers is the metrics
//! registry of cache-padded atomic counters.
#![forbid(unsafe_code)]
#![warn(missing_debug_implementations, missing_docs)]

pub mod config;
pub mod daemon;
pub mod metrics;
pub mod programs;
pub mod rpcbind;
