//! A throwaway PostgreSQL for the tests: one cluster for the test binary, made on first use in
//! a temporary folder (initdb, then pg_ctl listening on 127.0.0.1 only, at a free port, its
//! socket inside the folder), each test its own database. A guard process stops the cluster
//! (`pg_ctl stop -m immediate`) and removes its folder when this binary exits, however it
//! exits; a cluster a killed run left behind (its guard killed too) is stopped at the next
//! start.
//!
//! Where PostgreSQL cannot be started (no initdb), the tests that need it say they are skipped;
//! with `CI=true` they fail instead.

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};

/// The cluster, or why there is none.
static CLUSTER: OnceLock<Result<Cluster, String>> = OnceLock::new();

/// A running cluster.
pub struct Cluster {
    pub port: u16,
    /// How each test's database is made: with ICU's English collation where the server has
    /// ICU (not byte order: so that an order the store leaves to the collation shows), else
    /// the cluster's C.
    collation: &'static str,
    /// The root certificate of the server's TLS certificate (made for `localhost` only), when
    /// openssl could make one; the server then offers TLS.
    pub ca: Option<PathBuf>,
    bin: PathBuf,
    /// The guard: its standard input closes when this process ends, and it stops the cluster.
    _guard: Mutex<Child>,
}

/// The prefix of the clusters' folders in the temporary directory.
const PREFIX: &str = "toolscript-pg-";

/// A URL to a new, empty database of the test cluster (`name` made unique), or `None` after
/// saying the test is skipped. Under `CI=true`, no cluster is a failure.
pub fn database(name: &str) -> Option<String> {
    let cluster = match CLUSTER.get_or_init(start) {
        Ok(cluster) => cluster,
        Err(why) => {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("PostgreSQL is needed under CI=true, and could not be started: {why}");
            }
            eprintln!("SKIPPED (no PostgreSQL): {why}");
            return None;
        }
    };
    static COUNT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let db: String = format!("{name}_{n}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .take(60)
        .collect();
    cluster.psql(&format!("CREATE DATABASE {db} {}", cluster.collation));
    Some(cluster.url(&db))
}

