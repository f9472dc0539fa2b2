//! The streaming paths of the binary: `run - --stream` reads stdin as it arrives, and
//! `serve --http` answers a chunked `POST /v1/stream` with the run's id at once and its
//! outcome at the end, with and without `--auth`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use sha2::{Digest, Sha256};
use tempfile::TempDir;

use crate::serve_limits::Served;

const FIRST: &str =
    "let c = get_customer(#{id: 3});\nlet p = refund_policy();\nprint(\"got them\");\n";
const REST: &str = "[c.id, p.window_days]";

/// `toolscript ARGS` with `parts` written to stdin, `pause` apart; its exit code and stdout.
fn run_piped(args: &[&str], parts: &[&str], pause: Duration) -> (i32, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_toolscript"))
        .args(args)
        .env_remove("RUST_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    let mut stdin = child.stdin.take().unwrap();
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            std::thread::sleep(pause);
        }
        stdin.write_all(part.as_bytes()).unwrap();
        stdin.flush().unwrap();
    }
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8(out.stdout).unwrap(),
    )
}

#[test]
fn run_stream_reads_stdin_as_it_arrives_and_gives_the_whole_text_s_outcome() {
    let args = ["run", "-", "--stream", "--json", "--no-store"];
    let (code, out) = run_piped(&args, &[FIRST, REST], Duration::from_millis(400));
    assert_eq!(code, 0, "{out}");
    let streamed: Value = serde_json::from_str(&out).unwrap();
    let (code, out) = run_piped(
        &["run", "-", "--json", "--no-store"],
        &[FIRST, REST],
        Duration::ZERO,
    );
    assert_eq!(code, 0, "{out}");
    let whole: Value = serde_json::from_str(&out).unwrap();
    for key in ["value", "logs", "ok", "status"] {
        assert_eq!(
            streamed[key], whole[key],
            "{key}: {streamed:#} against {whole:#}"
        );
    }
    // Both reads were made while the text was held back, and claimed.
    assert_eq!(streamed["stats"]["speculative_claimed"], 2, "{streamed:#}");
    // A script file with --stream is refused, saying to give `-`.
    let (code, _) = run_piped(&["run", "x.rhai", "--stream"], &[], Duration::ZERO);
    assert_eq!(code, 2);
}

/// A chunked POST: the head, then each part as a chunk, `pause` apart, reading the answer's
/// head after the first part; returns (status, head, the body's JSON, when the head came).
fn post_chunked(
    addr: &str,
    query: &str,
    headers: &[&str],
    parts: &[&str],
    pause: Duration,
) -> (u16, String, Value, bool) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut head = format!(
        "POST /v1/stream{query} HTTP/1.1\r\nHost: {addr}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n"
    );
    for h in headers {
        head.push_str(h);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    let mut answer = Vec::new();
    let mut head_early = false;
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            std::thread::sleep(pause);
        }
        stream
            .write_all(format!("{:x}\r\n{part}\r\n", part.len()).as_bytes())
            .unwrap();
        if i == 0 && parts.len() > 1 {
            // The answer's head comes before the rest of the text is sent.
            let started = Instant::now();
            let mut buf = [0u8; 4096];
            while !answer.windows(4).any(|w| w == b"\r\n\r\n")
                && started.elapsed() < Duration::from_secs(10)
            {
                match stream.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => answer.extend_from_slice(&buf[..n]),
                    Err(_) => break,
                }
            }
            head_early = answer.windows(4).any(|w| w == b"\r\n\r\n");
        }
    }
    let _ = stream.write_all(b"0\r\n\r\n");
    let _ = stream.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = if head.to_lowercase().contains("transfer-encoding: chunked") {
        dechunk(body)
    } else {
        body.to_string()
    };
    let json = serde_json::from_str(body.trim()).unwrap_or(Value::String(body.clone()));
    (status, head.to_lowercase(), json, head_early)
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (n, v) = l.split_once(':')?;
        (n.trim() == name).then_some(v.trim())
    })
}

