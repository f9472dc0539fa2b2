//! Unit tests of the file tools' bodies, over a temporary root.

use std::fs;
use std::path::Path;

use serde_json::{json, Value};

use super::jail::Jail;
use super::ops;
use crate::error::{ErrorKind, ToolError};

fn jail(root: &Path, max_bytes: usize, hidden: fn(&str) -> bool) -> Jail {
    Jail {
        dir: cap_std::fs::Dir::open_ambient_dir(root, cap_std::ambient_authority()).unwrap(),
        hidden: std::sync::Arc::new(hidden),
        max_bytes,
    }
}

fn kind(result: Result<Value, ToolError>) -> ErrorKind {
    result.expect_err("the call fails").kind
}

#[test]
fn read_takes_a_line_range_and_a_cap() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("a.txt"), "one\ntwo\nthree\nfour").unwrap();
    let j = jail(dir.path(), 1 << 20, |_| false);
    let all = ops::read(&j, &json!({"path": "a.txt"})).unwrap();
    assert_eq!(all["text"], "one\ntwo\nthree\nfour");
    assert_eq!(all["truncated"], false);
    assert_eq!(
        (all["start_line"].as_u64(), all["end_line"].as_u64()),
        (Some(1), Some(4))
    );
    let mid = ops::read(
        &j,
        &json!({"path": "a.txt", "start_line": 2, "end_line": 3}),
    )
    .unwrap();
    assert_eq!(mid["text"], "two\nthree\n");
    assert_eq!(
        (mid["start_line"].as_u64(), mid["end_line"].as_u64()),
        (Some(2), Some(3))
    );
    let tail = ops::read(&j, &json!({"path": "a.txt", "start_line": 4})).unwrap();
    assert_eq!(tail["text"], "four");
    let past = ops::read(&j, &json!({"path": "a.txt", "start_line": 9})).unwrap();
    assert_eq!(past["text"], "");
    assert_eq!(
        kind(ops::read(
            &j,
            &json!({"path": "a.txt", "start_line": 3, "end_line": 2})
        )),
        ErrorKind::InvalidInput
    );
    assert_eq!(
        kind(ops::read(&j, &json!({"path": "a.txt", "start_line": 0}))),
        ErrorKind::InvalidInput
    );

    // The cap: 5 bytes, cut on a character; `truncated` says so, in both ways of reading.
    let small = jail(dir.path(), 5, |_| false);
    let cut = ops::read(&small, &json!({"path": "a.txt"})).unwrap();
    assert_eq!(cut["text"], "one\nt");
    assert_eq!(
        (
            cut["truncated"].as_bool(),
            cut["bytes"].as_u64(),
            cut["size"].as_u64()
        ),
        (Some(true), Some(5), Some(18))
    );
    let cut = ops::read(&small, &json!({"path": "a.txt", "start_line": 2})).unwrap();
    assert_eq!(
        (cut["text"].as_str(), cut["truncated"].as_bool()),
        (Some("two\nt"), Some(true))
    );
    fs::write(dir.path().join("e.txt"), "ééé").unwrap();
    let cut = ops::read(&small, &json!({"path": "e.txt"})).unwrap();
    assert_eq!(cut["text"], "éé");
    // Exactly the cap is not truncated.
    fs::write(dir.path().join("five"), "12345").unwrap();
    assert_eq!(
        ops::read(&small, &json!({"path": "five"})).unwrap()["truncated"],
        false
    );

    assert_eq!(
        kind(ops::read(&j, &json!({"path": "nope"}))),
        ErrorKind::NotFound
    );
    fs::create_dir(dir.path().join("d")).unwrap();
    assert_eq!(
        kind(ops::read(&j, &json!({"path": "d"}))),
        ErrorKind::InvalidInput
    );
    assert_eq!(
        kind(ops::read(&j, &json!({"path": ""}))),
        ErrorKind::InvalidInput
    );
}

