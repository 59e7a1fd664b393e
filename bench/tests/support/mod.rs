//! Helpers shared by the bench's integration tests.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// The `rpcrdma-bench` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_rpcrdma-bench");

/// Runs `rpcrdma-bench ARGV --json FILE`, checks that it succeeded (the
/// failure message carries both output streams) and returns its standard
/// output and the JSON document.
pub fn run_bench(argv: &[&str], json: &Path) -> (String, Value) {
    let out = Command::new(BIN)
        .args(argv)
        .arg("--json")
        .arg(json)
        .output()
        .expect("run rpcrdma-bench");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{argv:?}: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    let text = std::fs::read_to_string(json).expect("the --json file");
    (stdout, serde_json::from_str(&text).expect("valid JSON"))
}