#[test]
fn serve_http_streams_a_chunked_script_and_answers_with_its_outcome() {
    let served = Served::start(&[]);
    let (status, head, outcome, early) = post_chunked(
        &served.addr,
        "?stats=true",
        &[],
        &[FIRST, REST],
        Duration::from_millis(300),
    );
    assert_eq!(status, 200, "{head}\n{outcome}");
    assert!(
        early,
        "the answer's head came before the text ended: {head}"
    );
    let run_id = header(&head, "toolscript-run-id").expect("the run's id in the head");
    assert_eq!(outcome["run_id"], run_id, "{outcome:#}");
    assert_eq!(outcome["ok"], true, "{outcome:#}");
    assert_eq!(outcome["value"][0], 3, "{outcome:#}");
    assert_eq!(outcome["logs"], serde_json::json!(["got them"]));
    assert_eq!(outcome["stats"]["speculative_claimed"], 2, "{outcome:#}");
    // A script that never parses fails as run_script's does; a bad option is named.
    let (status, _, outcome, _) =
        post_chunked(&served.addr, "", &[], &["let x = (;"], Duration::ZERO);
    assert_eq!(status, 200);
    assert_eq!(outcome["error"]["kind"], "invalid_script", "{outcome:#}");
    let (status, _, outcome, _) =
        post_chunked(&served.addr, "?fast=1", &[], &["1"], Duration::ZERO);
    assert_eq!(status, 400, "{outcome}");
    assert!(outcome["error"]["message"]
        .as_str()
        .unwrap()
        .contains("unknown query option"));
    let (status, _, outcome, _) = post_chunked(
        &served.addr,
        "?input=%7B%22id%22%3A7%7D",
        &[],
        &["input.id * 6"],
        Duration::ZERO,
    );
    assert_eq!(
        (status, &outcome["value"]),
        (200, &serde_json::json!(42)),
        "{outcome}"
    );
    // Only a POST streams a script.
    let mut stream = TcpStream::connect(&served.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let get = format!(
        "GET /v1/stream HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        served.addr
    );
    stream.write_all(get.as_bytes()).unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 405"), "{answer}");
    assert!(answer.contains("takes a POST"), "{answer}");
}

fn sha(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn under_auth_the_stream_needs_a_token_with_the_right_to_run() {
    let dir = TempDir::new().unwrap();
    let auth = format!(
        "[[token]]\nsha256 = \"{}\"\ntenant = \"acme\"\ncan = [\"run\"]\n\n[[token]]\nsha256 = \"{}\"\ntenant = \"acme\"\ncan = [\"read\"]\n",
        sha("runner-token"),
        sha("reader-token")
    );
    let path = dir.path().join("auth.toml");
    std::fs::write(&path, auth).unwrap();
    let store = dir.path().join("store.sqlite3");
    let served = Served::start(&[
        "--auth",
        path.to_str().unwrap(),
        "--store",
        store.to_str().unwrap(),
    ]);
    let (status, head, _, _) = post_chunked(&served.addr, "", &[], &["40 + 2"], Duration::ZERO);
    assert_eq!(status, 401, "{head}");
    let (status, _, _, _) = post_chunked(
        &served.addr,
        "",
        &["Authorization: Bearer wrong"],
        &["40 + 2"],
        Duration::ZERO,
    );
    assert_eq!(status, 401);
    let (status, _, outcome, _) = post_chunked(
        &served.addr,
        "",
        &["Authorization: Bearer reader-token"],
        &["40 + 2"],
        Duration::ZERO,
    );
    assert_eq!(status, 403, "{outcome}");
    assert!(outcome.to_string().contains("right `run`"), "{outcome}");
    let (status, _, outcome, _) = post_chunked(
        &served.addr,
        "",
        &["Authorization: Bearer runner-token"],
        &["let a = 40;\n", "a + 2"],
        Duration::from_millis(50),
    );
    assert_eq!(status, 200, "{outcome}");
    assert_eq!(outcome["value"], 42, "{outcome:#}");
}

/// Counts when it is dropped: a tool body's future dropped before it finished was cancelled.
struct OnDrop(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl Drop for OnDrop {
    fn drop(&mut self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A client that goes away in the middle of its script cuts the stream off: the read its
/// prefix started is cancelled at once (its body is dropped long before it would finish).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_mid_stream_cancels_the_reads_started() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tokio::io::AsyncWriteExt;
    use toolscript::{Effect, Registry, Runtime, Tool};
    let (started, dropped, finished) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let (s, d, f) = (
        Arc::clone(&started),
        Arc::clone(&dropped),
        Arc::clone(&finished),
    );
    let slow = Tool::builder("slow", Effect::Read).handler(move |_args| {
        s.fetch_add(1, Ordering::SeqCst);
        let (guard, f) = (OnDrop(Arc::clone(&d)), Arc::clone(&f));
        async move {
            let _guard = guard;
            tokio::time::sleep(Duration::from_secs(5)).await;
            f.fetch_add(1, Ordering::SeqCst);
            Ok(serde_json::json!(1))
        }
    });
    let runtime = Runtime::new(Registry::builder().tools(vec![slow]).build().unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let stop = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(toolscript::mcp::serve_http(
        runtime,
        listener,
        toolscript::mcp::HttpOptions::new(),
        stop.clone().cancelled_owned(),
    ));
    let mut client = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let chunk = "let a = slow(#{});\n";
    let head = format!(
        "POST /v1/stream HTTP/1.1\r\nHost: {addr}\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{chunk}\r\n",
        chunk.len()
    );
    client.write_all(head.as_bytes()).await.unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    while started.load(Ordering::SeqCst) == 0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        started.load(Ordering::SeqCst),
        1,
        "the prefix's read started"
    );
    drop(client);
    let gone = Instant::now();
    while dropped.load(Ordering::SeqCst) == 0 && gone.elapsed() < Duration::from_secs(4) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(dropped.load(Ordering::SeqCst), 1, "the read was cancelled");
    assert_eq!(finished.load(Ordering::SeqCst), 0, "and never finished");
    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), server).await;
}
