//! The libtirpc baseline peer: the bench program served and driven by plain
//! ONC RPC over TCP, the status quo a user would pick instead of RDMA
//! (the comparison is the Sun NFS/RDMA paper's, s7.3).
//!
//! `bench/build.rs` generates C stubs from `bench/tirpc/bench_prog.x` with
//! rpcgen and links two executables against libtirpc: a server
//! ([`TirpcServer`]) and a client driver ([`run_client`]) that runs one
//! [`Workload`] and prints one JSON line, parsed here into a
//! [`TirpcResult`]. The client measures its own CPU time; the server's comes
//! from `/proc/<pid>/stat` before and after the run ([`TirpcServer::run`]).
//!
//! The procedures and the byte pattern are documented in
//! `docs/PROTOCOL.md` ("Bench program"); how to run the baseline by hand is
//! in `docs/BENCHMARKS.md`.

use std::fmt;
use std::io::{self, BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;

use serde::Deserialize;

/// Why the libtirpc peer could not be built, or `None` when it was.
const UNAVAILABLE: Option<&str> = option_env!("TIRPC_UNAVAILABLE");
const SERVER_BIN: Option<&str> = option_env!("TIRPC_SERVER_BIN");
const CLIENT_BIN: Option<&str> = option_env!("TIRPC_CLIENT_BIN");

/// Errors of the libtirpc peer. Each names what was being done.
#[derive(Debug, thiserror::Error)]
pub enum TirpcError {
    /// rpcgen or libtirpc was missing when the bench was built; the text is
    /// the one-line fix.
    #[error("libtirpc baseline peer not built: {0}")]
    Unavailable(&'static str),
    /// A peer executable could not be started.
    #[error("cannot start {path}: {source}")]
    Spawn {
        /// The executable.
        path: &'static str,
        /// The error from the operating system.
        source: io::Error,
    },
    /// The server ended or closed its stdout before announcing its port.
    #[error("libtirpc server exited before it was ready ({status}): {stderr}")]
    ServerNotReady {
        /// How it ended.
        status: String,
        /// Its standard error.
        stderr: String,
    },
    /// The server's first line was not `ready <port>`.
    #[error("libtirpc server said {line:?}, expected \"ready <port>\"")]
    BadReadyLine {
        /// The line it printed.
        line: String,
    },
    /// The client exited unsuccessfully (verify mismatch, RPC error, ...).
    #[error("libtirpc client {args:?} failed ({status}): {stderr}")]
    ClientFailed {
        /// The client's arguments.
        args: Vec<String>,
        /// Its exit status.
        status: ExitStatus,
        /// Its standard error.
        stderr: String,
    },
    /// The client's output was not the expected JSON object.
    #[error("libtirpc client printed {output:?}: {source}")]
    BadOutput {
        /// What it printed on stdout.
        output: String,
        /// The parse error.
        source: serde_json::Error,
    },
    /// `/proc/<pid>/stat` could not be read or parsed.
    #[error("cannot read the CPU times of pid {pid} from /proc: {reason}")]
    ProcStat {
        /// The process.
        pid: u32,
        /// What went wrong.
        reason: String,
    },
    /// Talking to or stopping a peer process failed.
    #[error("libtirpc peer: {what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The error from the operating system.
        source: io::Error,
    },
}

/// Result alias of this module.
pub type Result<T> = std::result::Result<T, TirpcError>;

/// Paths of the server and client executables built by `build.rs`.
///
/// # Errors
/// [`TirpcError::Unavailable`] with the install command when rpcgen or
/// libtirpc was missing at build time.
pub fn binaries() -> Result<(&'static str, &'static str)> {
    match (SERVER_BIN, CLIENT_BIN) {
        (Some(server), Some(client)) => Ok((server, client)),
        _ => Err(TirpcError::Unavailable(
            UNAVAILABLE.unwrap_or("unknown reason (bench/build.rs set nothing)"),
        )),
    }
}

/// A bench program procedure (numbers as in `bench_prog.x`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proc {
    /// 0: no arguments, no results.
    Null,
    /// 1: returns its opaque argument.
    Echo,
    /// 2: consumes its opaque argument.
    Sink,
    /// 3: returns `count` pattern bytes.
    Source,
}

impl Proc {
    /// The procedure number.
    pub fn number(self) -> u32 {
        match self {
            Proc::Null => 0,
            Proc::Echo => 1,
            Proc::Sink => 2,
            Proc::Source => 3,
        }
    }