#[test]
fn write_append_edit_delete_and_move() {
    let dir = tempfile::tempdir().unwrap();
    let j = jail(dir.path(), 1 << 20, |_| false);
    let w = ops::write(&j, &json!({"path": "new/deep/f.txt", "content": "hello"})).unwrap();
    assert_eq!(
        w,
        json!({"path": "new/deep/f.txt", "bytes": 5, "created": true})
    );
    let w = ops::write(&j, &json!({"path": "new/deep/f.txt", "content": "hi hi"})).unwrap();
    assert_eq!(w["created"], false);
    let a = ops::append(&j, &json!({"path": "new/deep/f.txt", "content": " ho"})).unwrap();
    assert_eq!(
        (a["bytes"].as_u64(), a["size"].as_u64()),
        (Some(3), Some(8))
    );
    let f = dir.path().join("new/deep/f.txt");
    assert_eq!(fs::read_to_string(&f).unwrap(), "hi hi ho");

    // `old_text` twice, or not at all: a conflict, and the file unchanged.
    let twice = ops::edit(
        &j,
        &json!({"path": "new/deep/f.txt", "old_text": "hi", "new_text": "x"}),
    );
    assert_eq!(kind(twice), ErrorKind::Conflict);
    let none = ops::edit(
        &j,
        &json!({"path": "new/deep/f.txt", "old_text": "zz", "new_text": "x"}),
    );
    assert_eq!(kind(none), ErrorKind::Conflict);
    assert_eq!(fs::read_to_string(&f).unwrap(), "hi hi ho");
    let empty = ops::edit(
        &j,
        &json!({"path": "new/deep/f.txt", "old_text": "", "new_text": "x"}),
    );
    assert_eq!(kind(empty), ErrorKind::InvalidInput);
    let e = ops::edit(
        &j,
        &json!({"path": "new/deep/f.txt", "old_text": "ho", "new_text": "hum!"}),
    )
    .unwrap();
    assert_eq!(
        (e["line"].as_u64(), e["size"].as_u64()),
        (Some(1), Some(10))
    );
    assert_eq!(fs::read_to_string(&f).unwrap(), "hi hi hum!");
    // Overlapping occurrences count: `aa` is twice in `aaa`.
    fs::write(dir.path().join("aaa"), "aaa").unwrap();
    assert_eq!(
        kind(ops::edit(
            &j,
            &json!({"path": "aaa", "old_text": "aa", "new_text": "b"})
        )),
        ErrorKind::Conflict
    );
    // A shorter replacement leaves no old bytes behind.
    fs::write(dir.path().join("long"), "0123456789\nend").unwrap();
    ops::edit(
        &j,
        &json!({"path": "long", "old_text": "0123456789", "new_text": "x"}),
    )
    .unwrap();
    assert_eq!(
        fs::read_to_string(dir.path().join("long")).unwrap(),
        "x\nend"
    );

    let m = ops::rename(
        &j,
        &json!({"source": "new/deep/f.txt", "destination": "moved/g.txt"}),
    )
    .unwrap();
    assert_eq!(
        m,
        json!({"source": "new/deep/f.txt", "destination": "moved/g.txt"})
    );
    assert!(!f.exists());
    assert_eq!(
        fs::read_to_string(dir.path().join("moved/g.txt")).unwrap(),
        "hi hi hum!"
    );
    assert_eq!(
        kind(ops::rename(
            &j,
            &json!({"source": "aaa", "destination": "long"})
        )),
        ErrorKind::Conflict
    );
    assert_eq!(
        kind(ops::rename(
            &j,
            &json!({"source": "gone", "destination": "x"})
        )),
        ErrorKind::NotFound
    );
    assert_eq!(
        kind(ops::rename(
            &j,
            &json!({"source": "moved", "destination": "moved/in"})
        )),
        ErrorKind::InvalidInput
    );

    assert_eq!(
        kind(ops::delete(&j, &json!({"path": "new"}))),
        ErrorKind::Conflict
    );
    assert_eq!(
        ops::delete(&j, &json!({"path": "moved/g.txt"})).unwrap()["deleted"],
        true
    );
    assert_eq!(
        ops::delete(&j, &json!({"path": "moved/g.txt"})).unwrap()["deleted"],
        false
    );
    assert_eq!(
        ops::delete(&j, &json!({"path": "moved"})).unwrap()["deleted"],
        true
    );
    assert_eq!(
        kind(ops::delete(&j, &json!({"path": "."}))),
        ErrorKind::InvalidInput
    );
}

