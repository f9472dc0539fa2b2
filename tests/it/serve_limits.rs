//! `toolscript serve --http` against misbehaving clients: half-open connections, floods of
//! connections and of `initialize` posts, a server out of file descriptors, duplicate `Host`
//! headers, foreign `Origin`s, silent connections. Every read has a generous deadline, so that a
//! hang fails the test; nothing asserts how fast anything is.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Every answer must come within this: a hang is the failure.
const DEADLINE: Duration = Duration::from_secs(10);

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}"#;
const INITIALIZED: &str = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
const CALL: &str = r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"run_script","arguments":{"script":"40 + 2"}}}"#;

/// A `toolscript serve --http 127.0.0.1:0` process, killed when dropped.
pub(crate) struct Served {
    child: Child,
    pub(crate) addr: String,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl Served {
    pub(crate) fn start(args: &[&str]) -> Served {
        Served::start_in(&[], args)
    }

    /// [`Served::start`] with the environment variables `env`.
    pub(crate) fn start_in(env: &[(&str, &str)], args: &[&str]) -> Served {
        let mut command = Command::new(env!("CARGO_BIN_EXE_toolscript"));
        command.envs(env.iter().copied());
        Served::start_with(command, "127.0.0.1:0", args)
    }

    /// Kills the server (SIGKILL): it stops at once, in the middle of whatever it does.
    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts `command` (the binary, or a shell that executes it) with `serve --http ADDR ARGS`.
    fn start_with(mut command: Command, addr: &str, args: &[&str]) -> Served {
        let mut child = command
            .args(["serve", "--http", addr])
            .args(args)
            .env_remove("RUST_LOG")
            .env("TOOLSCRIPT_STORE", crate::support::test_store())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("toolscript serve --http starts");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        let pipe = child.stderr.take().expect("stderr is piped");
        let lines = Arc::clone(&stderr);
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                if let Some(url) = line.strip_prefix("toolscript: serving MCP on http://") {
                    let _ = tx.send(url.trim_end_matches("/mcp").to_string());
                }
                lines.lock().unwrap().push(line);
            }
        });
        let Ok(addr) = rx.recv_timeout(Duration::from_secs(60)) else {
            let _ = child.kill();
            panic!(
                "the server never said where it listens; stderr:\n{}",
                stderr.lock().unwrap().join("\n")
            );
        };
        Served {
            child,
            addr,
            stderr,
        }
    }

    pub(crate) fn stderr(&self) -> Vec<String> {
        self.stderr.lock().unwrap().clone()
    }

    /// The server's resident memory, in KiB (Linux).
    fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("the server's /proc status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS in /proc status")
    }
}

impl Served {
    /// The server's resident memory once it has stopped growing by itself (a second without
    /// growing by more than 256 KiB, within a minute).
    fn settled_rss_kib(&self) -> u64 {
        let mut last = self.rss_kib();
        for _ in 0..60 {
            std::thread::sleep(Duration::from_secs(1));
            let now = self.rss_kib();
            if now <= last + 256 {
                return now;
            }
            last = now;
        }
        last
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An answer: its status, head (lowercase) and body.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) head: String,
    pub(crate) body: String,
}

impl Answer {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|l| {
            let (n, v) = l.split_once(':')?;
            (n.trim() == name).then_some(v.trim())
        })
    }
}

/// One request on a fresh connection (`Connection: close`), with `extra` header lines; the
/// answer must come within [`DEADLINE`].
fn request(addr: &str, method: &str, extra: &[&str], body: &str) -> Answer {
    let stream = TcpStream::connect(addr).expect("the server accepts");
    exchange(stream, addr, method, extra, body)
}

/// A connection to `addr` from the loopback address `from` (another peer than 127.0.0.1: Linux
/// routes all of 127.0.0.0/8 to the loopback interface).
fn connect_from(from: [u8; 4], addr: &str) -> TcpStream {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .unwrap();
    runtime.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket
            .bind(std::net::SocketAddr::from((from, 0)))
            .expect("a loopback source address");
        let stream = socket
            .connect(addr.parse().unwrap())
            .await
            .expect("the server accepts");
        let stream = stream.into_std().unwrap();
        stream.set_nonblocking(false).unwrap();
        stream
    })
}

