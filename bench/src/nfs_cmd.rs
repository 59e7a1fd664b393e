//! The `nfs` subcommand: opens the clients, finds the files, runs every
//! point (the transports back to back per point, so that a ratio compares
//! runs taken seconds apart), prints, plots.

use dataplane::engine::Extensions;
use std::path::PathBuf;

use bench::nfs::{self, Files, NfsOp, NfsPoint, NfsTransport, PointSpec, RdmaNfs, TcpNfs};
use bench::transport::{BenchError, Idle};
use dataplane::verbs::roce::Roce;
use dataplane::verbs::shm::Shm;
use serde_json::json;

/// The subcommand's arguments (`rpcrdma-bench nfs`).
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Gateway listeners (shm://PATH, roce://IP:PORT), comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub gateway: Vec<String>,
    /// The NFS server's TCP address (tcp://IP:PORT), for the straight
    /// comparison; without it only the gateway runs.
    #[arg(long, value_name = "URL")]
    pub direct: Option<String>,
    /// MOUNT for --direct: tcp://IP:PORT, or rpcbind://IP (ask its
    /// rpcbind). Default: rpcbind at --direct's address.
    #[arg(long, value_name = "URL")]
    pub mount: Option<String>,
    /// The export's MOUNT path on the server.
    #[arg(long, value_name = "PATH")]
    pub export: String,
    /// The file READ reads (in the export's root, at least 1 MiB).
    #[arg(long, value_name = "NAME")]
    pub file: String,
    /// The file WRITE writes (in the export's root, existing); its
    /// offsets wrap at the read file's size.
    #[arg(long, value_name = "NAME", default_value = "nfs-bench-write")]
    pub write_file: String,
    /// Request sizes (at most 1m).
    #[arg(long, value_delimiter = ',', value_parser = crate::parse_size,
          default_values = ["4k", "16k", "64k", "256k", "1m"])]
    pub sizes: Vec<u32>,
    /// Outstanding requests.
    #[arg(long, value_delimiter = ',', default_values_t = [1u32, 2, 4, 8, 16])]
    pub depths: Vec<u32>,
    /// Operations: read, write.
    #[arg(long, value_delimiter = ',', default_values_t = ["read".to_owned(), "write".to_owned()])]
    pub ops: Vec<String>,
    /// Directory for the SVG plots.
    #[arg(long, default_value = "bench-plots")]
    pub plots: PathBuf,
    /// Depth of the CPU-per-GB plot.
    #[arg(long, default_value_t = 4)]
    pub cpu_depth: u32,
    /// The gateway daemon's pid, for its CPU per GB.
    #[arg(long, value_name = "PID")]
    pub gateway_pid: Option<u32>,
    /// The NFS server's pid, for its CPU per GB.
    #[arg(long, value_name = "PID")]
    pub nfs_pid: Option<u32>,
}

fn unsupported(reason: String) -> BenchError {
    BenchError::Unsupported {
        transport: "nfs",
        reason,
    }
}

/// A client and the handles it found.
struct Conn {
    t: Box<dyn NfsTransport>,
    files: Files,
    describe: String,
}

fn open_gateway(url: &str, a: &Args, idle: Idle, ext: Extensions) -> Result<Conn, BenchError> {
    let mut t: Box<dyn NfsTransport> = if url.starts_with("shm://") {
        Box::new(RdmaNfs::<Shm>::connect("shm", url, idle, ext)?)
    } else if url.starts_with("roce://") {
        Box::new(RdmaNfs::<Roce>::connect("roce", url, idle, ext)?)
    } else {
        return Err(unsupported(format!(
            "--gateway {url}: shm://PATH or roce://IP:PORT"
        )));
    };
    // MNT goes through the gateway too (its MOUNT route).
    let root_t: &mut dyn NfsTransport = t.as_mut();
    let root = nfs::mount(root_t, &a.export)?;
    let files = files_under(t.as_mut(), &root, a)?;
    Ok(Conn {
        t,
        files,
        describe: format!(
            "{}: NFSv3 over RPC-over-RDMA through the gateway at {url}",
            {
                if url.starts_with("shm://") {
                    "shm"
                } else {
                    "roce"
                }
            }
        ),
    })
}

fn files_under(t: &mut dyn NfsTransport, root: &[u8], a: &Args) -> Result<Files, BenchError> {
    let (read, read_size) = nfs::lookup(t, root, &a.file)?;
    let (write, _) = nfs::lookup(t, root, &a.write_file)?;
    if read_size < u64::from(nfs::MAX_IO) {
        return Err(unsupported(format!(
            "{} holds {read_size} bytes; the read file needs at least 1 MiB",
            a.file
        )));
    }
    Ok(Files {
        read,
        read_size,
        write,
        write_span: read_size,
    })
}