#[test]
fn stat_says_whether_a_path_exists() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("f"), "abc").unwrap();
    let j = jail(dir.path(), 1 << 20, |_| false);
    let s = ops::stat(&j, &json!({"path": "f"})).unwrap();
    assert_eq!(
        (
            s["exists"].as_bool(),
            s["kind"].as_str(),
            s["size"].as_u64()
        ),
        (Some(true), Some("file"), Some(3))
    );
    assert!(s["modified"].as_u64().is_some());
    assert_eq!(
        ops::stat(&j, &json!({"path": "g"})).unwrap(),
        json!({"path": "g", "exists": false})
    );
    assert_eq!(ops::stat(&j, &json!({"path": ""})).unwrap()["kind"], "dir");
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink("f", dir.path().join("l")).unwrap();
        let s = ops::stat(&j, &json!({"path": "l"})).unwrap();
        assert_eq!(
            (s["kind"].as_str(), s["symlink"].as_bool()),
            (Some("file"), Some(true))
        );
        std::os::unix::fs::symlink("nothing", dir.path().join("dangling")).unwrap();
        let s = ops::stat(&j, &json!({"path": "dangling"})).unwrap();
        assert_eq!(
            (s["exists"].as_bool(), s["kind"].as_str()),
            (Some(true), Some("symlink"))
        );
        // A symlink out of the root: refused, not described.
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("out")).unwrap();
        assert_eq!(
            kind(ops::stat(&j, &json!({"path": "out"}))),
            ErrorKind::PermissionDenied
        );
    }
}

/// A tree with a `.gitignore`, a hidden file and a hidden folder.
fn tree(root: &Path) {
    for (path, text) in [
        ("src/main.rs", "fn main() { todo!() }\n"),
        ("src/lib.rs", "// TODO: more\npub fn f() {}\n"),
        ("src/gen/out.rs", "TODO generated\n"),
        ("target/debug/x.rs", "TODO build output\n"),
        ("secret/key.rs", "TODO secret\n"),
        ("notes.md", "TODO write notes\nnothing\n"),
        (".env", "TODO=token\n"),
        ("bin.dat", "TODO\0binary"),
        (".git/HEAD", "TODO ref\n"),
        ("src/keep.log", "TODO kept\n"),
        ("a.log", "TODO ignored\n"),
    ] {
        let p = root.join(path);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, text).unwrap();
    }
    fs::write(root.join(".gitignore"), "target/\n*.log\n").unwrap();
    fs::write(root.join("src/.gitignore"), "gen/\n!keep.log\n").unwrap();
}