/// One request on `stream`, as [`request`] sends it.
fn exchange(mut stream: TcpStream, addr: &str, method: &str, extra: &[&str], body: &str) -> Answer {
    stream.set_read_timeout(Some(DEADLINE)).unwrap();
    let mut head = format!(
        "{method} /mcp HTTP/1.1\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nConnection: close\r\n\
         Content-Length: {}\r\n",
        body.len()
    );
    if !extra.iter().any(|h| h.to_lowercase().starts_with("host:")) {
        head.push_str(&format!("Host: {addr}\r\n"));
    }
    for line in extra {
        head.push_str(line);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body.as_bytes()).unwrap();
    let mut response = Vec::new();
    if let Err(e) = stream.read_to_end(&mut response) {
        panic!(
            "no whole answer within {DEADLINE:?} ({e}); got: {}",
            String::from_utf8_lossy(&response)
        );
    }
    let response = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {response:?}"));
    Answer {
        status,
        head: head.to_lowercase(),
        body: body.to_string(),
    }
}

pub(crate) fn post(addr: &str, extra: &[&str], body: &str) -> Answer {
    request(addr, "POST", extra, body)
}

/// Whether the server closed `stream` (end of file, or reset) before [`DEADLINE`]; any bytes it
/// sent first are returned.
fn closed_by_server(stream: &mut TcpStream) -> Result<Vec<u8>, String> {
    stream.set_read_timeout(Some(DEADLINE)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return Ok(got),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(got),
            Err(e) => return Err(format!("still open after {DEADLINE:?}: {e}")),
        }
    }
}

/// Connections that send a partial request line, then a byte now and then, until stopped.
struct HalfOpen {
    stop: Arc<AtomicBool>,
    trickler: Option<std::thread::JoinHandle<usize>>,
}

impl HalfOpen {
    /// `count` connections, each given `patience` to connect.
    fn open(addr: &str, count: usize, patience: Duration) -> HalfOpen {
        let mut streams = Vec::with_capacity(count);
        for _ in 0..count {
            // Past the server's caps a connection may be refused or closed at once: still one of
            // the flood. A server that accepts nothing more (out of descriptors) leaves the
            // rest waiting in the listen queue, and past it unanswered: not waited for.
            let addr = addr.parse().expect("an address");
            if let Ok(mut stream) = TcpStream::connect_timeout(&addr, patience) {
                let _ = stream.write_all(b"POST /mcp HTT");
                streams.push(stream);
            }
        }
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let trickler = std::thread::spawn(move || {
            let opened = streams.len();
            while !stopped.load(Ordering::Relaxed) {
                for stream in &mut streams {
                    let _ = stream.write_all(b"P");
                }
                std::thread::sleep(Duration::from_millis(300));
            }
            opened
        });
        HalfOpen {
            stop,
            trickler: Some(trickler),
        }
    }

    /// Stops and closes them all; how many were opened.
    fn close(mut self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        self.trickler.take().unwrap().join().unwrap()
    }
}

