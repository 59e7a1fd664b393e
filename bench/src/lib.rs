//! `rpcrdma-bench` as a library: the bench's modules, reachable from the
//! integration tests; `src/main.rs` is the command-line front end.

pub mod tirpc;
