//! `rpcrdma-bench`: the load generator.
//!
//! Workloads arrive with the bench issue; for now it measures the floor:
//! `rpcrdma-bench floor` compares the `shm` provider's round trips with a
//! raw cross-core cache-line ping-pong, in one run.
use clap::{Parser, Subcommand};

mod floor;

/// Measure RPC-over-RDMA latency, message rate and bulk throughput against
/// RPC over TCP and the physical floor of this machine.
#[derive(Debug, Parser)]
#[command(name = "rpcrdma-bench", version, about, long_about = None)]
struct Args {
    /// Server address (`shm:///path`, `roce://IP:PORT`, `tcp://IP:PORT`).
    #[arg(long, value_name = "URL")]
    connect: Option<String>,
    #[command(subcommand)]
    command: Option<Cmd>,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Raw cross-core cache-line ping-pong vs shm RDMA Write and Send round
    /// trips, between two pinned processes.
    Floor {
        /// Round trips per measurement.
        #[arg(long, default_value_t = 200_000)]
        iters: u64,
        /// The two cores to pin to.
        #[arg(long, value_delimiter = ',', default_values_t = [0usize, 1])]
        cores: Vec<usize>,
    },
    /// The responder half of `floor` (spawned by it).
    #[command(hide = true)]
    FloorPeer {
        #[arg(long)]
        url: String,
        #[arg(long)]
        page: String,
        #[arg(long)]
        core: usize,
        #[arg(long)]
        iters: u64,
    },
}

fn main() {
    let args = Args::parse();
    match args.command {
        Some(Cmd::Floor { iters, cores }) => {
            let c = (
                cores.first().copied().unwrap_or(0),
                cores.get(1).copied().unwrap_or(1),
            );
            floor::run(iters.max(100), c);
        }
        Some(Cmd::FloorPeer {
            url,
            page,
            core,
            iters,
        }) => floor::peer(&url, &page, core, iters.max(100)),
        None => {
            eprintln!(
                "rpcrdma-bench: no workload is implemented yet besides `floor` (connect: {:?}); see README.md status table",
                args.connect
            );
            std::process::exit(2);
        }
    }
}
