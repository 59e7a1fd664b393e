//! `rpcrdmad`: the RPC-over-RDMA appliance daemon. Everything lives in the
//! `control` library; see [`control::daemon`].
fn main() {
    std::process::exit(control::daemon::main());
}