    /// The client's name for it (`--proc`).
    pub fn name(self) -> &'static str {
        match self {
            Proc::Null => "null",
            Proc::Echo => "echo",
            Proc::Sink => "sink",
            Proc::Source => "source",
        }
    }
}

/// One run of the client driver.
#[derive(Debug, Clone, PartialEq)]
pub enum Workload {
    /// One call outstanding; per-call latency percentiles.
    Lat {
        /// The procedure called.
        proc: Proc,
        /// Argument bytes (ECHO, SINK) or requested bytes (SOURCE).
        size: u32,
        /// Measured calls.
        iterations: u64,
        /// Unmeasured calls first.
        warmup: u64,
    },
    /// One call outstanding for `seconds` (as many calls as fit).
    LatFor {
        /// The procedure called.
        proc: Proc,
        /// Argument bytes (ECHO, SINK) or requested bytes (SOURCE).
        size: u32,
        /// Duration.
        seconds: f64,
        /// Unmeasured calls first.
        warmup: u64,
    },
    /// `depth` connections, one thread each, NULL calls for `seconds`.
    Rate {
        /// Connections (threads).
        depth: u32,
        /// Duration.
        seconds: f64,
    },
    /// SOURCE(`size`) calls on `depth` connections for `seconds`.
    Read {
        /// Bytes per call.
        size: u32,
        /// Connections (threads).
        depth: u32,
        /// Duration.
        seconds: f64,
    },
    /// SINK calls of `size` bytes on `depth` connections for `seconds`.
    Write {
        /// Bytes per call.
        size: u32,
        /// Connections (threads).
        depth: u32,
        /// Duration.
        seconds: f64,
    },
    /// NULL, ECHO, SINK, SOURCE of `size` bytes checked byte for byte, and
    /// an oversized SOURCE refused with GARBAGE_ARGS.
    Verify {
        /// Bytes.
        size: u32,
    },
}

impl Workload {
    /// The client's command-line arguments after `--port P`.
    pub fn args(&self) -> Vec<String> {
        fn timed(mode: &str, size: u32, depth: u32, seconds: f64) -> Vec<String> {
            vec![
                mode.to_owned(),
                "--size".to_owned(),
                size.to_string(),
                "--depth".to_owned(),
                depth.to_string(),
                "--seconds".to_owned(),
                seconds.to_string(),
            ]
        }
        match *self {
            Workload::Lat {
                proc,
                size,
                iterations,
                warmup,
            } => vec![
                "lat".to_owned(),
                "--proc".to_owned(),
                proc.name().to_owned(),
                "--size".to_owned(),
                size.to_string(),
                "--iterations".to_owned(),
                iterations.to_string(),
                "--warmup".to_owned(),
                warmup.to_string(),
            ],
            Workload::LatFor {
                proc,
                size,
                seconds,
                warmup,
            } => vec![
                "lat".to_owned(),
                "--proc".to_owned(),
                proc.name().to_owned(),
                "--size".to_owned(),
                size.to_string(),
                "--seconds".to_owned(),
                seconds.to_string(),
                "--warmup".to_owned(),
                warmup.to_string(),
            ],
            Workload::Rate { depth, seconds } => vec![
                "rate".to_owned(),
                "--depth".to_owned(),
                depth.to_string(),
                "--seconds".to_owned(),
                seconds.to_string(),
            ],
            Workload::Read {
                size,
                depth,
                seconds,
            } => timed("read", size, depth, seconds),
            Workload::Write {
                size,
                depth,
                seconds,
            } => timed("write", size, depth, seconds),
            Workload::Verify { size } => {
                vec!["verify".to_owned(), "--size".to_owned(), size.to_string()]
            }
        }
    }
}

/// What the client printed, by workload.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "workload", rename_all = "lowercase")]
pub enum TirpcResult {
    /// From [`Workload::Lat`].
    Lat(LatencyReport),
    /// From [`Workload::Rate`].
    Rate(ThroughputReport),
    /// From [`Workload::Read`].
    Read(ThroughputReport),
    /// From [`Workload::Write`].
    Write(ThroughputReport),
    /// From [`Workload::Verify`].
    Verify(VerifyReport),
}