impl Drop for HalfOpen {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn structured_value(answer: &Answer) -> Value {
    let json: Value = serde_json::from_str(&answer.body)
        .unwrap_or_else(|e| panic!("a JSON answer ({e}): {answer:?}"));
    json["result"]["structuredContent"]["value"].clone()
}

/// The lines the server wrote after the one that says where it listens.
fn log_lines(served: &Served) -> Vec<String> {
    served
        .stderr()
        .into_iter()
        .filter(|l| !l.starts_with("toolscript: serving MCP on"))
        .collect()
}

/// The server's log lines once one of them satisfies `wanted`, or after 10 s: a line the server
/// writes as it answers may reach the pipe, and the thread that reads it, after the answer.
fn log_lines_with(served: &Served, wanted: impl Fn(&str) -> bool) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let lines = log_lines(served);
        if lines.iter().any(|l| wanted(l)) || Instant::now() >= deadline {
            return lines;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The binary, started by a shell that first lowers its limit of open files to `limit`.
#[cfg(unix)]
fn with_descriptors(limit: u32) -> Command {
    let mut shell = Command::new("sh");
    shell.args([
        "-c",
        &format!("ulimit -n {limit} && exec \"$0\" \"$@\""),
        env!("CARGO_BIN_EXE_toolscript"),
    ]);
    shell
}

/// The operator's case: a server with the usual 1,024 descriptors and its default caps, 1,100
/// half-open connections. Without a cap below the descriptors, the server stops accepting and
/// the request waits for ever; the caps keep descriptors free, and the half-open connections are
/// the first to go.
#[cfg(unix)]
#[test]
fn half_open_connections_leave_a_legitimate_request_answered_and_the_log_quiet() {
    let served = Served::start_with(
        with_descriptors(1024),
        "127.0.0.1:0",
        &["--header-timeout-s", "30"],
    );
    let flood = HalfOpen::open(&served.addr, 1100, DEADLINE);
    // The header timeout (30 s) has not closed them. A client elsewhere (another address) gets
    // in and is answered, twice, while they go on trickling.
    for _ in 0..2 {
        let stream = connect_from([127, 0, 0, 2], &served.addr);
        let answer = exchange(stream, &served.addr, "POST", &[], CALL);
        assert_eq!(answer.status, 200, "{answer:?}");
        assert_eq!(structured_value(&answer), 42, "{answer:?}");
        std::thread::sleep(Duration::from_millis(700));
    }
    // From the flood's own address too: its oldest half-open connection makes room.
    let answer = post(&served.addr, &[], CALL);
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(
        flood.close(),
        1100,
        "the flood opened its 1,100 connections"
    );
    let lines = log_lines(&served);
    assert!(
        lines.len() <= 5,
        "1,100 connections leave a quiet log, not {} lines:\n{}",
        lines.len(),
        lines.join("\n")
    );
}

#[test]
fn connections_all_busy_refuse_a_new_one_at_once() {
    let served = Served::start(&["--max-connections-per-peer", "2"]);
    let slow = r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"run_script","arguments":{"script":"sleep(6.0); 1"}}}"#;
    let busy: Vec<_> = (0..2)
        .map(|_| {
            let addr = served.addr.clone();
            std::thread::spawn(move || post(&addr, &[], slow))
        })
        .collect();
    // Until both requests are read, their connections are idle ones and a new one would close
    // the oldest to make room: wait for them to be in progress.
    std::thread::sleep(Duration::from_millis(1500));
    let mut stream = TcpStream::connect(&served.addr).unwrap();
    let got = closed_by_server(&mut stream).expect("a refused connection is closed at once");
    let refused = String::from_utf8_lossy(&got).into_owned();
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(refused.contains("too many connections"), "{refused}");
    for handle in busy {
        let answer = handle.join().unwrap();
        assert_eq!(
            answer.status, 200,
            "busy connections are never closed: {answer:?}"
        );
    }
    // Once they are done, a new one is admitted.
    assert_eq!(post(&served.addr, &[], CALL).status, 200);
    let refused = |l: &str| l.contains("refused a connection");
    let refusals = log_lines_with(&served, refused)
        .into_iter()
        .filter(|l| refused(l))
        .count();
    assert!(
        refusals >= 1,
        "the refusal is logged: {:?}",
        served.stderr()
    );
}