impl Cluster {
    /// The URL of database `db`, as the superuser (trusted: no password is checked).
    pub fn url(&self, db: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{db}?sslmode=disable",
            self.port
        )
    }

    /// Runs `sql` in database `postgres` with psql, panicking with its output when it fails.
    pub fn psql(&self, sql: &str) {
        self.psql_in("postgres", sql);
    }

    /// The name of the database `url` names.
    pub fn db_of(url: &str) -> String {
        let tail = url.rsplit('/').next().unwrap_or_default();
        tail.split('?').next().unwrap_or_default().to_string()
    }

    /// Runs `sql` in database `db`; what it printed, unaligned, without headers.
    pub fn psql_in(&self, db: &str, sql: &str) -> String {
        let out = Command::new(self.bin.join("psql"))
            .args([
                "-X",
                "-q",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                "127.0.0.1",
            ])
            .args([
                "-U",
                "postgres",
                "-p",
                &self.port.to_string(),
                "-d",
                db,
                "-c",
                sql,
            ])
            .env("PGSSLMODE", "disable")
            .output()
            .expect("psql runs");
        assert!(
            out.status.success(),
            "psql {sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

/// The running cluster, when [`database`] made one.
pub fn cluster() -> &'static Cluster {
    CLUSTER
        .get()
        .and_then(|c| c.as_ref().ok())
        .expect("a test asked for the cluster after database() started it")
}

/// Where PostgreSQL's programs are: `$TOOLSCRIPT_PG_BIN`, the newest of Debian's
/// /usr/lib/postgresql/*/bin, else the PATH's.
fn bin_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("TOOLSCRIPT_PG_BIN") {
        return Some(PathBuf::from(dir));
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    found.sort();
    if let Some((_, bin)) = found.pop() {
        return Some(bin);
    }
    std::env::var_os("PATH")
        .and_then(|path| std::env::split_paths(&path).find(|dir| dir.join("initdb").exists()))
}

/// Whether this process runs as root (initdb refuses root: the cluster is then run as the
/// `postgres` user).
fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// A command running `program` of `bin`, as `postgres` when this process is root.
fn pg_command(bin: &Path, program: &str) -> Command {
    if is_root() {
        let mut command = Command::new("runuser");
        command
            .args(["-u", "postgres", "--"])
            .arg(bin.join(program));
        command
    } else {
        Command::new(bin.join(program))
    }
}

fn run(mut command: Command, what: &str) -> Result<(), String> {
    let out = command
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{what} cannot be run: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{what} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Stops the clusters earlier test runs left behind (their process is gone) and removes their
/// folders.
fn sweep(bin: &Path) {
    let Ok(entries) = std::fs::read_dir(base_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let Some(pid) = name
            .strip_prefix(PREFIX)
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let data = entry.path().join("data");
        if data.join("postmaster.pid").exists() {
            let mut stop = pg_command(bin, "pg_ctl");
            stop.args(["-D"])
                .arg(&data)
                .args(["stop", "-m", "immediate", "-w"]);
            let _ = run(stop, "pg_ctl stop");
        }
        let _ = std::fs::remove_dir_all(entry.path());
    }
}

/// Makes and starts the cluster, and its guard.
fn start() -> Result<Cluster, String> {
    let bin = bin_dir().ok_or("initdb was not found (install PostgreSQL: bash .ci/setup)")?;
    sweep(&bin);
    let root = base_dir().join(format!("{PREFIX}{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).map_err(|e| format!("{}: {e}", root.display()))?;
    if is_root() {
        run(
            {
                let mut c = Command::new("chown");
                c.arg("postgres:").arg(&root);
                c
            },
            "chown",
        )?;
    }
    let data = root.join("data");
    let mut initdb = pg_command(&bin, "initdb");
    initdb.arg("-D").arg(&data).args([
        "-A",
        "trust",
        "-U",
        "postgres",
        "--no-sync",
        "-E",
        "UTF8",
        "--locale=C",
    ]);
    run(initdb, "initdb")?;
    let tls = certificates(&root, &data);
    // A free port: taken, then let go for the server (another process could take it between;
    // the start then fails, saying so).
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free port: {e}"))?
        .port();
    let options = format!(
        "-c listen_addresses=127.0.0.1 -p {port} -k {} -c fsync=off -c synchronous_commit=off \
         -c full_page_writes=off -c max_connections=200{}",
        root.display(),
        if tls.is_some() {
            " -c ssl=on -c ssl_cert_file=server.crt -c ssl_key_file=server.key"
        } else {
            ""
        }
    );
    let mut pg_ctl = pg_command(&bin, "pg_ctl");
    pg_ctl
        .arg("-D")
        .arg(&data)
        .args(["-o", &options, "-l"])
        .arg(root.join("log"))
        .args(["-w", "-t", "60", "start"]);
    run(pg_ctl, "pg_ctl start").map_err(|e| {
        let log = std::fs::read_to_string(root.join("log")).unwrap_or_default();
        format!("{e}\n{log}")
    })?;
    // The guard, in a process group of its own (a signal to the tests' group spares it): when
    // this process ends, its standard input closes; it stops the cluster and removes it.
    let stop = format!(
        "cat >/dev/null; {} -D '{}' stop -m immediate -w >/dev/null 2>&1; rm -rf '{}'",
        if is_root() {
            format!("runuser -u postgres -- '{}'", bin.join("pg_ctl").display())
        } else {
            format!("'{}'", bin.join("pg_ctl").display())
        },
        data.display(),
        root.display()
    );
    let mut guard = Command::new("sh");
    guard.args(["-c", &stop]).stdin(Stdio::piped());
    std::os::unix::process::CommandExt::process_group(&mut guard, 0);
    let mut guard = guard
        .spawn()
        .map_err(|e| format!("the cluster's guard cannot start: {e}"))?;
    // Nothing is written: the pipe only has to stay open.
    let _ = guard.stdin.as_mut().map(|s| s.flush());
    let mut cluster = Cluster {
        port,
        ca: tls,
        bin,
        _guard: Mutex::new(guard),
        collation: "",
    };
    let icu = "TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C'";
    let probe = Command::new(cluster.bin.join("psql"))
        .args([
            "-X",
            "-q",
            "-h",
            "127.0.0.1",
            "-U",
            "postgres",
            "-p",
            &port.to_string(),
        ])
        .args([
            "-d",
            "postgres",
            "-c",
            &format!("CREATE DATABASE icu_probe {icu}"),
        ])
        .env("PGSSLMODE", "disable")
        .output();
    if probe.is_ok_and(|o| o.status.success()) {
        cluster.collation = icu;
    }
    Ok(cluster)
}

/// Makes a root certificate and, signed by it, the server's certificate for `localhost` alone
/// (not 127.0.0.1: so that `verify-full` to the address fails and `verify-ca` passes), its key
/// in the cluster's `data` readable by the server only. The root's path, or `None` when
/// openssl cannot make them (the server then offers no TLS).
fn certificates(root: &Path, data: &Path) -> Option<PathBuf> {
    let dir = root.join("tls");
    std::fs::create_dir_all(&dir).ok()?;
    let ext = dir.join("ext.cnf");
    std::fs::write(
        &ext,
        "subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
    )
    .ok()?;
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let steps: [Vec<&str>; 3] = [
        [
            &["req", "-x509"][..],
            &ec,
            &[
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-days",
                "2",
                "-subj",
                "/CN=toolscript test root",
            ],
        ]
        .concat(),
        [
            &["req"][..],
            &ec,
            &[
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
                "-subj",
                "/CN=localhost",
            ],
        ]
        .concat(),
        vec![
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
        ],
    ];
    for step in steps {
        let mut command = Command::new("openssl");
        command.args(step).current_dir(&dir);
        if let Err(why) = run(command, "openssl") {
            eprintln!("the test cluster offers no TLS: {why}");
            return None;
        }
    }
    for file in ["server.crt", "server.key"] {
        std::fs::copy(dir.join(file), data.join(file)).ok()?;
    }
    let mut own = Command::new("chmod");
    own.arg("600").arg(data.join("server.key"));
    run(own, "chmod").ok()?;
    if is_root() {
        let mut own = Command::new("chown");
        own.arg("postgres:")
            .arg(data.join("server.crt"))
            .arg(data.join("server.key"));
        run(own, "chown").ok()?;
    }
    Some(dir.join("ca.crt"))
}

/// Where clusters' folders are made: /tmp when the cluster runs as `postgres` (a `$TMPDIR` of
/// root's own may be closed to that user), else the temporary directory.
fn base_dir() -> PathBuf {
    if is_root() {
        PathBuf::from("/tmp")
    } else {
        std::env::temp_dir()
    }
}
