//! Command tools and the guard's command rules: bypasses of the rules through paths, wrappers
//! and shells; arguments that stay arguments; a cleared environment; timeouts that kill a
//! whole process group; bounded output; Landlock's confinement where this kernel has it.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use toolscript::commands::{command_tool, landlock_available};
use toolscript::guard::{Argv, CommandRules};
use toolscript::{Registry, Runtime, Tool};

fn strings(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn the_rules() -> CommandRules {
    CommandRules::new(
        &strings(&["git status", "cargo test *", "echo *"]),
        &[],
        &strings(&["rm *"]),
    )
    .unwrap()
}

fn decide(rules: &CommandRules, argv: &[&str]) -> toolscript::guard::Decision {
    let argv = Argv {
        argv: strings(argv),
        cwd: ".".into(),
    };
    let path = std::env::var("PATH").ok();
    rules.decide(&argv, Path::new("/"), path.as_deref())
}

#[test]
fn a_denied_command_is_denied_however_it_is_wrapped() {
    use toolscript::guard::Decision;
    let rules = the_rules();
    let rm = ["rm", "-rf", "x"];
    let wrappers: &[&[&str]] = &[
        &[],
        &["env"],
        &["env", "-i", "A=1", "B=2"],
        &["env", "-u", "HOME", "--"],
        &["nice"],
        &["nice", "-n", "5"],
        &["nice", "-n5"],
        &["nice", "--adjustment=5"],
        &["nohup"],
        &["timeout", "5"],
        &["timeout", "-s", "KILL", "-k", "1", "5s"],
        &["timeout", "--signal=KILL", "5"],
        &["time"],
        &["time", "-p"],
        &["stdbuf", "-o0"],
        &["stdbuf", "-oL", "-e", "0"],
        &["command"],
        &["command", "-p"],
        &["sudo"],
        &["sudo", "-u", "root", "-E", "A=1"],
        &["sudo", "--user=root", "--"],
        &["doas"],
        &["doas", "-u", "root"],
        &["busybox"],
        &["chrt", "-o", "0"],
        &["ionice", "-c", "3"],
        &["ionice", "-c3", "-n", "7"],
        &["setsid"],
        &["setsid", "-f"],
        &["taskset", "1"],
        &["taskset", "-c", "0"],
        &["unbuffer"],
        &["flock", "/tmp/lock"],
        &["chroot", "/"],
        // Nested wrappers: each layer is unwrapped in turn.
        &["env", "nice", "timeout", "5"],
        &[
            "sudo", "-u", "x", "env", "A=1", "nice", "-n", "1", "stdbuf", "-o0", "timeout", "5",
        ],
        &["nohup", "setsid", "ionice", "-c", "3", "command"],
    ];
    let mut seen = Vec::new();
    for wrapper in wrappers {
        for program in ["rm", "/bin/rm", "/usr/bin/rm"] {
            let mut argv: Vec<&str> = wrapper.to_vec();
            argv.push(program);
            argv.extend(&rm[1..]);
            match decide(&rules, &argv) {
                Decision::Deny { rule, reason } => {
                    assert_eq!(rule, "commands.deny \"rm *\"", "{argv:?}: {reason}");
                    assert!(reason.contains("rm\", \"-rf\""), "{reason}");
                    seen.push(reason);
                }
                other => panic!("{argv:?} is not denied: {other:?}"),
            }
        }
    }
    // The reason shows the argv as the guard saw it: the real file, and the call around it.
    assert!(
        seen.iter()
            .any(|r| r.contains("\"/usr/bin/rm\", \"-rf\", \"x\"") && r.contains("(in `env nice")),
        "{seen:?}"
    );
}

#[test]
fn shells_and_programs_that_run_others_are_denied_unless_named() {
    use toolscript::guard::Decision;
    let rules = the_rules();
    let cases: &[&[&str]] = &[
        &["sh", "-c", "rm -rf x"],
        &["/bin/sh", "-c", "echo hi"],
        &["bash", "-lc", "rm -rf x"],
        &["bash", "script.sh"],
        &["dash", "-c", "rm x"],
        &["zsh", "-c", "rm x"],
        &["fish", "-c", "rm x"],
        &["python3", "-c", "import os; os.remove('x')"],
        &["python", "-c", "1"],
        &["perl", "-e", "unlink 'x'"],
        &["node", "-e", "1"],
        &["awk", "BEGIN { system(\"rm x\") }"],
        &["env", "sh", "-c", "rm x"],
        &["env", "-S", "rm x"],
        &["sudo", "-s"],
        &["busybox", "sh", "-c", "rm x"],
        &["nice", "bash", "-c", "echo hi"],
        &["find", ".", "-delete"],
        &["find", ".", "-name", "*.o", "-exec", "rm", "{}", ";"],
        &["find", ".", "-execdir", "shred", "{}", "+"],
        &["xargs", "rm"],
        &["xargs", "-0", "rm", "-f"],
        &["xargs"], // runs `echo` with its input: allowed alone would be an xargs call
        &["git", "-c", "core.pager=rm -rf x", "status"],
        &["git", "-c", "alias.status=!rm x", "status"],
        &["nice", "--unknown-option", "echo", "hi"],
    ];
    for argv in cases {
        let decision = decide(&rules, argv);
        // `xargs` alone is not denied (it runs `echo`), but it is never allowed without a rule
        // that names it; every other case is denied.
        if *argv == ["xargs"] {
            assert_eq!(decision, Decision::Pass, "{argv:?}");
            continue;
        }
        assert!(
            matches!(decision, Decision::Deny { .. }),
            "{argv:?} is not denied: {decision:?}"
        );
    }
    // The allowed commands themselves are allowed: the checks above can tell them apart.
    for argv in [
        &["echo", "hi"][..],
        &["/bin/echo", "hi"],
        &["git", "status"],
        &["cargo", "test"],
        &["cargo", "test", "commands"],
    ] {
        assert_eq!(decide(&rules, argv), Decision::Allow, "{argv:?}");
    }
    // A rule that names a shell lets it through.
    let named = CommandRules::new(&strings(&["bash -lc *"]), &[], &strings(&["rm *"])).unwrap();
    assert_eq!(decide(&named, &["bash", "-lc", "ls"]), Decision::Allow);
}

/// Runs `script` over `tools`: its value, or its error's kind and message.
async fn run(tools: Vec<Tool>, script: &str) -> Result<Value, (String, String)> {
    let runtime = Runtime::new(Registry::builder().tools(tools).build().unwrap());
    runtime
        .run(script)
        .await
        .result
        .map_err(|e| (e.kind_name().to_string(), e.message.clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_value_is_one_argument_and_never_an_option() {
    let root = tempfile::tempdir().unwrap();
    let show = command_tool("show", root.path(), ["printf", "<%s>\\n", "x", "{filter}"])
        .effect(toolscript::Effect::Read)
        .build()
        .unwrap();
    let out = run(vec![show.clone()], r#"show(#{filter: "; rm -rf /"})"#)
        .await
        .unwrap();
    assert_eq!(out["stdout"], "<x>\n<; rm -rf />\n", "{out}");
    assert_eq!(out["status"], 0);
    let out = run(vec![show.clone()], r#"show(#{filter: "a b $(id) `id`"})"#)
        .await
        .unwrap();
    assert_eq!(out["stdout"], "<x>\n<a b $(id) `id`>\n", "{out}");
    let (kind, message) = run(vec![show], r#"show(#{filter: "--help"})"#)
        .await
        .unwrap_err();
    assert_eq!(kind, "invalid_input", "{message}");
    assert!(message.contains("starts with `-`"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_holds_nothing_of_the_parent_s_environment() {
    let root = tempfile::tempdir().unwrap();
    let marker = "TOOLSCRIPT_COMMANDS_TEST_MARKER";
    // Only this test sets or reads this variable.
    std::env::set_var(marker, "leaked");
    let env = command_tool("env", root.path(), ["env"])
        .env("DECLARED", "yes")
        .build()
        .unwrap();
    let out = run(vec![env], "env()").await.unwrap();
    let stdout = out["stdout"].as_str().unwrap();
    assert!(!stdout.contains(marker), "{stdout}");
    assert!(!stdout.contains("HOME="), "{stdout}");
    assert!(stdout.contains("DECLARED=yes"), "{stdout}");
    assert!(stdout.contains("PATH="), "PATH is passed on: {stdout}");
    let lines = stdout.lines().count();
    assert_eq!(lines, 2, "PATH and DECLARED alone: {stdout}");
    // Passed on when asked: the check above can fail.
    let passing = command_tool("env", root.path(), ["env"])
        .env_pass([marker])
        .build()
        .unwrap();
    let out = run(vec![passing], "env()").await.unwrap();
    assert_eq!(out["stdout"], format!("{marker}=leaked\n"));
}

/// Whether the process `pid` is gone (or a zombie, which runs nothing).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next().map(|s| s == "Z" || s == "X"))
            .unwrap_or(true),
    }
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_past_its_timeout_is_killed_with_its_group() {
    let root = tempfile::tempdir().unwrap();
    // The shell starts a sleeper in its group, writes both pids, and waits.
    let slow = command_tool(
        "slow",
        root.path(),
        [
            "sh",
            "-c",
            "sleep 60 & echo $! > pids; echo $$ >> pids; wait",
        ],
    )
    .timeout(Duration::from_millis(1500))
    .build()
    .unwrap();
    let (kind, message) = run(vec![slow], "slow()").await.unwrap_err();
    assert_eq!(kind, "timeout", "{message}");
    assert!(message.contains("process group was killed"), "{message}");
    let pids: Vec<u32> = std::fs::read_to_string(root.path().join("pids"))
        .unwrap()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 2, "{pids:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !pids.iter().all(|p| gone(*p)) {
        assert!(
            Instant::now() < deadline,
            "a process of the group survived: {pids:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_command_leaves_running_ends_with_it() {
    let root = tempfile::tempdir().unwrap();
    let quick = command_tool(
        "quick",
        root.path(),
        // The sleeper's output goes elsewhere, so the command's own pipes close when it exits.
        ["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"],
    )
    .build()
    .unwrap();
    let out = run(vec![quick], "quick()").await.unwrap();
    assert_eq!(out["status"], 0, "{out}");
    let pid: u32 = out["stdout"].as_str().unwrap().trim().parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !gone(pid) {
        assert!(Instant::now() < deadline, "the sleeper {pid} survived");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_past_its_bound_is_cut_and_says_so() {
    let root = tempfile::tempdir().unwrap();
    let zeros = command_tool("zeros", root.path(), ["head", "-c", "{n}", "/dev/zero"])
        .max_output_bytes(1000)
        .build()
        .unwrap();
    let out = run(vec![zeros.clone()], r#"zeros(#{n: "200000"})"#)
        .await
        .unwrap();
    assert_eq!(out["stdout"].as_str().unwrap().len(), 1000);
    assert_eq!(out["truncated"], true);
    assert_eq!(out["status"], 0);
    let out = run(vec![zeros], r#"zeros(#{n: "1000"})"#).await.unwrap();
    assert_eq!(out["stdout"].as_str().unwrap().len(), 1000);
    assert_eq!(out["truncated"], false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn landlock_confines_a_command_to_its_root_or_the_result_says_it_did_not() {
    let root = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("inside.txt"), "inside").unwrap();
    let secret = outside.path().join("secret.txt");
    std::fs::write(&secret, "secret").unwrap();
    let cat = command_tool("cat", root.path(), ["cat", "--", "{path}"])
        .effect(toolscript::Effect::Read)
        .build()
        .unwrap();
    let read = |path: String| {
        let cat = cat.clone();
        async move {
            run(vec![cat], &format!("cat(#{{path: {}}})", json!(path)))
                .await
                .unwrap()
        }
    };
    let inside = read("inside.txt".into()).await;
    assert_eq!(inside["stdout"], "inside", "{inside}");
    let out = read(secret.display().to_string()).await;
    if landlock_available() {
        assert_eq!(inside["confined"], true);
        assert_ne!(out["status"], 0, "{out}");
        assert_eq!(out["stdout"], "", "{out}");
        assert!(
            out["stderr"]
                .as_str()
                .unwrap()
                .contains("Permission denied"),
            "{out}"
        );
        // Writing outside fails too.
        let touch = command_tool("touch", root.path(), ["touch", "--", "{path}"])
            .build()
            .unwrap();
        let target = outside.path().join("made.txt");
        let out = run(
            vec![touch],
            &format!("touch(#{{path: {}}})", json!(target.display().to_string())),
        )
        .await
        .unwrap();
        assert_ne!(out["status"], 0, "{out}");
        assert!(!target.exists());
    } else {
        eprintln!("Landlock is not available on this system: checking the unconfined warning");
        assert_eq!(out["stdout"], "secret", "{out}");
        assert_eq!(out["confined"], false);
        assert!(
            out["warning"].as_str().unwrap().contains("unconfined"),
            "{out}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manifest_s_command_tool_runs_beneath_the_manifest_s_folder() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    std::fs::write(dir.path().join("sub/a.txt"), "one\ntwo\n").unwrap();
    let manifest = dir.path().join("tools.toml");
    std::fs::write(
        &manifest,
        "[[tool]]\nkind = \"command\"\nname = \"count\"\nargv = [\"wc\", \"-l\", \"--\", \"{file}\"]\ncwd = \"sub\"\neffect = \"read\"\n",
    )
    .unwrap();
    let mut manifests = toolscript::Manifests::new();
    manifests.load_file(&manifest).unwrap();
    let runtime = Runtime::new(manifests.into_registry().unwrap());
    let out = runtime
        .run(r#"count(#{file: "a.txt"})"#)
        .await
        .result
        .unwrap();
    assert_eq!(out["stdout"], "2 a.txt\n", "{out}");
    assert_eq!(out["status"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_command_runs_a_given_argv_beneath_its_root_and_shows_it_to_the_guard() {
    use toolscript::guard::Decision;
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("sub")).unwrap();
    let tool = toolscript::commands::run_command(root.path()).unwrap();
    // The guard reads the call's argv from the tool's spec, as the dispatch path will.
    let line = tool.spec().guard.command.clone().unwrap();
    let rules = the_rules();
    let path = std::env::var("PATH").ok();
    let seen = |args: Value| {
        let argv = line.argv(&args).unwrap();
        rules.decide(&argv, root.path(), path.as_deref())
    };
    assert_eq!(seen(json!({"argv": ["echo", "hi"]})), Decision::Allow);
    assert!(matches!(
        seen(json!({"argv": ["/usr/bin/env", "rm", "-rf", "."], "cwd": "sub"})),
        Decision::Deny { .. }
    ));
    let out = run(
        vec![tool.clone()],
        r#"run_command(#{argv: ["pwd"], cwd: "sub"})"#,
    )
    .await
    .unwrap();
    let real = std::fs::canonicalize(root.path().join("sub")).unwrap();
    assert_eq!(out["stdout"], format!("{}\n", real.display()), "{out}");
    for cwd in ["..", "/", "sub/../.."] {
        let (kind, message) = run(
            vec![tool.clone()],
            &format!("run_command(#{{argv: [\"pwd\"], cwd: {}}})", json!(cwd)),
        )
        .await
        .unwrap_err();
        assert_eq!(kind, "permission_denied", "{cwd}: {message}");
    }
    let (kind, _) = run(vec![tool], r#"run_command(#{argv: ["no-such-program-x"]})"#)
        .await
        .unwrap_err();
    assert_eq!(kind, "failed");
}