/// Latency of `count` calls made one at a time, in nanoseconds
/// (nearest-rank percentiles).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[allow(missing_docs)]
pub struct LatencyReport {
    pub proc: String,
    pub size: u64,
    pub count: u64,
    /// Wall time of the measured calls.
    pub seconds: f64,
    pub min_ns: u64,
    pub mean_ns: u64,
    pub p50_ns: u64,
    pub p90_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    pub max_ns: u64,
    pub client_user_s: f64,
    pub client_sys_s: f64,
    pub client_cpu_s: f64,
    /// With `--check`.
    #[serde(default)]
    pub check: Option<ClientCheck>,
}

/// The client's `--check` figures: FNV-1a 64 of each reply's data bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct ClientCheck {
    /// Hash of the first reply.
    pub first_fnv1a64: u64,
    /// Replies hashed.
    pub replies: u64,
    /// Replies whose hash differed from the first's.
    pub differing: u64,
}

/// Calls and bytes moved by `depth` connections in `seconds`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[allow(missing_docs)]
pub struct ThroughputReport {
    pub depth: u32,
    /// Bytes per call (0 for NULL).
    pub size: u64,
    pub seconds: f64,
    pub calls: u64,
    /// `calls * size`.
    pub bytes: u64,
    pub calls_per_s: f64,
    /// 10^6 bytes per second.
    pub mb_per_s: f64,
    pub client_user_s: f64,
    pub client_sys_s: f64,
    pub client_cpu_s: f64,
    /// With `--check` (READ only).
    #[serde(default)]
    pub check: Option<ClientCheck>,
}

/// A verify run that passed (a failing one is [`TirpcError::ClientFailed`]).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[allow(missing_docs)]
pub struct VerifyReport {
    pub size: u64,
    pub ok: bool,
}

/// User and system CPU seconds of a process.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CpuTimes {
    /// User time.
    pub user_s: f64,
    /// System time.
    pub sys_s: f64,
}

impl CpuTimes {
    /// User plus system.
    pub fn total_s(self) -> f64 {
        self.user_s + self.sys_s
    }

    /// The time spent between `earlier` and `self`.
    pub fn since(self, earlier: CpuTimes) -> CpuTimes {
        CpuTimes {
            user_s: self.user_s - earlier.user_s,
            sys_s: self.sys_s - earlier.sys_s,
        }
    }
}

/// CPU times of process `pid` (all its threads) from `/proc/<pid>/stat`,
/// in clock ticks of `sysconf(_SC_CLK_TCK)` (10 ms on usual kernels), so
/// runs should last seconds for the figure to mean much.
///
/// # Errors
/// [`TirpcError::ProcStat`] when the file is missing or malformed.
pub fn process_cpu(pid: u32) -> Result<CpuTimes> {
    let err = |reason: String| TirpcError::ProcStat { pid, reason };
    let stat =
        std::fs::read_to_string(format!("/proc/{pid}/stat")).map_err(|e| err(e.to_string()))?;
    let ticks = clock_ticks_per_second().map_err(err)?;
    parse_proc_stat(&stat, ticks).ok_or_else(|| err(format!("unexpected format: {stat:?}")))
}

fn clock_ticks_per_second() -> std::result::Result<f64, String> {
    use nix::unistd::{sysconf, SysconfVar};
    match sysconf(SysconfVar::CLK_TCK) {
        Ok(Some(t)) if t > 0 => Ok(t as f64),
        other => Err(format!("sysconf(_SC_CLK_TCK) gave {other:?}")),
    }
}

/// The user and system CPU times (at this machine's clock tick) in a
/// `/proc/<pid>/stat` or `/proc/<pid>/task/<tid>/stat` line.
pub fn parse_stat_cpu(stat: &str) -> Option<CpuTimes> {
    parse_proc_stat(stat, clock_ticks_per_second().ok()?)
}

/// utime and stime are fields 14 and 15 of `/proc/<pid>/stat`; the command
/// name (field 2) is parenthesised and may hold spaces and parentheses, so
/// counting starts after the last `)`.
fn parse_proc_stat(stat: &str, ticks_per_s: f64) -> Option<CpuTimes> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(CpuTimes {
        user_s: utime as f64 / ticks_per_s,
        sys_s: stime as f64 / ticks_per_s,
    })
}

/// Runs the client driver against `127.0.0.1:port` and parses its JSON.
///
/// # Errors
/// [`TirpcError::Unavailable`], [`TirpcError::Spawn`],
/// [`TirpcError::ClientFailed`] (any RPC error or verify mismatch, with the
/// client's stderr), [`TirpcError::BadOutput`].
pub fn run_client(port: u16, workload: &Workload) -> Result<TirpcResult> {
    run_client_with(port, workload, &ClientOptions::default())
}

