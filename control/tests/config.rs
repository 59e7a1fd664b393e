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

#[test]
fn shipped_configs_pass_check_config_where_the_host_allows() {
    // A second line says what a check cannot know.
    for (file, summary) in [
        ("../configs/default.toml", "ok (1 worker(s), 1 listener(s))"),
        (
            "../configs/loopback.toml",
            "ok (1 worker(s), 3 listener(s))",
        ),
        ("../configs/gateway.toml", "ok (1 worker(s), 2 listener(s))"),
    ] {
        let (code, out, err) = run(&["--check-config", file]);
        assert_eq!(code, Some(0), "{file}: stderr: {err}");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 2, "{out}");
        assert_eq!(lines[0], format!("{file}: {summary}"));
        assert!(
            lines[1].starts_with(&format!("{file}: not checked ")),
            "{out}"
        );
    }

    // dedicated-node.toml wants cores 2-5: fine on a big node, a one-line
    // error naming the cores line on a small one.
    let (code, out, err) = run(&["--check-config", "../configs/dedicated-node.toml"]);
    if HostFacts::current()
        .cores
        .iter()
        .filter(|c| (2..=5).contains(*c))
        .count()
        == 4
    {
        assert_eq!(code, Some(0), "stderr: {err}");
        assert!(out.contains(": ok (4 worker(s), 4 listener(s))\n"), "{out}");
    } else {
        assert_eq!(code, Some(2));
        assert!(
            err.starts_with("../configs/dedicated-node.toml:8: workers.cores: core "),
            "{err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}

#[test]
fn transport_extensions_parse_by_name() {
    use dataplane::engine::Extensions;
    let c = Config::parse("", "empty.toml", &host(1)).unwrap();
    assert!(c.transport.extensions.is_empty());
    assert_eq!(c.transport.extension_set(), Extensions::EMPTY);
    let text = "[transport]\nextensions = [\"message_continuation\", \"responder_read_chunks\", \
                \"remote_invalidate\", \"send_placement\"]\n";
    let c = Config::parse(text, "all.toml", &host(1)).unwrap();
    assert_eq!(c.transport.extension_set(), Extensions::ALL);
    let c = Config::parse(
        "[transport]\nextensions = [\"remote_invalidate\"]\n",
        "one.toml",
        &host(1),
    )
    .unwrap();
    assert_eq!(c.transport.extension_set(), Extensions::REMOTE_INVALIDATE);
    // The daemon's connections advertise them (as far as the engine
    // implements them).
    let engine = control::serve::endpoint_config(&c).engine;
    assert_eq!(engine.extensions, Extensions::REMOTE_INVALIDATE);
    assert!(engine.serve_conf_rdma);
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
             `chunks`, `memory`, `rpcbind`, `metrics`, `shm`, `shutdown`, `control`, `log`, `gateway`"
                .into(),
        ),
        (
            "bulk-buffers-too-many",
            "[workers]\ncores = [0]\nbulk_buffers = 65537\n".into(),
            3,
            "workers.bulk_buffers = 65537 is out of range 0..=65536".into(),
        ),
        (
            "bulk-pool-over-4-gib",
            "[workers]\nbulk_buffers = 8192\n\n[transport]\nmax_message = 1052672\n".into(),
            2,
            "workers.bulk_buffers = 8192 of transport.max_message = 1052672 bytes is 8224 MiB per worker and provider, over the 4 GiB a registration holds; lower either".into(),
        ),
        (
            "shared-receives-below-connections",
            "[workers]\ncores = [0, 1]\nmax_connections = 1024\nshared_receives = 100\n".into(),
            4,
            "workers.shared_receives = 100 cannot back the 512 connections a worker may hold (workers.max_connections = 1024 over 2 cores; each needs one receive at least); raise it to 1024 or more, or set 0 for receives per connection".into(),
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
            "gateway-program-twice",
            "[[gateway]]\nprogram = 100003\nversions = [3]\nbackend = \"127.0.0.1:2049\"\n\
             [[gateway]]\nprogram = 100003\nversions = [4]\nbackend = \"127.0.0.1:2049\"\n"
                .into(),
            6,
            "gateway: program 100003 is routed twice".into(),
        ),
        (
            "gateway-bad-backend",
            "[[gateway]]\nprogram = 100003\nversions = [3]\nbackend = \"nfs.local:2049\"\n".into(),
            4,
            "backend `nfs.local:2049` is neither IP:PORT nor rpcbind://IP (host names are not \
             resolved)"
                .into(),
        ),
        (
            "gateway-conf-rdma",
            "[[gateway]]\nprogram = 100417\nversions = [1]\nbackend = \"127.0.0.1:2049\"\n".into(),
            2,
            "gateway: program 100417 (CONF_RDMA) is the transport's own; it cannot be relayed"
                .into(),
        ),
        (
            "gateway-no-versions",
            "[[gateway]]\nprogram = 100005\nversions = []\nbackend = \"rpcbind://127.0.0.1\"\n"
                .into(),
            3,
            "gateway: program 100005 lists no versions".into(),
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
            "unknown-extension",
            "[transport]\ncredits = 8\nextensions = [\n  \"remote_invalidate\",\n  \"continuation\",\n]\n"
                .into(),
            5,
            "transport.extensions: unknown extension `continuation`: expected \"responder_read_chunks\", \
             \"remote_invalidate\", \"message_continuation\", \"send_placement\""
                .into(),
        ),
        (
            "extensions-not-a-list",
            "[transport]\nextensions = \"all\"\n".into(),
            2,
            "invalid type: string \"all\", expected a sequence".into(),
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

/// What start would refuse on this host, `--check-config` refuses too,
/// without binding anything: every problem one line naming the file, the
/// line and the key. 198.18.0.0/15 (benchmarking) is never assigned here;
/// nothing is sent to it.
#[test]
fn check_config_finds_what_start_would_refuse_on_this_host() {
    let dir = scratch_dir("check-host");
    let text = "[[listeners]]\nurl = \"tcp://127.0.0.1:20050\"\n\n\
                [[listeners]]\nurl = \"roce://198.18.0.1:20049\"\n\n\
                [metrics]\naddress = \"198.18.0.9:9464\"\n";
    let path = write_file(&dir, "host.toml", text);
    let path = path.to_str().unwrap();
    let (code, out, err) = run(&["--check-config", path]);
    assert_eq!(code, Some(2), "{out}{err}");
    assert_eq!(out, "");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 2, "{err}");
    assert!(
        lines[0].starts_with(&format!("{path}:5: listeners[1].url: "))
            && lines[0].contains("address 198.18.0.1 is not assigned"),
        "{err}"
    );
    assert!(
        lines[1].starts_with(&format!("{path}:8: metrics.address: "))
            && lines[1].contains("198.18.0.9"),
        "{err}"
    );

    // An ibverbs listener in a build without the feature.
    if !cfg!(feature = "ibverbs") {
        let path = write_file(
            &dir,
            "ib.toml",
            "[[listeners]]\nurl = \"ibverbs://127.0.0.1:20049\"\n",
        );
        let path = path.to_str().unwrap();
        let (code, _, err) = run(&["--check-config", path]);
        assert_eq!(code, Some(2), "{err}");
        assert!(
            err.starts_with(&format!("{path}:2: listeners[0].url: ")) && err.contains("ibverbs"),
            "{err}"
        );
    }

    // A live shm socket (this test's own listener) is in use.
    let sock = dir.join("live.sock");
    let url = format!("shm://{}", sock.display());
    use dataplane::verbs::{shm::Shm, Context, Provider};
    let ctx = Shm::open(&url).unwrap();
    let _listener = ctx.listen(&url).unwrap();
    let path = write_file(
        &dir,
        "shm.toml",
        &format!("[[listeners]]\nurl = \"{url}\"\n"),
    );
    let path = path.to_str().unwrap();
    let (code, _, err) = run(&["--check-config", path]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(&format!("in use by process {}", std::process::id())),
        "{err}"
    );

    // Hugepages required, and fewer free than the bulk pools take: one
    // worker, one RDMA provider (two roce listeners share its pool; tcp
    // has none), 4000 buffers of 1 MiB + 4 KiB: 2,008 pages.
    let path = write_file(
        &dir,
        "bulk.toml",
        "[workers]\ncores = [0]\nbulk_buffers = 4000\n\n\
         [[listeners]]\nurl = \"roce://127.0.0.1:20049\"\n\n\
         [[listeners]]\nurl = \"tcp://127.0.0.1:20050\"\n\n\
         [[listeners]]\nurl = \"roce://127.0.0.2:20049\"\n\n\
         [memory]\nhugepages = \"required\"\n",
    );
    let path = path.to_str().unwrap();
    let free = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("HugePages_Free:"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    let (code, _, err) = run(&["--check-config", path]);
    if free == 0 {
        // Refused for the hugepages themselves first.
        assert!(err.contains("memory.hugepages"), "{err}");
    } else if free < 2008 {
        assert_eq!(code, Some(2), "{err}");
        assert!(
            err.starts_with(&format!("{path}:3: workers.bulk_buffers: "))
                && err.contains("need 2008 free 2 MiB hugepages")
                && err.contains(&format!("but {free} are free")),
            "{err}"
        );
    } else {
        assert!(!err.contains("bulk_buffers"), "{err}");
    }
    let _ = std::fs::remove_dir_all(dir);
}
