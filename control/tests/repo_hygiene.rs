//! The repository stands alone: nothing in it points at planning notes that
//! live outside it, or at tracker issue numbers, which users of the
//! repository do not have. Every text file is scanned (build output, git
//! data, fuzz corpora and binary files excepted); each hit is listed as
//! `file:line: text`.
//!
//! It is also layered: in `dataplane/src/wire`, `dataplane/src/engine`,
//! `dataplane/src/verbs/roce`, `dataplane/src/tcp` and `bench/src`, no two
//! sibling files use each other's items (see
//! [`no_import_circles_between_sibling_files`]). And memory a peer can write
//! is never made a Rust slice
//! ([`memory_a_peer_can_write_is_never_made_a_slice`]).

use std::path::{Path, PathBuf};

/// Literal fragments that must not appear (built from pieces, so that this
/// file does not trip on itself).
fn forbidden_literals() -> Vec<String> {
    vec![
        ["..", "/shared"].concat(),
        ["shared", "/reference"].concat(),
        ["DESIGN", ".md"].concat(),
        // The notes on RoCE/rxe and on peers' wire habits that sat beside
        // the planning document: cite IBTA Vol. 1, the Linux source file
        // or the RFC they summarise instead.
        ["ROCE", "-NOTES"].concat(),
        ["WIRE", "-NOTES"].concat(),
    ]
}

/// A tracker word (any case, optionally plural, starting a word), or a
/// section of the outside planning notes, followed by an optional space,
/// dash or '#' and then a digit.
fn numbered_reference(line: &str) -> Option<&'static str> {
    const WORDS: [(&str, &str, bool); 2] =
        [("issue", "issue", true), ("DESIGN s", "DESIGN", false)];
    for (word, name, fold) in WORDS {
        let hay = if fold {
            line.to_ascii_lowercase()
        } else {
            line.to_string()
        };
        let mut from = 0;
        while let Some(at) = hay[from..].find(word).map(|i| i + from) {
            from = at + word.len();
            // "reissue 2" is a word of its own, not a tracker item.
            if fold && hay[..at].ends_with(|c: char| c.is_ascii_alphanumeric()) {
                continue;
            }
            let after = &hay[from..];
            let after = if fold {
                after.strip_prefix('s').unwrap_or(after)
            } else {
                after
            };
            let after = after
                .strip_prefix(' ')
                .or_else(|| after.strip_prefix('-'))
                .unwrap_or(after);
            let after = after.strip_prefix('#').unwrap_or(after);
            if after.starts_with(|c: char| c.is_ascii_digit()) {
                return Some(name);
            }
        }
    }
    None
}

fn skipped(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    name == ".git"
        || name.starts_with("target")
        || path.ends_with("fuzz/corpus")
        || path.ends_with("fuzz/artifacts")
        || path.ends_with("fuzz/coverage")
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        if skipped(&path) {
            continue;
        }
        match e.file_type() {
            Ok(t) if t.is_dir() => walk(&path, out),
            Ok(t) if t.is_file() => out.push(path),
            _ => {}
        }
    }
}

