//! `rpcrdma-bench`: the load generator.
//!
//! For now it only describes itself; the workloads arrive with the bench issue.
use clap::Parser;

/// Measure RPC-over-RDMA latency, message rate and bulk throughput against
/// RPC over TCP and the physical floor of this machine.
#[derive(Debug, Parser)]
#[command(name = "rpcrdma-bench", version, about, long_about = None)]
struct Args {
    /// Server address (`shm:///path`, `roce://IP:PORT`, `tcp://IP:PORT`).
    #[arg(long, value_name = "URL")]
    connect: Option<String>,
}

fn main() {
    let args = Args::parse();
    eprintln!(
        "rpcrdma-bench: no workload is implemented yet (connect: {:?}); see README.md status table",
        args.connect
    );
    std::process::exit(2);
}