/// Options of [`run_client_with`] beyond the workload.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientOptions {
    /// Server address (IPv4); empty: 127.0.0.1.
    pub host: String,
    /// Write every measured call's latency here (`--samples`).
    pub samples: Option<std::path::PathBuf>,
    /// Hash the replies' bytes (`--check`).
    pub check: bool,
    /// Pin the client process (all its threads) to this core.
    pub core: Option<usize>,
}

/// Runs the client driver against `host:port` with `options`.
///
/// # Errors
/// As [`run_client`].
pub fn run_client_with(
    port: u16,
    workload: &Workload,
    options: &ClientOptions,
) -> Result<TirpcResult> {
    let (_, client) = binaries()?;
    let mut args = vec!["--port".to_owned(), port.to_string()];
    if !options.host.is_empty() {
        args.extend(["--host".to_owned(), options.host.clone()]);
    }
    args.extend(workload.args());
    if let Some(path) = &options.samples {
        args.extend(["--samples".to_owned(), path.display().to_string()]);
    }
    if options.check {
        args.push("--check".to_owned());
    }
    let mut command = Command::new(client);
    pin_child(&mut command, options.core);
    let out = command
        .args(&args)
        .stdin(Stdio::null())
        .output()
        .map_err(|source| TirpcError::Spawn {
            path: client,
            source,
        })?;
    if !out.status.success() {
        return Err(TirpcError::ClientFailed {
            args,
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim_end().to_owned(),
        });
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.trim()).map_err(|source| TirpcError::BadOutput {
        output: stdout.into_owned(),
        source,
    })
}

/// Makes the child start on `core` only (its threads inherit the mask). A
/// core the machine lacks makes the affinity call fail, which the child
/// ignores: it then runs unpinned.
fn pin_child(command: &mut Command, core: Option<usize>) {
    use std::os::unix::process::CommandExt;
    let Some(core) = core else { return };
    if core >= libc::CPU_SETSIZE as usize {
        return;
    }
    // SAFETY: the closure runs in the child between fork and exec and only
    // makes the sched_setaffinity system call on a stack-local set, which
    // is async-signal-safe.
    unsafe {
        command.pre_exec(move || {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(core, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
            Ok(())
        });
    }
}

/// A client run with the server's CPU time over the same interval.
#[derive(Debug, Clone, PartialEq)]
pub struct TirpcRun {
    /// What the client reported.
    pub result: TirpcResult,
    /// Server CPU time from just before the client started to just after
    /// it exited (includes connection set-up, a few system calls).
    pub server_cpu: CpuTimes,
}

/// The libtirpc server process, listening on 127.0.0.1; killed on drop.
pub struct TirpcServer {
    child: Child,
    port: u16,
    stderr: Arc<Mutex<String>>,
    stopped: bool,
}

impl TirpcServer {
    /// Starts the server on `127.0.0.1:port` (0: a free port, see
    /// [`port`](Self::port)) and waits for its `ready <port>` line.
    ///
    /// # Errors
    /// [`TirpcError::Unavailable`], [`TirpcError::Spawn`],
    /// [`TirpcError::ServerNotReady`] (e.g. the port is in use; the text
    /// carries the server's message), [`TirpcError::BadReadyLine`].
    pub fn start(port: u16) -> Result<Self> {
        Self::start_pinned(port, None)
    }

    /// As [`start`](Self::start), with the server pinned to `core`.
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub fn start_pinned(port: u16, core: Option<usize>) -> Result<Self> {
        let (server, _) = binaries()?;
        let mut command = Command::new(server);
        pin_child(&mut command, core);
        let mut child = command
            .arg(port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| TirpcError::Spawn {
                path: server,
                source,
            })?;
        // Collected line by line, so that it can be shown while it runs.
        let stderr = Arc::new(Mutex::new(String::new()));
        let reader = child.stderr.take().map(|pipe| {
            let sink = Arc::clone(&stderr);
            thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(|l| l.ok()) {
                    let mut text = sink.lock().unwrap_or_else(|e| e.into_inner());
                    text.push_str(&line);
                    text.push('\n');
                }
            })
        });
        let mut line = String::new();
        let read = child
            .stdout
            .take()
            .map(|out| BufReader::new(out).read_line(&mut line));
        let mut server = TirpcServer {
            child,
            port: 0,
            stderr,
            stopped: false,
        };
        if !matches!(read, Some(Ok(n)) if n > 0) {
            let status = server
                .child
                .wait()
                .map(|s| s.to_string())
                .unwrap_or_else(|e| e.to_string());
            server.stopped = true;
            // The child is gone, so its stderr is at end of file.
            if let Some(reader) = reader {
                let _ = reader.join();
            }
            return Err(TirpcError::ServerNotReady {
                status,
                stderr: server.stderr_text(),
            });
        }
        server.port = line
            .trim()
            .strip_prefix("ready ")
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| TirpcError::BadReadyLine {
                line: line.trim_end().to_owned(),
            })?;
        Ok(server)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its CPU times so far.
    ///
    /// # Errors
    /// [`TirpcError::ProcStat`].
    pub fn cpu(&self) -> Result<CpuTimes> {
        process_cpu(self.pid())
    }

    /// Runs `workload` against this server, with the server's CPU time
    /// over the run.
    ///
    /// # Errors
    /// As [`run_client`] and [`process_cpu`].
    pub fn run(&self, workload: &Workload) -> Result<TirpcRun> {
        let before = self.cpu()?;
        let result = run_client(self.port, workload)?;
        let after = self.cpu()?;
        Ok(TirpcRun {
            result,
            server_cpu: after.since(before),
        })
    }

    /// Stops the server with SIGTERM and returns its exit status (success
    /// when it shut down cleanly).
    ///
    /// # Errors
    /// [`TirpcError::Io`] when the signal or the wait fails.
    pub fn stop(mut self) -> Result<ExitStatus> {
        use nix::sys::signal::{kill, Signal};
        use nix::unistd::Pid;
        let pid = Pid::from_raw(i32::try_from(self.pid()).unwrap_or(i32::MAX));
        kill(pid, Signal::SIGTERM).map_err(|e| TirpcError::Io {
            what: "SIGTERM to the server",
            source: e.into(),
        })?;
        let status = self.child.wait().map_err(|source| TirpcError::Io {
            what: "waiting for the server",
            source,
        })?;
        self.stopped = true;
        Ok(status)
    }

    /// What the server wrote on stderr so far.
    pub fn stderr_text(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .trim_end()
            .to_owned()
    }
}