#[cfg(unix)]
#[test]
fn out_of_descriptors_the_accept_loop_logs_a_line_a_second_and_recovers() {
    // A server with few descriptors and a connection cap above them: `accept` fails with
    // EMFILE while the flood lasts.
    let served = Served::start_with(
        with_descriptors(96),
        "127.0.0.1:0",
        &[
            "--max-connections",
            "1000",
            "--max-connections-per-peer",
            "1000",
            "--header-timeout-s",
            "30",
        ],
    );
    let started = Instant::now();
    let flood = HalfOpen::open(&served.addr, 400, Duration::from_millis(300));
    std::thread::sleep(Duration::from_secs(3));
    let failures: Vec<String> = log_lines(&served)
        .into_iter()
        .filter(|l| l.contains("accepting a connection failed"))
        .collect();
    let elapsed = started.elapsed().as_secs() + 1;
    assert!(
        served
            .stderr()
            .iter()
            .any(|l| l.contains("--max-connections 1000 is more than the limit of open files")),
        "a cap above the descriptors is warned about: {:?}",
        served.stderr()
    );
    assert!(
        !failures.is_empty(),
        "the server ran out of descriptors (else this test tests nothing): {:?}",
        served.stderr()
    );
    assert!(
        failures.len() as u64 <= elapsed + 1,
        "at most a line a second ({} lines in about {elapsed} s):\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        failures
            .iter()
            .any(|l| l.contains("held_back=") && !l.contains("held_back=0")),
        "the lines count what they held back:\n{}",
        failures.join("\n")
    );
    // The flood ends: the server closes its side, and answers again.
    flood.close();
    let recovered = Instant::now();
    loop {
        if let Ok(answer) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            post(&served.addr, &[], CALL)
        })) {
            if answer.status == 200 {
                break;
            }
        }
        assert!(
            recovered.elapsed() < Duration::from_secs(30),
            "the server never answered again after the flood: {:?}",
            served.stderr()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[cfg(target_os = "linux")]
#[test]
fn initialize_floods_leave_the_live_sessions_bounded() {
    let served = Served::start(&["--stateful", "--max-sessions", "20"]);
    // What the process loads once in the background (the tokenizer) is loaded by then.
    let before = served.settled_rss_kib();
    let (mut accepted, mut refused) = (0, 0);
    for _ in 0..3000 {
        let answer = post(&served.addr, &[], INITIALIZE);
        match answer.status {
            200 => {
                assert!(answer.header("mcp-session-id").is_some(), "{answer:?}");
                accepted += 1;
            }
            503 => {
                let json: Value = serde_json::from_str(&answer.body)
                    .unwrap_or_else(|e| panic!("a JSON-RPC error body ({e}): {answer:?}"));
                assert_eq!(json["jsonrpc"], "2.0", "{json}");
                let message = json["error"]["message"].as_str().unwrap_or_default();
                assert!(message.contains("--max-sessions"), "{json}");
                assert!(answer.header("retry-after").is_some(), "{answer:?}");
                refused += 1;
            }
            _ => panic!("an initialize is accepted or refused with 503: {answer:?}"),
        }
    }
    assert_eq!(accepted, 20, "the cap: exactly 20 sessions live");
    assert_eq!(refused, 2980);
    let after = served.rss_kib();
    // Each session kept takes some 90 KB: 3,000 would take over 250 MB.
    assert!(
        after < before + 30 * 1024,
        "RSS grew from {before} KiB to {after} KiB"
    );
}

#[test]
fn concurrent_initialize_posts_at_the_cap_are_accepted_or_refused_never_failed() {
    let served = Served::start(&["--stateful", "--max-sessions", "10"]);
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let addr = served.addr.clone();
            std::thread::spawn(move || {
                (0..40)
                    .map(|_| post(&addr, &[], INITIALIZE).status)
                    .collect::<Vec<u16>>()
            })
        })
        .collect();
    let statuses: Vec<u16> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    let accepted = statuses.iter().filter(|s| **s == 200).count();
    let refused = statuses.iter().filter(|s| **s == 503).count();
    assert_eq!(accepted, 10, "{statuses:?}");
    assert_eq!(
        refused, 310,
        "no other answer than 200 or 503: {statuses:?}"
    );
}

#[test]
fn one_address_holds_at_most_its_share_of_sessions() {
    let served = Served::start(&[
        "--stateful",
        "--max-sessions",
        "10",
        "--max-sessions-per-peer",
        "3",
    ]);
    let mut ids = Vec::new();
    for _ in 0..3 {
        let answer = post(&served.addr, &[], INITIALIZE);
        assert_eq!(answer.status, 200, "{answer:?}");
        ids.push(answer.header("mcp-session-id").unwrap().to_string());
    }
    let refused = post(&served.addr, &[], INITIALIZE);
    assert_eq!(refused.status, 503, "{refused:?}");
    assert!(
        refused.body.contains("--max-sessions-per-peer"),
        "{refused:?}"
    );
    // Another address still gets its own.
    let stream = connect_from([127, 0, 0, 3], &served.addr);
    let answer = exchange(stream, &served.addr, "POST", &[], INITIALIZE);
    assert_eq!(answer.status, 200, "{answer:?}");
    // A session closed (DELETE) gives its place back.
    let session = format!("Mcp-Session-Id: {}", ids[0]);
    let closed = request(&served.addr, "DELETE", &[&session], "");
    assert!(closed.status < 300, "{closed:?}");
    assert_eq!(post(&served.addr, &[], INITIALIZE).status, 200);
    assert_eq!(post(&served.addr, &[], INITIALIZE).status, 503);
}

