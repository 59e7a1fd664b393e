//! Configuration: the shipped configs load, the defaults are the default
//! file, and every bad file fails with exactly `FILE:LINE: message` and
//! exit code 2 from the real binary.

mod support;

use control::config::{Config, HostFacts, Hugepages, IdleStrategy, ProviderUrl};
use support::{run, scratch_dir, write_file};

const DEFAULT_TOML: &str = include_str!("../../configs/default.toml");
const DEDICATED_TOML: &str = include_str!("../../configs/dedicated-node.toml");

fn host(cores: usize) -> HostFacts {
    HostFacts {
        cores: (0..cores).collect(),
    }
}

#[test]
fn default_toml_is_config_default() {
    let parsed = Config::parse(DEFAULT_TOML, "configs/default.toml", &host(1)).unwrap();
    assert_eq!(parsed, Config::default());
    // And every key is spelled out: an empty file is the same config.
    assert_eq!(Config::parse("", "empty.toml", &host(1)).unwrap(), parsed);
    assert_eq!(parsed.workers.cores, vec![0]);
    assert_eq!(parsed.workers.idle, IdleStrategy::Adaptive);
    assert!(matches!(parsed.listeners[0].url, ProviderUrl::Shm { .. }));
    assert!(parsed.metrics.address.ip().is_loopback());
}

#[test]
fn dedicated_node_toml_loads_on_its_machine() {
    let c = Config::parse(DEDICATED_TOML, "configs/dedicated-node.toml", &host(8)).unwrap();
    assert_eq!(c.workers.cores, vec![2, 3, 4, 5]);
    assert_eq!(c.workers.idle, IdleStrategy::Spin);
    assert_eq!(c.memory.hugepages, Hugepages::Required);
    assert_eq!(c.listeners.len(), 4);
    assert!(matches!(c.listeners[0].url, ProviderUrl::Roce(_)));
    assert!(matches!(c.listeners[1].url, ProviderUrl::Ibverbs(_)));
    assert!(matches!(c.listeners[2].url, ProviderUrl::Tcp(_)));
}

/// `--check-config FILE`: (exit code, stdout, stderr).
fn check(path: &str) -> (Option<i32>, String, String) {
    run(&["--check-config", path])
}

/// The second line of a good check: what it could not check.
fn not_checked_line(out: &str) -> &str {
    out.lines().nth(1).unwrap_or("")
}

#[test]
fn shipped_configs_pass_check_config_where_the_host_allows() {
    let (code, out, err) = check("../configs/default.toml");
    assert_eq!(code, Some(0), "stderr: {err}");
    assert_eq!(
        out,
        "../configs/default.toml: ok (1 worker(s), 1 listener(s))\n\
         ../configs/default.toml: not checked: that the ports are free to bind, that rpcbind \
         answers at 127.0.0.1:111, that hugepages are still free at start\n"
    );

    // Every other shipped file but dedicated-node.toml (written for a
    // bigger machine with RDMA devices) is meant to pass anywhere.
    let mut checked = 0;
    for entry in std::fs::read_dir("../configs").unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        if !name.ends_with(".toml") || name == "dedicated-node.toml" {
            continue;
        }
        let (code, out, err) = check(path.to_str().unwrap());
        assert_eq!(code, Some(0), "{name}: {err}");
        assert_eq!(out.lines().count(), 2, "{name}: {out}");
        assert!(
            out.lines().next().unwrap().contains(": ok ("),
            "{name}: {out}"
        );
        assert!(
            not_checked_line(&out).contains(": not checked: "),
            "{name}: {out}"
        );
        checked += 1;
    }
    assert!(checked >= 2, "configs/ has default.toml and loopback.toml");

    // dedicated-node.toml wants cores 2-5 (a problem of the file here:
    // exit 2), an RDMA device and its own addresses (problems of the host:
    // exit 1): one FILE:LINE line per problem, unless this is that
    // machine.
    let (code, out, err) = check("../configs/dedicated-node.toml");
    if code == Some(0) {
        assert!(out.contains(": ok (4 worker(s), 4 listener(s))\n"), "{out}");
    } else {
        assert!(matches!(code, Some(1 | 2)), "{code:?}: {out}{err}");
        assert!(!err.is_empty());
        for line in err.lines() {
            assert!(
                line.starts_with("../configs/dedicated-node.toml:"),
                "{line}"
            );
        }
        let fits = HostFacts::current()
            .cores
            .iter()
            .filter(|c| (2..=5).contains(*c))
            .count()
            == 4;
        if !fits {
            assert!(
                err.starts_with("../configs/dedicated-node.toml:8: workers.cores: core "),
                "{err}"
            );
            assert_eq!(err.lines().count(), 1, "{err}");
        }
    }
}

