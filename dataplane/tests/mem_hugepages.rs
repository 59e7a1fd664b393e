//! Arenas are hugepage-backed when the host has hugepages reserved, and
//! fall back to 4 KiB pages with exactly one warning line otherwise. The
//! test passes either way, checking whichever path this host takes.
use dataplane::mem::{self, Arena, Backing, HUGEPAGE_WARNING};

fn meminfo(key: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/meminfo").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(key)?.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// KernelPageSize (kB) of the mapping that starts at `addr`, from smaps.
fn kernel_page_kb(addr: usize) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut in_block = false;
    for line in smaps.lines() {
        if let Some((range, _)) = line.split_once(' ') {
            if let Some((start, _)) = range.split_once('-') {
                if start.len() >= 8 && start.chars().all(|c| c.is_ascii_hexdigit()) {
                    in_block = usize::from_str_radix(start, 16).unwrap() == addr;
                    continue;
                }
            }
        }
        if in_block {
            if let Some(v) = line.strip_prefix("KernelPageSize:") {
                return v.trim().trim_end_matches("kB").trim().parse().unwrap();
            }
        }
    }
    panic!("mapping at {addr:#x} not in /proc/self/smaps");
}

const CHILD: &str = "RPCRDMA_HUGEPAGE_CHILD";

/// Child half of `warns_once`: creates three arenas; the parent reads our
/// stderr. Returns at once in a normal run.
#[test]
fn child_three_arenas() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let a: Vec<_> = (0..3).map(|_| Arena::new(2 << 20).unwrap()).collect();
    for arena in &a {
        let kb = kernel_page_kb(arena.as_ptr() as usize);
        assert_eq!(kb, if arena.is_hugepage_backed() { 2048 } else { 4 });
    }
    eprintln!("fallbacks={}", mem::hugepage_fallbacks());
}

#[test]
fn arena_backing_matches_host() {
    let arena = Arena::new(4 << 20).unwrap();
    let kb = kernel_page_kb(arena.as_ptr() as usize);
    if arena.is_hugepage_backed() {
        eprintln!("hugepages available: arena is hugepage-backed");
        assert_eq!(kb, 2048, "smaps must show 2 MiB kernel pages");
        assert_eq!(arena.len() % mem::HUGEPAGE_SIZE, 0);
    } else {
        eprintln!("no free hugepages: checking the 4 KiB fallback path");
        assert_eq!(kb, 4);
        assert!(mem::hugepage_fallbacks() >= 1);
        // Asking for hugepages explicitly must fail cleanly, not fall back
        // (when the host really has none; RPCRDMA_HUGEPAGES=off only
        // affects `Backing::Auto`).
        if meminfo("HugePages_Free:") == 0 {
            assert!(Arena::with_backing(2 << 20, Backing::Huge).is_err());
        }
    }
    // Either way the memory is usable and shareable (sealed memfd).
    // SAFETY: the arena is 4 MiB of mapped, exclusively owned memory.
    let bytes = unsafe { std::slice::from_raw_parts_mut(arena.as_ptr(), arena.len()) };
    bytes[arena.len() - 1] = 0xab;
    assert_eq!(bytes[arena.len() - 1], 0xab);
}

#[test]
fn warns_once_host() {
    check_warnings(false);
}

/// The fallback path even on a host with hugepages (`RPCRDMA_HUGEPAGES=off`).
#[test]
fn warns_once_forced_fallback() {
    assert_eq!(check_warnings(true), 3);
}

fn check_warnings(force_off: bool) -> usize {
    let free = meminfo("HugePages_Free:");
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "child_three_arenas",
        "--exact",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD, "1");
    if force_off {
        cmd.env(mem::HUGEPAGES_ENV, "off");
    } else {
        cmd.env_remove(mem::HUGEPAGES_ENV);
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let warnings = stderr
        .lines()
        .filter(|l| l.contains(HUGEPAGE_WARNING))
        .count();
    let fallbacks: usize = stderr
        .lines()
        .find_map(|l| l.strip_prefix("fallbacks="))
        .expect("child output")
        .parse()
        .unwrap();
    if fallbacks == 0 {
        assert_eq!(warnings, 0, "no warning when hugepages back every arena");
    } else {
        assert_eq!(
            warnings, 1,
            "exactly one warning line for {fallbacks} fallbacks ({free} hugepages were free)"
        );
        assert!(
            HUGEPAGE_WARNING.contains("nr_hugepages"),
            "the warning says how to fix it"
        );
    }
    fallbacks
}