fn open_direct(url: &str, a: &Args) -> Result<Conn, BenchError> {
    let addr = nfs::tcp_addr(url).map_err(unsupported)?;
    let mount_url = a
        .mount
        .clone()
        .unwrap_or_else(|| format!("rpcbind://{}", addr.ip()));
    let mount_addr = nfs::mount_addr(&mount_url)?;
    let mut m = TcpNfs::connect("tcp", mount_addr)?;
    let root = nfs::mount(&mut m, &a.export)?;
    Box::new(m).close()?;
    let mut t: Box<dyn NfsTransport> = Box::new(TcpNfs::connect("tcp", addr)?);
    let files = files_under(t.as_mut(), &root, a)?;
    Ok(Conn {
        t,
        files,
        describe: format!(
            "tcp: NFSv3 over TCP straight to {addr} (MOUNT at {mount_addr}), record-marked, pipelined"
        ),
    })
}

/// Runs the subcommand; the JSON body (`transports`, `results`,
/// `ratios`, `plots`).
pub fn run(
    duration: std::time::Duration,
    idle: Idle,
    extensions: Extensions,
    a: Args,
) -> Result<serde_json::Value, BenchError> {
    let ops: Vec<NfsOp> = a
        .ops
        .iter()
        .map(|o| match o.as_str() {
            "read" => Ok(NfsOp::Read),
            "write" => Ok(NfsOp::Write),
            other => Err(unsupported(format!("unknown op {other:?} (read, write)"))),
        })
        .collect::<Result<_, _>>()?;
    if a.gateway.is_empty() && a.direct.is_none() {
        return Err(unsupported(
            "give --gateway URL and/or --direct URL".to_owned(),
        ));
    }
    if let Some(&s) = a.sizes.iter().find(|&&s| !(4..=nfs::MAX_IO).contains(&s)) {
        return Err(unsupported(format!("size {s}: 4 bytes .. 1 MiB")));
    }
    if let Some(&d) = a
        .depths
        .iter()
        .find(|&&d| !(1..=nfs::MAX_DEPTH).contains(&d))
    {
        return Err(unsupported(format!("depth {d}: 1 .. {}", nfs::MAX_DEPTH)));
    }
    let mut conns = Vec::new();
    for url in &a.gateway {
        conns.push(open_gateway(url, &a, idle, extensions)?);
    }
    if let Some(url) = &a.direct {
        conns.push(open_direct(url, &a)?);
    }
    for c in &conns {
        println!("{}", c.describe);
    }
    let mut data = vec![0u8; nfs::MAX_IO as usize];
    dataplane::service::bench::fill_pattern(&mut data);
    let total = ops.len() * a.sizes.len() * a.depths.len() * conns.len();
    eprintln!(
        "{total} points, about {:.0} s",
        (duration.as_secs_f64() + 0.05) * total as f64
    );
    let mut points: Vec<NfsPoint> = Vec::with_capacity(total);
    for &op in &ops {
        for &depth in &a.depths {
            for &size in &a.sizes {
                for c in &mut conns {
                    let spec = PointSpec {
                        op,
                        size,
                        depth,
                        duration,
                        idle,
                    };
                    let gw = if c.t.name() == "tcp" {
                        None
                    } else {
                        a.gateway_pid
                    };
                    let p = nfs::run_point(c.t.as_mut(), &c.files, &spec, &data, gw, a.nfs_pid)?;
                    eprintln!(
                        "{:>3}/{total} {} {} {} depth {}: {:.1} MB/s",
                        points.len() + 1,
                        p.transport,
                        op.name(),
                        bench::output::size_label(size),
                        depth,
                        p.mb_per_s
                    );
                    points.push(p);
                }
            }
        }
    }
    let transports: Vec<String> = conns.iter().map(|c| c.describe.clone()).collect();
    for c in conns {
        c.t.close()?;
    }
    let _ = nfs::print_table(&mut std::io::stdout().lock(), &points);
    let written = nfs::plot(&a.plots, &points, a.cpu_depth)
        .map_err(|e| unsupported(format!("plotting failed: {e}")))?;
    for p in &written {
        println!("plot: {}", p.display());
    }
    Ok(json!({
        "transports": transports,
        "export": a.export,
        "file": a.file,
        "write_file": a.write_file,
        "gateway_pid": a.gateway_pid,
        "nfs_pid": a.nfs_pid,
        "results": points,
        "ratios": nfs::ratios(&points),
        "plots": written,
    }))
}
