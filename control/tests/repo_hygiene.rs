//! The repository stands alone: nothing in it points at planning notes that
//! live outside it, or at tracker issue numbers, which users of the
//! repository do not have. Every text file is scanned (build output, git
//! data, fuzz corpora and binary files excepted); each hit is listed as
//! `file:line: text`.

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