#[test]
fn unused_sessions_expire_soon_and_used_ones_do_not() {
    let served = Served::start(&[
        "--stateful",
        "--max-sessions",
        "3",
        "--session-unused-expiry-s",
        "1",
    ]);
    // One session is used: initialized, then a call.
    let used = post(&served.addr, &[], INITIALIZE);
    let id = used
        .header("mcp-session-id")
        .expect("a session")
        .to_string();
    let session = format!("Mcp-Session-Id: {id}");
    let version = "MCP-Protocol-Version: 2025-06-18";
    let note = post(&served.addr, &[&session, version], INITIALIZED);
    assert_eq!(note.status, 202, "{note:?}");
    let call = post(&served.addr, &[&session, version], CALL);
    assert_eq!(call.status, 200, "{call:?}");
    assert!(call.body.contains("\"value\":42"), "{call:?}");
    // Two unused ones fill the cap.
    for _ in 0..2 {
        assert_eq!(post(&served.addr, &[], INITIALIZE).status, 200);
    }
    assert_eq!(post(&served.addr, &[], INITIALIZE).status, 503);
    // The unused ones expire: room again.
    let started = Instant::now();
    while post(&served.addr, &[], INITIALIZE).status != 200 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "unused sessions never expired"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The used one lives on past the short expiry.
    let again = post(&served.addr, &[&session, version], CALL);
    assert_eq!(again.status, 200, "the used session was kept: {again:?}");
}

#[test]
fn duplicate_host_headers_are_refused() {
    let served = Served::start(&[]);
    let host = format!("Host: {}", served.addr);
    let answer = post(&served.addr, &[&host, "Host: evil.example"], INITIALIZE);
    assert_eq!(answer.status, 400, "{answer:?}");
    assert!(answer.body.contains("more than one Host"), "{answer:?}");
    // The same one twice too: a proxy and the server might read different ones.
    let answer = post(&served.addr, &[&host, &host], INITIALIZE);
    assert_eq!(answer.status, 400, "{answer:?}");
    assert_eq!(post(&served.addr, &[&host], INITIALIZE).status, 200);
}

#[test]
fn origins_are_checked_against_loopback_and_the_allowed_list() {
    let served = Served::start(&["--allow-origin", "https://app.example.com"]);
    let port = served.addr.rsplit(':').next().unwrap().to_string();
    for (origin, status) in [
        (None, 200),
        (Some("http://localhost:5173".to_string()), 200),
        (Some(format!("http://127.0.0.1:{port}")), 200),
        (Some("http://[::1]:8080".to_string()), 200),
        (Some("https://app.example.com".to_string()), 200),
        (Some("https://app.example.com:443".to_string()), 200),
        (Some("https://app.example.com:8443".to_string()), 403),
        (Some("http://app.example.com".to_string()), 403),
        (Some("http://evil.example".to_string()), 403),
        (Some("http://localhost.evil.example".to_string()), 403),
        (Some("null".to_string()), 403),
        (Some("not an origin".to_string()), 403),
    ] {
        let header = origin.as_ref().map(|o| format!("Origin: {o}"));
        let extra: Vec<&str> = header.iter().map(String::as_str).collect();
        let answer = post(&served.addr, &extra, INITIALIZE);
        assert_eq!(answer.status, status, "Origin {origin:?}: {answer:?}");
    }
}

#[test]
fn hosts_are_checked_and_a_flood_of_refusals_leaves_the_log_quiet() {
    let served = Served::start(&["--allow-host", "mcp.example.com"]);
    let port = served.addr.rsplit(':').next().unwrap().to_string();
    for (host, status) in [
        (format!("localhost:{port}"), 200),
        ("mcp.example.com".to_string(), 200),
        ("evil.example".to_string(), 403),
        ("localhost.evil.example".to_string(), 403),
        ("user@localhost".to_string(), 400),
    ] {
        let header = format!("Host: {host}");
        let answer = post(&served.addr, &[&header], INITIALIZE);
        assert_eq!(answer.status, status, "Host {host}: {answer:?}");
        if status == 403 {
            assert!(answer.body.contains("--allow-host"), "{answer:?}");
        }
    }
    let started = Instant::now();
    for _ in 0..300 {
        let answer = post(&served.addr, &["Origin: http://evil.example"], INITIALIZE);
        assert_eq!(answer.status, 403, "{answer:?}");
        assert!(answer.body.contains("--allow-origin"), "{answer:?}");
    }
    // One more after a second: its line says how many were held back.
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(
        post(&served.addr, &["Host: evil.example"], INITIALIZE).status,
        403
    );
    let held_back = |l: &str| l.contains("held_back=") && !l.contains("held_back=0");
    let lines = log_lines_with(&served, held_back);
    let seconds = started.elapsed().as_secs() + 2;
    assert!(
        lines.len() as u64 <= seconds + 2,
        "refusals are said at most once a second ({} lines in about {seconds} s):\n{}",
        lines.len(),
        lines.join("\n")
    );
    assert!(
        lines.iter().any(|l| held_back(l)),
        "the lines count what they held back:\n{}",
        lines.join("\n")
    );
}

