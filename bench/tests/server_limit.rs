//! A server whose message limit is rpcrdmad's default (1 MiB + 4 KiB,
//! `transport.max_message`) refuses a 2 MiB call (RDMA_ERROR ERR_CHUNK)
//! and a 2 MiB reply (SYSTEM_ERR); the bench says which limit, naming the
//! key and both sizes, in one line.

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bench::limits::RPCRDMAD_DEFAULT_MAX_MESSAGE;
use dataplane::engine;
use dataplane::service::ServiceTable;
use dataplane::verbs::shm::Shm;
use dataplane::verbs::{Context, Provider};
use dataplane::worker::{EndpointConfig, WorkerConfig, WorkerPool};

const BIN: &str = env!("CARGO_BIN_EXE_rpcrdma-bench");

/// A one-worker shm server with rpcrdmad's default limits, accepting until
/// dropped.
struct Server {
    url: String,
    stop: Arc<AtomicBool>,
    acceptor: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    fn start() -> Server {
        let url = format!(
            "shm://{}/rpcrdma-bench-limit-{}.sock",
            std::env::temp_dir().display(),
            std::process::id()
        );
        let ctx = Arc::new(Shm::open(&url).unwrap());
        let listener = ctx.listen(&url).unwrap();
        let engine = engine::Config {
            max_outstanding_calls: 1,
            max_call_size: RPCRDMAD_DEFAULT_MAX_MESSAGE,
            max_reply_size: RPCRDMAD_DEFAULT_MAX_MESSAGE,
            max_ddp_size: 4096,
            ..engine::Config::default()
        };
        let config = WorkerConfig {
            endpoint: EndpointConfig {
                engine,
                ..EndpointConfig::default()
            },
            ..WorkerConfig::default()
        };
        let pool =
            WorkerPool::<Shm>::spawn(ctx, &[None], config, Arc::new(ServiceTable::builtin()))
                .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let s = Arc::clone(&stop);
        let acceptor = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let _ = pool.accept(&listener, Duration::from_millis(20));
            }
            let _ = pool.stop(Duration::from_secs(10));
        });
        Server {
            url,
            stop,
            acceptor: Some(acceptor),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
    }
}

/// Runs the bench against `url`; expects a failure and returns stderr.
fn fails(url: &str, args: &[&str]) -> String {
    let out = Command::new(BIN)
        .args(["--connect", url, "--duration", "0.1", "--no-pin"])
        .args(args)
        .output()
        .expect("run rpcrdma-bench");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    err
}

#[test]
fn messages_over_the_server_limit_name_the_key_and_both_sizes() {
    let server = Server::start();
    let err = fails(&server.url, &["lat", "--size", "2m"]);
    assert_eq!(
        err,
        "rpcrdma-bench: shm: call failed: call of 2097196 bytes exceeds the server's \
         transport.max_message (1052672 bytes, rpcrdmad's default) and was refused \
         (RDMA_ERROR ERR_CHUNK); raise transport.max_message in the server's configuration \
         to at least 2097196 bytes, or use a --size of at most 1052628\n"
    );
    let err = fails(&server.url, &["read", "--size", "2m", "--depth", "1"]);
    assert!(
        err.contains(
            "reply of 2097180 bytes exceeds the server's transport.max_message (1052672 bytes"
        ) && err.contains("(SYSTEM_ERR)"),
        "{err}"
    );
    let err = fails(&server.url, &["write", "--size", "2m", "--depth", "1"]);
    assert!(
        err.contains("call of 2097196 bytes exceeds the server's transport.max_message"),
        "{err}"
    );
    drop(server);
}