fn hide(path: &str) -> bool {
    path == ".env" || path == "secret" || path.ends_with(".env")
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn list_glob_and_search_never_show_hidden_paths() {
    let dir = tempfile::tempdir().unwrap();
    tree(dir.path());
    let j = jail(dir.path(), 1 << 20, hide);
    let listed = ops::list(&j, &json!({})).unwrap();
    let names: Vec<&str> = listed["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            ".git",
            ".gitignore",
            "a.log",
            "bin.dat",
            "notes.md",
            "src",
            "target"
        ]
    );
    assert_eq!(
        listed["entries"][4],
        json!({"name": "notes.md", "kind": "file", "size": 25})
    );
    assert_eq!(
        kind(ops::list(&j, &json!({"path": "secret"}))),
        ErrorKind::PermissionDenied
    );
    assert_eq!(
        kind(ops::read(&j, &json!({"path": "secret/key.rs"}))),
        ErrorKind::PermissionDenied
    );
    assert_eq!(
        kind(ops::read(&j, &json!({"path": "./.env"}))),
        ErrorKind::PermissionDenied
    );
    assert_eq!(
        kind(ops::write(
            &j,
            &json!({"path": "secret/new", "content": ""})
        )),
        ErrorKind::PermissionDenied
    );
    assert!(!dir.path().join("secret/new").exists());

    let all = ops::glob(&j, &json!({"pattern": "**/*.rs"})).unwrap();
    assert_eq!(strings(&all["paths"]), ["src/lib.rs", "src/main.rs"]);
    let logs = ops::glob(&j, &json!({"pattern": "**/*.log"})).unwrap();
    assert_eq!(strings(&logs["paths"]), ["src/keep.log"]);
    let top = ops::glob(&j, &json!({"pattern": "*"})).unwrap();
    assert_eq!(
        strings(&top["paths"]),
        [".gitignore", "bin.dat", "notes.md", "src"]
    );
    assert_eq!(
        ops::glob(&j, &json!({"pattern": "secret/*"})).unwrap()["paths"],
        json!([])
    );
    assert_eq!(
        ops::glob(&j, &json!({"pattern": "nothing/*"})).unwrap()["paths"],
        json!([])
    );
    assert_eq!(
        kind(ops::glob(&j, &json!({"pattern": "../*"}))),
        ErrorKind::PermissionDenied
    );
    assert_eq!(
        kind(ops::glob(&j, &json!({"pattern": "a[b"}))),
        ErrorKind::InvalidInput
    );

    let found = ops::search(&j, &json!({"pattern": "TODO"})).unwrap();
    let paths: Vec<&str> = found["matches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["notes.md", "src/keep.log", "src/lib.rs"]);
    assert_eq!(
        found["matches"][2],
        json!({"path": "src/lib.rs", "line": 1, "text": "// TODO: more"})
    );
    assert_eq!(found["files_skipped"], 1, "the binary file: {found}");
    let rs = ops::search(&j, &json!({"pattern": "(?i)todo", "glob": "*.rs"})).unwrap();
    let paths: Vec<&str> = rs["matches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["src/lib.rs", "src/main.rs"]);
    let under = ops::search(&j, &json!({"pattern": "fn", "path": "src"})).unwrap();
    assert_eq!(under["matches"].as_array().unwrap().len(), 2);
    // One file named: searched even when a `.gitignore` ignores it; a hidden one is refused.
    let one = ops::search(&j, &json!({"pattern": "TODO", "path": "a.log"})).unwrap();
    assert_eq!(one["matches"].as_array().unwrap().len(), 1);
    assert_eq!(
        kind(ops::search(&j, &json!({"pattern": "x", "path": ".env"}))),
        ErrorKind::PermissionDenied
    );
    assert_eq!(
        kind(ops::search(&j, &json!({"pattern": "("}))),
        ErrorKind::InvalidInput
    );
}

#[test]
fn search_results_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let line = format!("needle {}\n", "x".repeat(1000));
    fs::write(dir.path().join("big"), line.repeat(ops::MAX_MATCHES + 5)).unwrap();
    let j = jail(dir.path(), 1 << 20, |_| false);
    let found = ops::search(&j, &json!({"pattern": "needle"})).unwrap();
    assert_eq!(found["matches"].as_array().unwrap().len(), ops::MAX_MATCHES);
    assert_eq!(found["truncated"], true);
    assert_eq!(
        found["matches"][0]["text"].as_str().unwrap().len(),
        ops::MAX_LINE
    );
}

#[cfg(unix)]
#[test]
fn a_symlink_inside_to_a_hidden_file_is_hidden_too() {
    let dir = tempfile::tempdir().unwrap();
    tree(dir.path());
    std::os::unix::fs::symlink(".env", dir.path().join("innocent")).unwrap();
    std::os::unix::fs::symlink("../secret", dir.path().join("src/dir")).unwrap();
    std::os::unix::fs::symlink("lib.rs", dir.path().join("src/alias.rs")).unwrap();
    let j = jail(dir.path(), 1 << 20, hide);
    assert_eq!(
        kind(ops::read(&j, &json!({"path": "innocent"}))),
        ErrorKind::PermissionDenied
    );
    assert_eq!(
        kind(ops::read(&j, &json!({"path": "src/dir/key.rs"}))),
        ErrorKind::PermissionDenied
    );
    assert_eq!(
        kind(ops::write(
            &j,
            &json!({"path": "src/dir/new.rs", "content": "x"})
        )),
        ErrorKind::PermissionDenied
    );
    assert!(!dir.path().join("secret/new.rs").exists());
    // A symlink inside to a file that is not hidden is followed.
    assert_eq!(
        ops::read(&j, &json!({"path": "src/alias.rs"})).unwrap()["text"],
        "// TODO: more\npub fn f() {}\n"
    );
    // Walks list symlinks but never follow them.
    let all = ops::glob(&j, &json!({"pattern": "src/**"})).unwrap();
    assert!(strings(&all["paths"]).contains(&"src/dir".to_string()));
    assert!(!strings(&all["paths"])
        .iter()
        .any(|p| p.starts_with("src/dir/")));
}
