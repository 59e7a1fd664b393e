//! Builds the libtirpc baseline peer (docs/BENCHMARKS.md, "libtirpc over TCP
//! (baseline)"): rpcgen turns `tirpc/bench_prog.x` into C stubs in OUT_DIR,
//! and the C compiler links them with our server and client against
//! libtirpc into two executables, whose paths reach the crate as
//! `TIRPC_SERVER_BIN` and `TIRPC_CLIENT_BIN`.
//!
//! Without rpcgen or libtirpc the build does not fail: it sets
//! `TIRPC_UNAVAILABLE` to a one-line fix instead, `bench::tirpc` reports that
//! line at run time, and the tests skip (or fail under
//! `RPCRDMA_REQUIRE_PEERS=1`). `cargo build` on a fresh machine must work;
//! `deploy/check` installs the packages before it builds. Once the packages
//! appear, the next build picks them up: the paths probed are declared with
//! `rerun-if-changed`, and a missing path makes Cargo rerun this script.
//!
//! Our own C must compile cleanly with `-Wall -Wextra` (enforced with
//! `-Werror`); the rpcgen output is compiled with warnings off.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const INSTALL_HINT: &str = "apt-get install rpcsvc-proto libtirpc-dev";
const SOURCES: [&str; 4] = [
    "bench_prog.x",
    "bench_prog_pattern.h",
    "bench_prog_server_impl.c",
    "bench_prog_client.c",
];

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let src = manifest.join("tirpc");
    for f in SOURCES {
        println!("cargo:rerun-if-changed={}", src.join(f).display());
    }
    println!("cargo:rerun-if-env-changed=RPCGEN");

    match find_toolchain() {
        Ok(tools) => {
            let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR")).join("tirpc");
            let (server, client) = build_peer(&tools, &src, &out);
            println!("cargo:rustc-env=TIRPC_SERVER_BIN={}", server.display());
            println!("cargo:rustc-env=TIRPC_CLIENT_BIN={}", client.display());
        }
        Err(why) => {
            println!("cargo:warning=libtirpc baseline peer not built: {why}");
            println!("cargo:rustc-env=TIRPC_UNAVAILABLE={why}");
        }
    }
}

/// rpcgen and libtirpc's compile and link flags.
struct Toolchain {
    rpcgen: PathBuf,
    cflags: Vec<String>,
    libs: Vec<String>,
}

/// Finds rpcgen and libtirpc, or says in one line what to install.
fn find_toolchain() -> Result<Toolchain, String> {
    let rpcgen = match env::var_os("RPCGEN") {
        Some(p) => PathBuf::from(p),
        None => find_on_path("rpcgen").unwrap_or_else(|| PathBuf::from("/usr/bin/rpcgen")),
    };
    // Declared even when missing, so that installing it reruns this script.
    println!("cargo:rerun-if-changed={}", rpcgen.display());
    if !rpcgen.is_file() {
        return Err(format!("rpcgen not found: {INSTALL_HINT}"));
    }

    let (cflags, libs) =
        match pkg_config(&["--cflags", "libtirpc"]).zip(pkg_config(&["--libs", "libtirpc"])) {
            Some(flags) => flags,
            None => (
                vec!["-I/usr/include/tirpc".to_owned()],
                vec!["-ltirpc".to_owned()],
            ),
        };
    let include = cflags
        .iter()
        .find_map(|f| f.strip_prefix("-I"))
        .unwrap_or("/usr/include/tirpc");
    let header = Path::new(include).join("rpc").join("rpc.h");
    println!("cargo:rerun-if-changed={}", header.display());
    if !header.is_file() {
        return Err(format!(
            "libtirpc headers not found ({}): {INSTALL_HINT}",
            header.display()
        ));
    }
    Ok(Toolchain {
        rpcgen,
        cflags,
        libs,
    })
}

fn find_on_path(tool: &str) -> Option<PathBuf> {
    let path = env::var_os("PATH")?;
    env::split_paths(&path)
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

/// `pkg-config ARGS` split into words, or None when pkg-config or the
/// package is missing.
fn pkg_config(args: &[&str]) -> Option<Vec<String>> {
    let out = Command::new("pkg-config").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    Some(
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(str::to_owned)
            .collect(),
    )
}

/// Runs rpcgen and the C compiler in `out`; returns the server and client
/// executables. Panics (failing the build) when the tools exist but the
/// build breaks: that is a bug in our C, not a missing package.
fn build_peer(tools: &Toolchain, src: &Path, out: &Path) -> (PathBuf, PathBuf) {
    fs::create_dir_all(out).expect("create OUT_DIR/tirpc");
    // rpcgen names the header in its #include after the input file, so run
    // it inside `out` on a copy with a relative name.
    fs::copy(src.join("bench_prog.x"), out.join("bench_prog.x")).expect("copy bench_prog.x");
    for (flag, file) in [
        ("-h", "bench_prog.h"),
        ("-c", "bench_prog_xdr.c"),
        ("-l", "bench_prog_clnt.c"),
        ("-m", "bench_prog_svc.c"),
    ] {
        let _ = fs::remove_file(out.join(file));
        // -M: thread-safe stubs, results in caller-provided storage.
        run(Command::new(&tools.rpcgen).current_dir(out).args([
            "-M",
            flag,
            "-o",
            file,
            "bench_prog.x",
        ]));
    }

    // Compiler and target flags from the environment (CC, CFLAGS, ...) via
    // the cc crate; always -O2, whatever the Cargo profile: it is a peer
    // under measurement.
    let compiler = cc::Build::new().cargo_warnings(false).get_compiler();
    let compile = |file: &Path, object: &str, own: bool| {
        let mut cmd = compiler.to_command();
        cmd.args(["-std=gnu11", "-O2", "-pthread", "-c"])
            .arg("-I")
            .arg(out)
            .arg("-I")
            .arg(src)
            .args(&tools.cflags);
        if own {
            cmd.args(["-Wall", "-Wextra", "-Werror"]);
        } else {
            cmd.arg("-w");
        }
        run(cmd.arg(file).arg("-o").arg(out.join(object)));
        out.join(object)
    };
    let xdr = compile(&out.join("bench_prog_xdr.c"), "bench_prog_xdr.o", false);
    let clnt = compile(&out.join("bench_prog_clnt.c"), "bench_prog_clnt.o", false);
    let svc = compile(&out.join("bench_prog_svc.c"), "bench_prog_svc.o", false);
    let server_impl = compile(
        &src.join("bench_prog_server_impl.c"),
        "bench_prog_server_impl.o",
        true,
    );
    let client_main = compile(
        &src.join("bench_prog_client.c"),
        "bench_prog_client.o",
        true,
    );

    let link = |name: &str, objects: &[&PathBuf]| {
        let exe = out.join(name);
        let mut cmd = compiler.to_command();
        cmd.arg("-pthread").arg("-o").arg(&exe);
        for o in objects {
            cmd.arg(o);
        }
        run(cmd.args(&tools.libs));
        exe
    };
    let server = link("bench_prog_server", &[&server_impl, &svc, &xdr]);
    let client = link("bench_prog_client", &[&client_main, &clnt, &xdr]);
    (server, client)
}

fn run(cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    if !out.status.success() {
        panic!(
            "{cmd:?} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
