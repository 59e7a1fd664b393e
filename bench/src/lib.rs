//! `rpcrdma-bench` as a library: the bench's modules, reachable from the
//! integration tests; `src/main.rs` is the command-line front end.
//!
//! - [`spec`]: a run ([`spec::RunSpec`]), its result ([`spec::RunResult`]),
//!   errors and the [`spec::Transport`] trait (below every driver);
//! - [`transport`]: [`transport::open`] for `--connect` URLs (re-exports
//!   [`spec`]);
//! - [`driver`]: the generic timed loop and the [`driver::RpcDriver`] trait
//!   an in-process transport implements (how to plug a transport in);
//! - [`rdma`]: RPC over RDMA (`shm`, `roce`) with `dataplane::client`;
//! - [`tcp`]: RPC over TCP with `dataplane::tcp`;
//! - [`conns`]: many idle connections against one busy one (`conns`);
//! - [`soak`]: many client processes, killed at random, every reply checked (`soak`);
//! - [`inproc`]: the no-transport reference driver;
//! - [`tirpc`]: the libtirpc baseline peer (C server and client);
//! - [`nfs`]: NFSv3 READ/WRITE through the gateway and over TCP (`nfs`);
//! - [`membw`]: single-core memcpy bandwidth (part of `floor`);
//! - [`output`]: tables, JSON documents, SVG plots.

pub mod conns;
pub mod driver;
pub mod inproc;
pub mod membw;
pub mod nfs;
pub mod output;
pub mod rdma;
pub mod soak;
pub mod spec;
pub mod tcp;
pub mod tirpc;
pub mod transport;
