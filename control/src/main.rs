//! `rpcrdmad`: the RPC-over-RDMA appliance daemon.
//!
//! For now it only describes itself; serving arrives with the daemon issue.
use clap::Parser;

/// Serve ONC RPC programs over RDMA (RFC 5666 / RFC 8166) from pinned,
/// busy-polling worker cores.
#[derive(Debug, Parser)]
#[command(name = "rpcrdmad", version, about, long_about = None)]
struct Args {
    /// Configuration file (TOML).
    #[arg(long, value_name = "FILE")]
    config: Option<std::path::PathBuf>,
}

fn main() {
    let args = Args::parse();
    eprintln!(
        "rpcrdmad: serving is not implemented yet (config: {:?}); see README.md status table",
        args.config
    );
    std::process::exit(2);
}
