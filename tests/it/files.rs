//! The built-in file tools, through the registry and the runtime: escapes refused, a symlink
//! race that never reaches outside the root, every tool from a script, `[files]` in a
//! manifest, and speculation giving the value of a sequential run.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use serde_json::{json, Value};
use toolscript::files::Files;
use toolscript::{Limits, Mode, Registry, RunOptions, Runtime};

use crate::support::run_in;

/// Every file under `dir` with its content (symlinks as their targets), to compare a tree
/// before and after.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, String> {
    fn walk(dir: &Path, base: &Path, out: &mut BTreeMap<PathBuf, String>) {
        for entry in fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            let rel = path.strip_prefix(base).unwrap().to_path_buf();
            let kind = entry.file_type().unwrap();
            if kind.is_symlink() {
                out.insert(
                    rel,
                    format!("-> {}", fs::read_link(&path).unwrap().display()),
                );
            } else if kind.is_dir() {
                out.insert(rel, "<dir>".to_string());
                walk(&path, base, out);
            } else {
                out.insert(rel, fs::read_to_string(&path).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// A root beside a folder outside it that holds a secret file and a secret folder.
struct Setup {
    _dir: tempfile::TempDir,
    root: PathBuf,
    outside: PathBuf,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let outside = dir.path().join("outside");
    fs::create_dir_all(root.join("sub")).unwrap();
    fs::create_dir_all(outside.join("dir")).unwrap();
    fs::write(outside.join("secret.txt"), "OUTSIDE").unwrap();
    fs::write(outside.join("dir/target.txt"), "OUTSIDE").unwrap();
    fs::write(root.join("inside.txt"), "INSIDE").unwrap();
    fs::write(root.join("sub/target.txt"), "INSIDE").unwrap();
    Setup {
        _dir: dir,
        root,
        outside,
    }
}

fn runtime(files: Files) -> Runtime {
    let mut limits = Limits::default();
    limits.max_calls = 100_000;
    limits.max_speculative_calls = 100_000;
    Runtime::builder(Registry::builder().files(files).build().unwrap())
        .limits(limits)
        .build()
}

/// The kind of error of one call from a script (`ok` when it succeeds), the path given as the
/// run's input so that any string reaches the tool as it is.
async fn outcome(runtime: &Runtime, call: &str, input: Value) -> String {
    let script =
        format!(r#"let kind = "ok"; try {{ {call}; }} catch (e) {{ kind = e.kind }} kind"#);
    let out = runtime
        .run_with(
            &script,
            RunOptions::with_mode(Mode::Sequential).input(input),
        )
        .await;
    out.result.unwrap().as_str().unwrap().to_string()
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escapes_are_refused() {
    use std::os::unix::fs::symlink;
    let s = setup();
    symlink(s.outside.join("secret.txt"), s.root.join("file_out")).unwrap();
    symlink("../outside/secret.txt", s.root.join("file_out_relative")).unwrap();
    symlink(s.outside.join("dir"), s.root.join("dir_out")).unwrap();
    // A folder swapped for a symlink out of the root (as a swap mid-call would leave it).
    fs::rename(s.root.join("sub"), s.root.join("sub_was")).unwrap();
    symlink(s.outside.join("dir"), s.root.join("sub")).unwrap();
    let before = snapshot(&s.outside);
    let rt = runtime(Files::new(&s.root));
    let secret = s.outside.join("secret.txt").display().to_string();
    let paths = [
        ("..", "permission_denied"),
        ("../outside/secret.txt", "permission_denied"),
        ("sub_was/../../outside/secret.txt", "permission_denied"),
        (secret.as_str(), "permission_denied"),
        ("/etc/passwd", "permission_denied"),
        ("/proc/self/root/etc/passwd", "permission_denied"),
        ("~/.bashrc", "permission_denied"),
        ("~", "permission_denied"),
        ("inside.txt\0", "invalid_input"),
        ("file_out", "permission_denied"),
        ("file_out_relative", "permission_denied"),
        ("dir_out/target.txt", "permission_denied"),
        ("sub/target.txt", "permission_denied"),
    ];
    let mut wrong = Vec::new();
    for (path, want) in paths {
        for call in [
            "fs_read(#{path: input})",
            "fs_stat(#{path: input})",
            "fs_write(#{path: input, content: \"PWNED\"})",
            "fs_append(#{path: input, content: \"PWNED\"})",
            "fs_edit(#{path: input, old_text: \"OUTSIDE\", new_text: \"PWNED\"})",
            "fs_search(#{pattern: \"OUT\", path: input})",
            "fs_move(#{source: \"inside.txt\", destination: input})",
            "fs_move(#{source: input, destination: \"stolen.txt\"})",
            "fs_delete(#{path: input})",
        ] {
            // A call on a symlink itself (moving or deleting the link) stays inside the root.
            // Moving onto one is a conflict: the destination exists. (Moving and deleting a
            // link itself are tested below.)
            let on_link = call.starts_with("fs_move") || call.starts_with("fs_delete");
            if on_link && path.starts_with("file_out") {
                if call.contains("destination: input") {
                    let got = outcome(&rt, call, json!(path)).await;
                    if got != "conflict" {
                        wrong.push(format!("{call} with {path:?}: {got}, not conflict"));
                    }
                }
                continue;
            }
            let got = outcome(&rt, call, json!(path)).await;
            if got != want {
                wrong.push(format!("{call} with {path:?}: {got}, not {want}"));
            }
        }
    }
    // Folders out of the root: listing them, or anything below them.
    for path in ["dir_out", "sub", "..", "/tmp", "/proc/self/root"] {
        let got = outcome(&rt, "fs_list(#{path: input})", json!(path)).await;
        if got != "permission_denied" {
            wrong.push(format!("fs_list of {path:?}: {got}"));
        }
    }
    for pattern in ["../*", "/etc/*", "~/*", "dir_out/*"] {
        let got = outcome(
            &rt,
            "let r = fs_glob(#{pattern: input}); if r.paths.len() > 0 { throw r.paths }",
            json!(pattern),
        )
        .await;
        if got != "permission_denied" && got != "ok" {
            wrong.push(format!("fs_glob of {pattern:?}: {got}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // Deleting a symlink out of the root removes the link, never its target.
    assert_eq!(
        outcome(&rt, "fs_delete(#{path: input})", json!("file_out")).await,
        "ok"
    );
    assert_eq!(
        outcome(
            &rt,
            "fs_delete(#{path: input})",
            json!("dir_out/target.txt")
        )
        .await,
        "permission_denied"
    );
    assert_eq!(snapshot(&s.outside), before, "nothing outside changed");
    assert!(!s.root.join("stolen.txt").exists());
    assert_eq!(
        fs::read_to_string(s.root.join("inside.txt")).unwrap(),
        "INSIDE"
    );
}

/// A thread swaps a symlink between a file inside and one outside, and a folder between a
/// real folder and a symlink to a folder outside, as fast as it can, while a script makes
/// 10,000 `fs_read` and `fs_write` calls through the runtime (the dispatch path, receipts
/// and all) on those paths: no byte is read from outside, none written there, no file appears
/// there. Both outcomes of the race must have happened, or the test proves nothing.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlink_race_never_reaches_outside() {
    use std::os::unix::fs::symlink;
    let s = setup();
    symlink("inside.txt", s.root.join("link")).unwrap();
    let before = snapshot(&s.outside);
    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicU64::new(0));
    let swapper = {
        let (root, outside, stop, swaps) = (
            s.root.clone(),
            s.outside.clone(),
            Arc::clone(&stop),
            Arc::clone(&swaps),
        );
        std::thread::spawn(move || {
            let out_file = outside.join("secret.txt");
            let out_dir = outside.join("dir");
            while !stop.load(Ordering::Relaxed) {
                // The link: atomically replaced (a symlink renamed over it).
                let _ = fs::remove_file(root.join("link.tmp"));
                let _ = symlink(&out_file, root.join("link.tmp"));
                let _ = fs::rename(root.join("link.tmp"), root.join("link"));
                // The folder: moved away, a symlink out put in its place, then moved back.
                let _ = fs::rename(root.join("sub"), root.join("sub.real"));
                let _ = symlink(&out_dir, root.join("sub"));
                std::thread::yield_now();
                let _ = fs::remove_file(root.join("link.tmp"));
                let _ = symlink("inside.txt", root.join("link.tmp"));
                let _ = fs::rename(root.join("link.tmp"), root.join("link"));
                let _ = fs::remove_file(root.join("sub"));
                // A write may have made a real `sub` meanwhile: keep one of the two.
                if fs::rename(root.join("sub.real"), root.join("sub")).is_err() {
                    let _ = fs::remove_dir_all(root.join("sub.real"));
                }
                swaps.fetch_add(1, Ordering::Relaxed);
                std::thread::yield_now();
            }
        })
    };
    let rt = runtime(Files::new(&s.root));
    // 2,500 rounds of four calls: a read and a write of the link, a read and a write below the
    // folder. Each write's content differs, so none is a repeated call.
    let script = r#"
        let tally = #{ok: 0, leaked: 0, denied: 0, missing: 0, other: 0, others: []};
        for i in 0..2500 {
            for k in 0..4 {
                try {
                    switch k {
                        0 => { let r = fs_read(#{path: "link"}); if r.text.contains("OUTSIDE") { tally.leaked += 1 } }
                        1 => { fs_write(#{path: "link", content: `INSIDE ${i}`}); }
                        2 => { let r = fs_read(#{path: "sub/target.txt"}); if r.text.contains("OUTSIDE") { tally.leaked += 1 } }
                        _ => { fs_write(#{path: "sub/target.txt", content: `INSIDE ${i}`}); }
                    }
                    tally.ok += 1;
                } catch (e) {
                    switch e.kind {
                        "permission_denied" => tally.denied += 1,
                        "not_found" => tally.missing += 1,
                        _ => { tally.other += 1; if tally.others.len() < 3 { tally.others.push(`${e.kind}: ${e.message}`) } }
                    }
                }
            }
        }
        tally
    "#;
    let out = run_in(&rt, script, Mode::Speculative).await;
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
    let tally = out.result.expect("the script runs");
    assert_eq!(tally["leaked"], 0, "{tally}");
    assert_eq!(out.stats.tool_calls, 10_000, "{:?}", out.stats);
    assert_eq!(
        snapshot(&s.outside),
        before,
        "nothing outside changed: {tally}"
    );
    let (ok, denied) = (
        tally["ok"].as_u64().unwrap(),
        tally["denied"].as_u64().unwrap(),
    );
    assert!(
        ok > 0 && denied > 0,
        "both sides of the race were hit ({} swaps): {tally}",
        swaps.load(Ordering::Relaxed)
    );
    // Other failures (a folder missing mid-swap: `invalid_input`, `failed`) never wrote outside;
    // they are listed when the test fails.
    eprintln!(
        "race: {tally}, {} swaps, {:.0} ms",
        swaps.load(Ordering::Relaxed),
        out.stats.wall_ms
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_tool_works_from_a_script() {
    let s = setup();
    fs::write(s.root.join(".gitignore"), "ignored/\n").unwrap();
    fs::create_dir_all(s.root.join("ignored")).unwrap();
    fs::write(s.root.join("ignored/x.txt"), "needle").unwrap();
    fs::write(s.root.join(".env"), "needle=1").unwrap();
    let rt = runtime(
        Files::new(&s.root)
            .max_bytes(8)
            .hidden(|p: &str| p == ".env"),
    );
    let script = r#"
        let w = fs_write(#{path: "notes/a.txt", content: "one\ntwo\nneedle three\n"});
        let r = fs_read(#{path: "notes/a.txt"});
        let lines = fs_read(#{path: "notes/a.txt", start_line: 2, end_line: 2});
        fs_append(#{path: "notes/a.txt", content: "four\n"});
        let conflict = "";
        try { fs_edit(#{path: "notes/a.txt", old_text: "o", new_text: "0"}); } catch (e) { conflict = e.kind }
        let e = fs_edit(#{path: "notes/a.txt", old_text: "two", new_text: "2"});
        let listed = fs_list(#{}).entries.map(|x| x.name);
        let globbed = fs_glob(#{pattern: "**/*.txt"}).paths;
        let found = fs_search(#{pattern: "needle"}).matches.map(|m| `${m.path}:${m.line}`);
        let st = fs_stat(#{path: "notes/a.txt"});
        let moved = fs_move(#{source: "notes/a.txt", destination: "b.txt"});
        let gone = fs_delete(#{path: "notes"});
        let again = fs_delete(#{path: "notes/nothing"});
        #{created: w.created, text: r.text, truncated: r.truncated, line2: lines.text, conflict: conflict,
          edit_line: e.line, listed: listed, globbed: globbed, found: found, size: st.size,
          moved: moved.destination, gone: gone.deleted, again: again.deleted}
    "#;
    let out = run_in(&rt, script, Mode::Speculative).await;
    let v = out.result.expect("the script runs");
    assert_eq!(
        v,
        json!({
            "created": true, "text": "one\ntwo\n", "truncated": true, "line2": "two\n",
            "conflict": "conflict", "edit_line": 2,
            "listed": [".gitignore", "ignored", "inside.txt", "notes", "sub"],
            "globbed": ["inside.txt", "notes/a.txt", "sub/target.txt"],
            "found": ["notes/a.txt:3"],
            "size": 24, "moved": "b.txt", "gone": true, "again": false
        })
    );
    assert_eq!(
        fs::read_to_string(s.root.join("b.txt")).unwrap(),
        "one\n2\nneedle three\nfour\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_reads_speculated_give_the_sequential_value() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..200 {
        fs::create_dir_all(dir.path().join(format!("d{}", i % 7))).unwrap();
        fs::write(
            dir.path().join(format!("d{}/f{i}.txt", i % 7)),
            format!("file {i}\n{}", "x".repeat(i)),
        )
        .unwrap();
    }
    let rt = runtime(Files::new(dir.path()));
    let script = r#"
        let out = [];
        let bytes = 0;
        for i in 0..200 {
            let r = fs_read(#{path: `d${i % 7}/f${i}.txt`});
            out.push(r.text.split("\n")[0]);
            bytes += r.bytes;
        }
        #{first: out[0], last: out[199], count: out.len(), bytes: bytes, listed: fs_glob(#{pattern: "d3/*"}).paths.len()}
    "#;
    let sequential = run_in(&rt, script, Mode::Sequential).await;
    let speculative = run_in(&rt, script, Mode::Speculative).await;
    let value = sequential.result.expect("the sequential run");
    assert_eq!(value["count"], 200);
    assert_eq!(value["last"], "file 199");
    assert_eq!(value["listed"], 29);
    assert_eq!(speculative.result.expect("the speculative run"), value);
    assert_eq!(speculative.stats.tool_calls, sequential.stats.tool_calls);
    assert!(
        speculative.stats.speculative_claimed > 0,
        "the scout read ahead: {:?}",
        speculative.stats
    );
}

#[test]
fn names_clash_and_a_missing_root_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let clash = Registry::builder()
        .files(Files::new(dir.path()))
        .files(Files::new(dir.path()))
        .build()
        .unwrap_err();
    assert!(
        clash.to_string().contains("fs_read") && clash.to_string().contains("two tools"),
        "{clash}"
    );
    let two = Registry::builder()
        .files(Files::new(dir.path()))
        .files(Files::new(dir.path()).prefix("other_"))
        .build()
        .unwrap();
    assert_eq!(two.len(), 20);
    let missing = Registry::builder()
        .files(Files::new(dir.path().join("nope")))
        .build()
        .unwrap_err();
    assert!(missing.to_string().contains("nope"), "{missing}");
    // The guard sees the arguments that name files.
    let spec = two.specs().find(|s| s.name == "fs_move").unwrap();
    let paths = spec
        .guard
        .paths(&json!({"source": "a", "destination": "b"}))
        .unwrap();
    assert_eq!(
        paths,
        [
            ("a".to_string(), toolscript::guard::Access::Write),
            ("b".to_string(), toolscript::guard::Access::Write)
        ]
    );
    let read = two.specs().find(|s| s.name == "fs_read").unwrap();
    assert_eq!(
        read.guard.paths(&json!({"path": "x"})).unwrap(),
        [("x".to_string(), toolscript::guard::Access::Read)]
    );
    let effects: Vec<(String, String)> = two
        .specs()
        .take(10)
        .map(|s| (s.name.clone(), s.effect.to_string()))
        .collect();
    assert_eq!(
        effects,
        [
            ("fs_read", "read"),
            ("fs_write", "idempotent"),
            ("fs_append", "write"),
            ("fs_edit", "write"),
            ("fs_list", "read"),
            ("fs_glob", "read"),
            ("fs_stat", "read"),
            ("fs_search", "read"),
            ("fs_delete", "idempotent"),
            ("fs_move", "write"),
        ]
        .map(|(a, b)| (a.to_string(), b.to_string()))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manifest_declares_the_file_tools() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir_all(dir.path().join("work")).unwrap();
    fs::write(dir.path().join("work/hello.txt"), "hello").unwrap();
    let manifest = dir.path().join("tools.toml");
    fs::write(
        &manifest,
        "[files]\nroot = \"work\"\nprefix = \"w_\"\nmax_bytes = 4\n",
    )
    .unwrap();
    let mut manifests = toolscript::Manifests::new();
    manifests.load_file(&manifest).unwrap();
    let rt = Runtime::new(manifests.into_registry().unwrap());
    let out = rt.run(r#"w_read(#{path: "hello.txt"}).text"#).await;
    assert_eq!(out.result.unwrap(), json!("hell"));

    for (text, want) in [
        ("[files]\nroot = \"nope\"\n", "cannot be opened"),
        ("[files]\nmax_bytes = 0\n", "at least 1"),
        ("[files]\nroots = \".\"\n", "unknown field"),
    ] {
        let mut m = toolscript::Manifests::new();
        let e = m
            .load_str(&manifest, &format!("\n{text}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains(want) && e.contains("tools.toml:"), "{text}: {e}");
    }
    // Two `[files]` tables with one prefix: the clash names the second manifest's line.
    let mut m = toolscript::Manifests::new();
    m.load_file(&manifest).unwrap();
    m.load_file(&manifest).unwrap();
    let e = m.into_registry().unwrap_err().to_string();
    assert!(e.contains("w_read") && e.contains("tools.toml"), "{e}");
}