#[test]
fn check_config_refuses_an_ibverbs_listener_this_build_cannot_serve() {
    let dir = scratch_dir("check-ibverbs");
    let cfg = write_file(
        &dir,
        "c.toml",
        "[[listeners]]\nurl = \"shm:///tmp/never-bound.sock\"\n\n[[listeners]]\n\
         url = \"ibverbs://127.0.0.1:20049\"\n\n[rpcbind]\nregister = false\n",
    );
    let cfg = cfg.to_str().unwrap();
    let (code, out, err) = check(cfg);
    #[cfg(feature = "ibverbs")]
    if code == Some(0) {
        println!("skipped: this host has an RDMA device for 127.0.0.1");
        return;
    }
    assert_eq!(code, Some(1), "{out}{err}");
    assert_eq!(out, "");
    assert_eq!(err.lines().count(), 1, "{err}");
    let head = format!("{cfg}:5: cannot listen on ibverbs://127.0.0.1:20049 (listeners[1].url): ");
    assert!(err.starts_with(&head), "{err}");
    #[cfg(not(feature = "ibverbs"))]
    assert!(err.contains("built without the `ibverbs` feature"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn check_config_refuses_addresses_not_on_this_host_naming_each() {
    // 198.18.0.0/15 is for benchmarking networks: never assigned here.
    // The address is only looked up among this host's interfaces.
    let dir = scratch_dir("check-foreign");
    let cfg = write_file(
        &dir,
        "c.toml",
        "[[listeners]]\nurl = \"tcp://198.18.0.1:2049\"\n\n[[listeners]]\n\
         url = \"roce://127.0.0.1:20049\"\n\n[metrics]\naddress = \"198.18.0.1:9464\"\n",
    );
    let cfg = cfg.to_str().unwrap();
    let (code, out, err) = check(cfg);
    assert_eq!(code, Some(1), "{out}{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 2, "{err}");
    assert!(
        lines[0].starts_with(&format!(
            "{cfg}:2: cannot listen on tcp://198.18.0.1:2049 (listeners[0].url): address \
             198.18.0.1 is not usable on this host: it is not assigned to any interface"
        )),
        "{err}"
    );
    assert!(
        lines[1].starts_with(&format!(
            "{cfg}:8: cannot serve metrics on 198.18.0.1:9464 (metrics.address): address \
             198.18.0.1 is not usable on this host"
        )),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn check_config_of_a_good_file_is_ok_and_names_what_it_did_not_check() {
    let dir = scratch_dir("check-good");
    // A socket directory that does not exist yet: checking does not make it.
    let sock_dir = dir.join("not-yet");
    let cfg = write_file(
        &dir,
        "c.toml",
        &format!(
            "[[listeners]]\nurl = \"shm://{}/d.sock\"\n\n[[listeners]]\n\
             url = \"tcp://0.0.0.0:2049\"\n\n[rpcbind]\nregister = false\n\n\
             [memory]\nhugepages = \"off\"\n",
            sock_dir.display()
        ),
    );
    let cfg = cfg.to_str().unwrap();
    let (code, out, err) = check(cfg);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        out,
        format!(
            "{cfg}: ok (1 worker(s), 2 listener(s))\n\
             {cfg}: not checked: that the ports are free to bind\n"
        )
    );
    assert!(!sock_dir.exists(), "--check-config created {sock_dir:?}");

    // A socket directory that cannot be created: one line naming it.
    let file = write_file(&dir, "a-file", "");
    let bad = write_file(
        &dir,
        "bad.toml",
        &format!(
            "[[listeners]]\nurl = \"shm://{}/sub/d.sock\"\n\n[metrics]\nenabled = false\n",
            file.display()
        ),
    );
    let bad = bad.to_str().unwrap();
    let (code, _, err) = check(bad);
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(
        err,
        format!(
            "{bad}:2: cannot listen on shm://{f}/sub/d.sock (listeners[0].url): cannot create \
             directory {f}/sub: {f} is not a directory\n",
            f = file.display()
        )
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// (name, file text, line, message) of every bad config.
fn bad_configs() -> Vec<(&'static str, String, usize, String)> {
    let usable = {
        let mut v = HostFacts::current().cores;
        v.sort_unstable();
        v
    };
    let usable_text = {
        // Same rendering as the daemon: ranges of consecutive ids.
        let mut parts = Vec::new();
        let mut i = 0;
        while i < usable.len() {
            let start = usable[i];
            while i + 1 < usable.len() && usable[i + 1] == usable[i] + 1 {
                i += 1;
            }
            parts.push(if usable[i] == start {
                start.to_string()
            } else {
                format!("{start}-{}", usable[i])
            });
            i += 1;
        }
        parts.join(",")
    };
    vec![
        (
            "unknown-key",
            "[workers]\ncores = [0]\n\n[metrics]\naddress = \"127.0.0.1:9464\"\nport = 9\n".into(),
            6,
            "unknown field `port`, expected `enabled` or `address`".into(),
        ),
        (
            "unknown-section",
            "# a comment\n[worker]\ncores = [0]\n".into(),
            2,
            "unknown field `worker`, expected one of `workers`, `listeners`, `transport`, \
             `chunks`, `memory`, `rpcbind`, `metrics`, `shm`, `shutdown`"
                .into(),
        ),
        (
            "credits-zero",
            "[transport]\ninline_send = 4096\ncredits = 0\n".into(),
            3,
            "transport.credits = 0 is out of range 1..=4096".into(),
        ),
        (
            "inline-too-small",
            "[transport]\ninline_receive = 512\n".into(),
            2,
            "transport.inline_receive = 512 is out of range 1024..=65536".into(),
        ),
        (
            "inline-too-large",
            "[transport]\n\ninline_send = 65537\n".into(),
            3,
            "transport.inline_send = 65537 is out of range 1024..=65536".into(),
        ),
        (
            "unknown-scheme",
            "[[listeners]]\nurl = \"shm:///run/a.sock\"\n\n[[listeners]]\nurl = \"iwarp://127.0.0.1:20049\"\n".into(),
            5,
            "unknown listener scheme `iwarp` in `iwarp://127.0.0.1:20049`: expected shm, roce, \
             ibverbs or tcp"
                .into(),
        ),
        (
            "unparsable-url",
            "[[listeners]]\nurl = \"roce://localhost:20049\"\n".into(),
            2,
            "listener URL `roce://localhost:20049`: `localhost:20049` is not IP:PORT (IPv6 as \
             [ADDR]:PORT; host names are not resolved)"
                .into(),
        ),
        (
            "relative-shm-path",
            "[[listeners]]\nurl = \"shm://rpcrdmad.sock\"\n".into(),
            2,
            "listener URL `shm://rpcrdmad.sock`: shm needs an absolute socket path, e.g. \
             shm:///run/rpcrdma/rpcrdmad.sock"
                .into(),
        ),
        (
            "duplicate-listener",
            "[[listeners]]\nurl = \"roce://127.0.0.1:20049\"\n[[listeners]]\nurl = \"roce://127.0.0.1:20049\"\n".into(),
            4,
            "listener roce://127.0.0.1:20049 is listed twice".into(),
        ),
        (
            "core-beyond-host",
            "[workers]\ncores = [\n  0,\n  4096,\n]\n".into(),
            4,
            format!(
                "workers.cores: core 4096 is not available on this host (usable cores: {usable_text})"
            ),
        ),
        (
            "no-cores",
            "[workers]\nidle = \"spin\"\ncores = []\n".into(),
            3,
            "workers.cores is empty: list at least one CPU id".into(),
        ),
        (
            "bad-idle",
            "[workers]\nidle = \"lazy\"\n".into(),
            2,
            "unknown idle strategy `lazy`: expected \"spin\" or \"adaptive\"".into(),
        ),
        (
            "bad-hugepages",
            "[memory]\nhugepages = true\n".into(),
            2,
            "invalid type: boolean `true`, expected a string".into(),
        ),
        (
            "bad-hugepages-value",
            "[memory]\nhugepages = \"on\"\n".into(),
            2,
            "unknown hugepages policy `on`: expected \"off\", \"prefer\" or \"required\"".into(),
        ),
        (
            "wrong-type",
            "[transport]\ncredits = \"many\"\n".into(),
            2,
            "invalid type: string \"many\", expected u32".into(),
        ),
        (
            "bad-metrics-address",
            "[metrics]\naddress = \"localhost:9464\"\n".into(),
            2,
            "`localhost:9464` is not IP:PORT (IPv6 as [ADDR]:PORT; host names are not resolved)"
                .into(),
        ),
        (
            "bad-rpcbind-address",
            "[rpcbind]\naddress = \"rpcbind.local\"\n".into(),
            2,
            "`rpcbind.local` is not an rpcbind address: expected IP:PORT (e.g. 127.0.0.1:111) \
             or an absolute socket path (e.g. /run/rpcbind.sock)"
                .into(),
        ),
        (
            "syntax-error",
            "[workers]\ncores = [0\n".into(),
            2,
            String::new(), // the parser's wording; only the location is pinned
        ),
    ]
}

#[test]
fn bad_configs_fail_with_file_line_message_in_the_library() {
    let host = HostFacts::current();
    for (name, text, line, message) in bad_configs() {
        let file = format!("{name}.toml");
        let err = Config::parse(&text, &file, &host).expect_err(name);
        assert_eq!(err.line, Some(line), "{name}: {err}");
        if !message.is_empty() {
            assert_eq!(
                err.to_string(),
                format!("{file}:{line}: {message}"),
                "{name}"
            );
        }
        assert!(!err.to_string().contains('\n'), "{name}: {err}");
    }
}

#[test]
fn bad_configs_exit_2_with_one_line_from_the_binary() {
    let dir = scratch_dir("bad-configs");
    for (name, text, line, message) in bad_configs() {
        let path = write_file(&dir, &format!("{name}.toml"), &text);
        let path = path.to_str().unwrap();
        for flag in ["--check-config", "--config"] {
            let (code, out, err) = run(&[flag, path]);
            assert_eq!(code, Some(2), "{name} {flag}: stderr {err}");
            assert_eq!(out, "", "{name} {flag}");
            assert_eq!(err.lines().count(), 1, "{name} {flag}: {err}");
            let prefix = format!("{path}:{line}: ");
            assert!(err.starts_with(&prefix), "{name} {flag}: {err}");
            if !message.is_empty() {
                assert_eq!(err, format!("{prefix}{message}\n"), "{name} {flag}");
            }
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn missing_config_file_is_one_line_exit_2() {
    let (code, _, err) = run(&["--config", "/nonexistent/rpcrdmad.toml"]);
    assert_eq!(code, Some(2));
    assert_eq!(
        err,
        "/nonexistent/rpcrdmad.toml: cannot read the configuration: No such file or directory \
         (os error 2)\n"
    );
}

#[test]
fn config_and_check_config_conflict() {
    let (code, _, err) = run(&["--config", "a.toml", "--check-config", "b.toml"]);
    assert_eq!(code, Some(2), "{err}");
}