impl Drop for TirpcServer {
    fn drop(&mut self) {
        if !self.stopped {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl fmt::Debug for TirpcServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TirpcServer")
            .field("pid", &self.child.id())
            .field("port", &self.port)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_fields_after_a_strange_command_name() {
        let stat = "4242 (a) b (c) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 1 0";
        let cpu = parse_proc_stat(stat, 100.0).unwrap();
        assert_eq!(cpu.user_s, 2.5);
        assert_eq!(cpu.sys_s, 0.75);
        assert!(parse_proc_stat("4242 (x) S 1", 100.0).is_none());
    }

    #[test]
    fn own_cpu_time_is_readable() {
        let cpu = process_cpu(std::process::id()).unwrap();
        assert!(cpu.total_s() >= 0.0);
    }

    #[test]
    fn workload_arguments() {
        let lat = Workload::Lat {
            proc: Proc::Echo,
            size: 4096,
            iterations: 300,
            warmup: 10,
        };
        assert_eq!(
            lat.args().join(" "),
            "lat --proc echo --size 4096 --iterations 300 --warmup 10"
        );
        let read = Workload::Read {
            size: 262_144,
            depth: 8,
            seconds: 0.25,
        };
        assert_eq!(
            read.args().join(" "),
            "read --size 262144 --depth 8 --seconds 0.25"
        );
        assert_eq!(Proc::Source.number(), 3);
    }

    #[test]
    fn results_parse_by_workload() {
        let r: TirpcResult = serde_json::from_str(
            r#"{"workload":"rate","depth":4,"size":0,"seconds":0.5,"calls":10,"bytes":0,"calls_per_s":20.0,"mb_per_s":0.000,"client_user_s":0.1,"client_sys_s":0.2,"client_cpu_s":0.3}"#,
        )
        .unwrap();
        assert!(matches!(
            r,
            TirpcResult::Rate(ThroughputReport { calls: 10, .. })
        ));
        let v: TirpcResult =
            serde_json::from_str(r#"{"workload":"verify","size":0,"ok":true}"#).unwrap();
        assert_eq!(v, TirpcResult::Verify(VerifyReport { size: 0, ok: true }));
    }
}