#[test]
fn no_references_outside_the_repository_or_to_issue_numbers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    walk(&root, &mut files);
    assert!(
        files.len() > 50,
        "the walk found only {} files",
        files.len()
    );
    let literals = forbidden_literals();
    let mut hits = Vec::new();
    for f in &files {
        // Binary files (captures, images) are not text.
        let Ok(text) = std::fs::read_to_string(f) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            let bad = literals.iter().any(|l| line.contains(l.as_str()))
                || numbered_reference(line).is_some();
            if bad {
                let shown = f.strip_prefix(&root).unwrap_or(f).display();
                hits.push(format!("{shown}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        hits.is_empty(),
        "references users do not have (say it in the repository's own words, or cite the RFC):\n{}",
        hits.join("\n")
    );
}

#[test]
fn the_scanner_finds_what_it_must() {
    let literals = forbidden_literals();
    assert!(literals
        .iter()
        .any(|l| ["see ROCE", "-NOTES s4"].concat().contains(l.as_str())));
    assert!(numbered_reference(&["see issue", " 6"].concat()).is_some());
    assert!(numbered_reference(&["every issue", "-6 target"].concat()).is_some());
    assert!(numbered_reference(&["(DESIGN", " s4)"].concat()).is_some());
    assert!(numbered_reference(&["Tracker ISS", "UE 4"].concat()).is_some());
    assert!(numbered_reference(&["(issue", "s 4 and 5)"].concat()).is_some());
    assert!(numbered_reference(&["issue", " #12"].concat()).is_some());
    assert!(numbered_reference("the issue of ordering").is_none());
    assert!(numbered_reference("reissue 2 Reads").is_none());
    assert!(numbered_reference("an issue: 4 bytes").is_none());
    assert!(numbered_reference("RDMA Reads still to issue, oldest first").is_none());
}

// ---------------------------------------------------------------------------
// No import circles between the files of one module

/// Directories whose `.rs` files must not form import circles, with the
/// paths (besides `super::`) by which a file there names a sibling file's
/// module. In `bench/src`, `crate::` is the library root for the library's
/// modules and the binary's root for `floor` and `targets`, which reach
/// the library as `bench::`.
const LAYERED_DIRS: [(&str, &[&str]); 5] = [
    ("dataplane/src/wire", &["crate::wire::"]),
    ("dataplane/src/engine", &["crate::engine::"]),
    ("dataplane/src/verbs/roce", &["crate::verbs::roce::"]),
    ("dataplane/src/tcp", &["crate::tcp::"]),
    ("bench/src", &["crate::", "bench::"]),
];

/// Engine files that use each other's items on purpose: `impl Connection`
/// is split across them (state in `connection.rs`, each role's methods in
/// its own file, message continuation's receiving side in
/// `continuation.rs`), so they are one unit, not layers.
const ONE_UNIT: [&str; 5] = [
    "connection",
    "requester",
    "responder",
    "msgp",
    "continuation",
];

/// `text` without `//` comments (doc comments included: an intra-doc link
/// is not an import). Naive about `//` inside string literals, which at
/// worst hides a use, never invents one.
fn without_comments(text: &str) -> String {
    text.lines()
        .map(|l| l.find("//").map_or(l, |at| &l[..at]))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The leading identifier of `s`.
fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The names in `siblings` that `text` reaches through one of `prefixes`:
/// `prefix NAME` (`super::xdr::Decoder`, `crate::driver::drive(..)`, `use
/// crate::spec;`) or a group `prefix {.., NAME::X, NAME, ..}`. A prefix
/// counts only at the start of a path (`super::super::x` does not contain
/// `super::x`).
fn sibling_uses<'a>(text: &str, prefixes: &[String], siblings: &[&'a str]) -> Vec<&'a str> {
    let text = without_comments(text);
    let mut found = Vec::new();
    let mut add = |name: &str| {
        if let Some(s) = siblings.iter().find(|s| **s == name) {
            if !found.contains(s) {
                found.push(*s);
            }
        }
    };
    for prefix in prefixes {
        for (at, _) in text.match_indices(prefix.as_str()) {
            let before = text[..at].chars().next_back();
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let rest = text[at + prefix.len()..].trim_start();
            let Some(group) = rest.strip_prefix('{') else {
                add(ident(rest));
                continue;
            };
            // The top-level items of the group, up to its closing brace.
            let mut depth = 0usize;
            let mut item_start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if c.is_whitespace() => {}
                    _ if item_start && depth == 0 => {
                        add(ident(&group[i..]));
                        item_start = false;
                    }
                    _ => {}
                }
            }
        }
    }
    found
}

/// The `.rs` files of `dir` (not recursing), by module name, each with
/// the files of its child modules (`roce.rs` with `roce/**.rs`). The
/// parent files (`mod.rs`, `lib.rs`, `main.rs`) are no one's sibling.
fn sibling_files(dir: &Path) -> Vec<(String, Vec<(PathBuf, usize)>)> {
    let mut mods = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return mods;
    };
    for e in entries.flatten() {
        let path = e.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Some(stem) = name.strip_suffix(".rs") else {
            continue;
        };
        if ["mod", "lib", "main"].contains(&stem) || !path.is_file() {
            continue;
        }
        let mut files = vec![(path.clone(), 0)];
        let mut children = Vec::new();
        walk(&dir.join(stem), &mut children);
        for c in children {
            if c.extension().is_some_and(|x| x == "rs") {
                // Depth below `dir`: how many `super::` reach `dir`'s module.
                let depth = c
                    .strip_prefix(dir)
                    .map_or(1, |r| r.components().count() - 1);
                files.push((c, depth));
            }
        }
        mods.push((stem.to_string(), files));
    }
    mods.sort();
    mods
}

