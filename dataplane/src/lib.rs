//! The data path of the rpcrdma appliance.
//!
//! Layering (imports point down only; docs/ARCHITECTURE.md):
//!
//! ```text
//!   gateway                  relay of routed programs to TCP backends (the worker
//!                            drives it; it reads nfs replies for their DDP item)
//!   nfs                      NFSv3/MOUNT v3 codecs, DDP marking, service helpers
//!   service, client          RpcService trait, requester API
//!   extension_names          configuration names of the RPC-over-RDMA extensions
//!   worker                   pinned polling loop: engine <-> provider glue
//!   engine | verbs, mem      sans-IO RPC/RDMA logic | providers, registered memory
//!   wire                     pure codecs, no I/O
//!   clock, wake              time source; doorbells that wake a parked poller
//! ```
//!
//! `wire` knows bytes only: it imports nothing else from this crate.
#![forbid(unsafe_op_in_unsafe_fn)]
#![warn(missing_debug_implementations)]

pub mod client;
pub mod clock;
pub mod engine;
pub mod extension_names;
pub mod gateway;
pub mod mem;
pub mod nfs;
pub mod service;
pub mod tcp;
pub mod verbs;
pub mod wake;
pub mod wire;
pub mod worker;