#[test]
fn an_allowed_origin_that_is_not_an_origin_is_a_usage_error() {
    let output = Command::new(env!("CARGO_BIN_EXE_toolscript"))
        .args([
            "serve",
            "--http",
            "127.0.0.1:0",
            "--allow-origin",
            "app.example.com",
        ])
        .env("TOOLSCRIPT_STORE", crate::support::test_store())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("not an origin") && stderr.contains("scheme://host"),
        "{stderr}"
    );
}

#[test]
fn the_header_timeout_closes_silent_and_slow_connections() {
    let served = Served::start(&["--header-timeout-s", "1"]);
    // Silent.
    let mut silent = TcpStream::connect(&served.addr).unwrap();
    closed_by_server(&mut silent).expect("a silent connection is closed");
    // A byte now and then never finishes the head.
    let mut slow = TcpStream::connect(&served.addr).unwrap();
    slow.write_all(b"POST /mcp HTTP/1.1\r\n").unwrap();
    let writer = slow.try_clone().unwrap();
    let trickle = std::thread::spawn(move || {
        let mut writer = writer;
        for _ in 0..40 {
            std::thread::sleep(Duration::from_millis(250));
            if writer.write_all(b"X").is_err() {
                return true;
            }
        }
        false
    });
    closed_by_server(&mut slow).expect("a slow head is closed");
    drop(trickle);
    // A kept-alive connection that sends nothing after its answer.
    let mut kept = TcpStream::connect(&served.addr).unwrap();
    write!(
        kept,
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: {}\r\n\r\n{INITIALIZE}",
        served.addr,
        INITIALIZE.len()
    )
    .unwrap();
    let got = closed_by_server(&mut kept).expect("an idle kept-alive connection is closed");
    assert!(
        got.starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
}

#[test]
fn the_idle_timeout_closes_a_quiet_connection_before_a_longer_header_timeout() {
    let served = Served::start(&["--header-timeout-s", "300", "--idle-timeout-s", "1"]);
    let mut silent = TcpStream::connect(&served.addr).unwrap();
    closed_by_server(&mut silent).expect("a quiet connection is closed by the idle timeout");
    // A request in progress is not idle, however quiet: a script that sleeps past the idle
    // timeout is answered.
    let slow = r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"run_script","arguments":{"script":"sleep(2.5); 7"}}}"#;
    let answer = post(&served.addr, &[], slow);
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(structured_value(&answer), 7, "{answer:?}");
}

#[test]
fn a_body_that_stops_arriving_gets_408() {
    let served = Served::start(&["--idle-timeout-s", "1"]);
    let mut stream = TcpStream::connect(&served.addr).unwrap();
    write!(
        stream,
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: 500\r\n\r\n{{\"jsonrpc\"",
        served.addr
    )
    .unwrap();
    let got = closed_by_server(&mut stream).expect("answered and closed");
    let got = String::from_utf8_lossy(&got);
    assert!(got.starts_with("HTTP/1.1 408"), "{got}");
    assert!(got.contains("did not arrive"), "{got}");
}

#[test]
fn binding_off_loopback_warns_that_there_is_no_authentication() {
    let open = Served::start_with(
        Command::new(env!("CARGO_BIN_EXE_toolscript")),
        "0.0.0.0:0",
        &[],
    );
    let warned = |served: &Served| {
        served
            .stderr()
            .iter()
            .any(|l| l.contains("not a loopback address") && l.contains("without authentication"))
    };
    // The warning comes before the line that says where it listens.
    assert!(warned(&open), "{:?}", open.stderr());
    let local = Served::start(&[]);
    assert!(!warned(&local), "{:?}", local.stderr());
}