/// Every pair of sibling files in `dir` that use each other's items, as
/// `a <-> b` lines with one example use each way.
fn import_circles(root: &Path, dir: &str, paths: &[&str]) -> Vec<String> {
    let mods = sibling_files(&root.join(dir));
    let names: Vec<&str> = mods.iter().map(|(n, _)| n.as_str()).collect();
    // uses[i]: the siblings module i uses, with the file that does.
    let mut uses: Vec<Vec<(&str, String)>> = Vec::new();
    for (name, files) in &mods {
        let others: Vec<&str> = names.iter().copied().filter(|n| n != name).collect();
        let mut seen = Vec::new();
        for (file, depth) in files {
            let Ok(text) = std::fs::read_to_string(file) else {
                continue;
            };
            let mut prefixes = vec!["super::".repeat(depth + 1)];
            prefixes.extend(paths.iter().map(|p| p.to_string()));
            for s in sibling_uses(&text, &prefixes, &others) {
                if !seen.iter().any(|(n, _)| *n == s) {
                    let shown = file.strip_prefix(root).unwrap_or(file).display();
                    seen.push((s, shown.to_string()));
                }
            }
        }
        uses.push(seen);
    }
    let mut circles = Vec::new();
    for (i, a) in names.iter().enumerate() {
        for (b, a_file) in &uses[i] {
            let j = names.iter().position(|n| n == b).expect("a sibling");
            let Some((_, b_file)) = uses[j].iter().find(|(n, _)| n == a) else {
                continue;
            };
            let one_unit =
                dir == "dataplane/src/engine" && ONE_UNIT.contains(a) && ONE_UNIT.contains(b);
            if a < b && !one_unit {
                circles.push(format!(
                    "{dir}: {a} <-> {b} ({a_file} uses {b}, {b_file} uses {a})"
                ));
            }
        }
    }
    circles
}

/// Files of one module are layered: when `a.rs` uses items of its sibling
/// `b.rs`, `b.rs` does not use items of `a.rs`. An item both need goes to
/// the lower one or to a small module of its own (re-exported from the old
/// place if other crates name it there).
#[test]
fn no_import_circles_between_sibling_files() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut circles = Vec::new();
    for (dir, paths) in LAYERED_DIRS {
        assert!(
            sibling_files(&root.join(dir)).len() > 3,
            "{dir}: too few files found"
        );
        circles.extend(import_circles(&root, dir, paths));
    }
    assert!(
        circles.is_empty(),
        "sibling files that use each other (move the shared item down):\n{}",
        circles.join("\n")
    );
}

#[test]
fn the_circle_scanner_finds_what_it_must() {
    let sibs = ["conf2", "rtrext", "xdr", "roce", "ibcm"];
    let p = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let top = p(&["super::", "crate::wire::"]);
    let text = "use super::conf2::Extensions;\n\
                use super::{\n    xdr::{Decoder, Encoder},\n    Error,\n};\n\
                fn f(d: &[u8]) { crate::wire::roce::fuzz_parse(d) }\n\
                // super::ibcm::fuzz_parse(d) is only a comment\n\
                /// [`super::ibcm`] is only a doc link\n";
    let mut found = sibling_uses(text, &top, &sibs);
    found.sort();
    assert_eq!(found, ["conf2", "roce", "xdr"]);
    assert_eq!(
        sibling_uses("use super::{rtrext, Result};", &top, &sibs),
        ["rtrext"]
    );
    // One level down (`roce/tests.rs`), `super::` is the file's own module.
    let below = p(&["super::super::", "crate::wire::"]);
    assert!(sibling_uses("use super::xdr;", &below, &sibs).is_empty());
    assert_eq!(
        sibling_uses("use super::super::xdr;", &below, &sibs),
        ["xdr"]
    );
    assert!(sibling_uses("use super::super::super::xdr;", &below, &sibs).is_empty());
}

/// Where the dataplane may turn a raw pointer into a Rust slice, and why.
/// Memory a peer can write (registered memory, receive buffers, RDMA
/// targets) must never become a `&[u8]`: a slice promises that nothing
/// changes the bytes while it lives, which a peer can break. It is read by
/// copying (`mem::copy_out`, `mem::PeerBytes`). Each entry: a file, and a
/// fragment every such line in it must contain.
const RAW_SLICES_ALLOWED: [(&str, &str, &str); 10] = [
    (
        "dataplane/src/engine/fuzz.rs",
        "Box::from_raw",
        "the fuzz harness taking back a region it leaked for a connection now dropped (no peer exists)",
    ),
    (
        "dataplane/src/tcp/buf.rs",
        "from_raw_parts",
        "the TCP ring: heap memory of this process only",
    ),
    (
        "dataplane/src/engine/heap.rs",
        "Box::from_raw",
        "freeing the engine's own heap region",
    ),
    (
        "dataplane/src/verbs/shm/mod.rs",
        "AtomicU64",
        "shared rings and key tables: atomics, sound under concurrent writes",
    ),
    (
        "dataplane/src/verbs/shm/shared.rs",
        "AtomicU64",
        "the shared outbox: atomics",
    ),
    (
        "dataplane/src/verbs/ibverbs/sys.rs",
        "self.list",
        "a device list the library allocated for us",
    ),
    (
        "dataplane/src/verbs/ibverbs/translate.rs",
        ".to_vec()",
        "private data the CM owns, copied at once",
    ),
    (
        "dataplane/src/worker/endpoint.rs",
        "self.arena.as_ptr(), self.len",
        "ArenaSlab: the engine's private region, which peers can at most read",
    ),
    (
        "dataplane/src/engine/buffers.rs",
        "(p, d.len as usize)",
        "a bulk pool buffer leased to this connection alone: private memory, never exposed",
    ),
    (
        "dataplane/src/verbs/roce/io.rs",
        "from_raw_parts(e.addr as *const u8",
        "a roce payload sent from where it lies, for its ICRC: memory no peer may write (Arena::peer_may_write), owned by its work request until the batch leaves",
    ),
];

/// Lines of `dataplane/src` (tests excepted) that make a slice from a raw
/// pointer, outside what [`RAW_SLICES_ALLOWED`] allows.
fn unexpected_raw_slices(root: &Path) -> Vec<String> {
    let mut files = Vec::new();
    walk(&root.join("dataplane/src"), &mut files);
    let mut hits = Vec::new();
    for f in files {
        let rel = f
            .strip_prefix(root)
            .unwrap_or(&f)
            .to_string_lossy()
            .replace('\\', "/");
        if !rel.ends_with(".rs") || rel.ends_with("tests.rs") || rel.contains("/tests/") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&f) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if !code.contains("from_raw_parts") && !code.contains("Box::from_raw") {
                continue;
            }
            let allowed = RAW_SLICES_ALLOWED
                .iter()
                .any(|(file, must, _)| rel == *file && code.contains(must));
            if !allowed {
                hits.push(format!("{rel}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    hits
}

/// The compile-time half is in the types: `mem::Buf`, `engine::PeerMemory`
/// and `mem::PeerBytes` have no method that returns a slice. This is the
/// other half: no code makes one from a raw pointer except where the
/// memory is this process's own or the elements are atomics.
#[test]
fn memory_a_peer_can_write_is_never_made_a_slice() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let hits = unexpected_raw_slices(&root);
    assert!(
        hits.is_empty(),
        "slices made from raw pointers outside the allowed places (copy peer memory out with \
         mem::copy_out / mem::PeerBytes instead, or add the place to RAW_SLICES_ALLOWED with \
         the reason it is this process's own memory):\n{}",
        hits.join("\n")
    );
    for (file, _, why) in RAW_SLICES_ALLOWED {
        assert!(root.join(file).exists(), "{file} ({why}) moved");
    }
}
