//! Where the database servers are: a URL from the environment, else a container started
//! once per test binary when a Docker engine is reachable, else a skip with a reason.
//!
//! Containers are labelled with this process's session (see [`SESSION_LABEL`]) and removed
//! by a watcher process when the test binary exits, however it exits (see [`watch`]).

use std::io::{Read, Write};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use testcontainers_modules::mariadb::Mariadb;
use testcontainers_modules::postgres::Postgres;
use testcontainers_modules::testcontainers::bollard::API_DEFAULT_VERSION;
use testcontainers_modules::testcontainers::runners::SyncRunner;
use testcontainers_modules::testcontainers::{Container, ContainerRequest, Image, ImageExt};

use super::Unavailable;

type Found = Result<String, Unavailable>;

/// The PostgreSQL server's URL (shared by all tests of the binary; pools are not).
pub fn postgres_url() -> Found {
    static URL: OnceLock<Found> = OnceLock::new();
    URL.get_or_init(|| {
        find("DBLOCK_TEST_POSTGRES_URL", || {
            let image = env_or("DBLOCK_TEST_POSTGRES_IMAGE", "postgres");
            let tag = env_or("DBLOCK_TEST_POSTGRES_TAG", "15-alpine");
            let request = labelled(Postgres::default().with_host_auth())
                .with_name(image)
                .with_tag(tag);
            start(request, 5432, |host, port| {
                format!("postgres://postgres@{host}:{port}/postgres")
            })
        })
    })
    .clone()
}

/// The MySQL/MariaDB server's URL.
pub fn mysql_url() -> Found {
    static URL: OnceLock<Found> = OnceLock::new();
    URL.get_or_init(|| {
        find("DBLOCK_TEST_MYSQL_URL", || {
            let image = env_or("DBLOCK_TEST_MYSQL_IMAGE", "mariadb");
            let tag = env_or("DBLOCK_TEST_MYSQL_TAG", "10.11");
            let request = labelled(Mariadb::default()).with_name(image).with_tag(tag);
            start(request, 3306, |host, port| {
                format!("mysql://root@{host}:{port}/test")
            })
        })
    })
    .clone()
}

/// Reports a skipped backend once per binary, or fails if `DBLOCK_TEST_REQUIRE` names it.
pub fn skip(backend: &str, reason: &str) {
    let required = std::env::var("DBLOCK_TEST_REQUIRE").unwrap_or_default();
    if required
        .split(',')
        .any(|name| name.trim().eq_ignore_ascii_case(backend))
    {
        panic!("{backend} is required by DBLOCK_TEST_REQUIRE but unavailable: {reason}");
    }
    static REPORTED: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut reported = REPORTED.lock().unwrap_or_else(PoisonError::into_inner);
    if !reported.iter().any(|b| b == backend) {
        reported.push(backend.to_owned());
        // Straight to the process's stderr: the test harness captures eprintln!.
        let _ = writeln!(
            std::io::stderr(),
            "skipping {backend} tests: {reason} (set DBLOCK_TEST_REQUIRE={backend} to fail instead)"
        );
    }
}

fn find(url_var: &str, start: impl FnOnce() -> Result<String, String> + Send) -> Found {
    if let Some(url) = std::env::var(url_var).ok().filter(|u| !u.is_empty()) {
        return Ok(url);
    }
    if !docker_reachable() {
        return Err(Unavailable::Skip(format!(
            "{url_var} unset and no Docker engine (DOCKER_HOST unset, /var/run/docker.sock not connectable)"
        )));
    }
    let broken = |err: String| Unavailable::Broken(format!("{url_var} unset; {err}"));
    check_api_version().map_err(broken)?;
    watch();
    // The sync runner drives its own runtime and must not run on a tokio worker thread.
    std::thread::scope(|s| s.spawn(start).join())
        .unwrap_or_else(|_| Err("starting the container panicked".to_owned()))
        .map_err(broken)
}

fn docker_reachable() -> bool {
    if std::env::var_os("DOCKER_HOST").is_some_and(|h| !h.is_empty()) {
        return true;
    }
    #[cfg(unix)]
    {
        std::os::unix::net::UnixStream::connect("/var/run/docker.sock").is_ok()
    }
    #[cfg(not(unix))]
    {
        false
    }
}

/// The Docker API version. testcontainers 0.27 talks to the engine through bollard 0.20,
/// which writes its `API_DEFAULT_VERSION` (1.52) into every request path; testcontainers
/// never calls bollard's `negotiate_version`, and neither of them reads
/// `DOCKER_API_VERSION` or a testcontainers property for it, so the version cannot be
/// pinned from outside. Engines before Docker 29 refuse it (Debian 12's docker.io 20.10
/// answers "client version 1.52 is too new. Maximum supported API version is 1.41").
/// `.ci/docker-api-proxy` bridges that: a socket that lowers the version in request paths
/// to the engine's own, which CI points `DOCKER_HOST` at. This asks the engine (or the
/// proxy) once, with bollard's own version, so a mismatch — today's, or a future bollard's
/// — is one clear message instead of a failure deep inside testcontainers.
fn check_api_version() -> Result<(), String> {
    static CHECKED: OnceLock<Result<(), String>> = OnceLock::new();
    CHECKED
        .get_or_init(|| {
            let version = format!(
                "{}.{}",
                API_DEFAULT_VERSION.major_version, API_DEFAULT_VERSION.minor_version
            );
            let host = std::env::var("DOCKER_HOST")
                .ok()
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| "unix:///var/run/docker.sock".to_owned());
            let Some(reply) = docker_get(&host, &format!("/v{version}/version")) else {
                // Not a Unix socket or plain TCP, or no answer: testcontainers will say more.
                return Ok(());
            };
            let status = reply.lines().next().unwrap_or_default();
            if status.split_whitespace().nth(1) == Some("200") {
                return Ok(());
            }
            let body = reply.split("\r\n\r\n").nth(1).unwrap_or(status).trim();
            // The engine's `{"message":"..."}`, or the body as it came.
            let message = body
                .split_once(r#""message":""#)
                .and_then(|(_, rest)| rest.split('"').next())
                .unwrap_or(body);
            Err(format!(
                "the Docker engine at {host} refuses API {version}, the version testcontainers \
                 (bollard) sends and cannot negotiate: {message}. Run `.ci/docker-api-proxy \
                 /run/dblock/docker-api.sock &` and set \
                 DOCKER_HOST=unix:///run/dblock/docker-api.sock, as .ci/run does"
            ))
        })
        .clone()
}

/// A one-shot HTTP/1.0 GET to the engine at `host` (`unix://` or `tcp://`); the raw reply.
fn docker_get(host: &str, path: &str) -> Option<String> {
    let request = format!("GET {path} HTTP/1.0\r\nHost: docker\r\n\r\n");
    let timeout = Some(Duration::from_secs(10));
    let mut reply = String::new();
    if let Some(address) = host.strip_prefix("tcp://") {
        let mut stream = std::net::TcpStream::connect(address.trim_end_matches('/')).ok()?;
        stream.set_read_timeout(timeout).ok()?;
        stream.write_all(request.as_bytes()).ok()?;
        stream.read_to_string(&mut reply).ok()?;
        return Some(reply);
    }
    #[cfg(unix)]
    if let Some(path) = host.strip_prefix("unix://") {
        let mut stream = std::os::unix::net::UnixStream::connect(path).ok()?;
        stream.set_read_timeout(timeout).ok()?;
        stream.write_all(request.as_bytes()).ok()?;
        stream.read_to_string(&mut reply).ok()?;
        return Some(reply);
    }
    None
}

/// The label that marks this process's containers: `dblock.test.session=<pid>-<random>`.
/// Every container also carries testcontainers' own `org.testcontainers.managed-by`.
const SESSION_LABEL: &str = "dblock.test.session";

fn session() -> &'static str {
    static SESSION: OnceLock<String> = OnceLock::new();
    SESSION.get_or_init(|| {
        let random = uuid::Uuid::new_v4().simple().to_string();
        format!("{}-{}", std::process::id(), &random[..12])
    })
}

/// The container request with this process's labels.
fn labelled<I: Image>(request: impl Into<ContainerRequest<I>>) -> ContainerRequest<I> {
    request
        .into()
        .with_label(SESSION_LABEL, session())
        .with_label("dblock.test", "1")
}

/// Starts, once per process and before the first container, a watcher that removes this
/// process's containers when the process exits. testcontainers-rs 0.27 runs no reaper
/// container (Ryuk) and removes a container only when its handle is dropped; the handles
/// here live in a `static`, which Rust never drops, and a panic with `panic = "abort"`, a
/// signal or `std::process::exit` would skip drops anyway. So the watcher does not rely
/// on anything running in this process at exit: it blocks reading a pipe whose only
/// writer is this process (std opens pipes close-on-exec, so no other child inherits it),
/// and the kernel closes that pipe when the process ends, whatever the cause. Then it runs
/// `docker rm -f -v` on every container labelled with this session. It runs in its own
/// process group and ignores SIGINT/SIGTERM/SIGHUP, so a Ctrl-C that stops the test
/// binary does not stop the cleanup.
fn watch() {
    static WATCHER: OnceLock<Option<ChildStdin>> = OnceLock::new();
    WATCHER.get_or_init(|| {
        let warn = |what: &str| {
            let _ = writeln!(
                std::io::stderr(),
                "warning: {what}: containers of this test binary (label {SESSION_LABEL}={}) \
                 will be left behind",
                session()
            );
            None
        };
        if !on_path("docker") {
            return warn("no `docker` command on PATH for the container watcher");
        }
        let script = r#"trap '' HUP INT TERM
cat >/dev/null
ids=$(docker ps -aq --filter "label=$1")
[ -z "$ids" ] || docker rm -f -v $ids >/dev/null"#;
        let mut command = Command::new("sh");
        command
            .args(["-c", script, "dblock-container-watcher"])
            .arg(format!("{SESSION_LABEL}={}", session()))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        match command.spawn() {
            // The child itself is not kept: dropping a `Child` neither kills nor waits.
            Ok(mut child) => child.stdin.take(),
            Err(e) => warn(&format!("cannot start the container watcher (sh): {e}")),
        }
    });
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}

fn env_or(var: &str, default: &str) -> String {
    std::env::var(var)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_owned())
}

/// Starts a container, keeps it for the rest of the process, and returns its URL.
fn start<I: Image + 'static>(
    request: impl SyncRunner<I>,
    port: u16,
    url: impl FnOnce(String, u16) -> String,
) -> Result<String, String> {
    let describe = |e: &dyn std::fmt::Display| format!("starting a container failed: {e}");
    let container = request.start().map_err(|e| describe(&e))?;
    let host = container.get_host().map_err(|e| describe(&e))?;
    let port = container
        .get_host_port_ipv4(port)
        .map_err(|e| describe(&e))?;
    keep(container);
    Ok(url(host.to_string(), port))
}

/// Containers live as long as the test binary: Rust never drops statics, so nothing
/// stops them early (tests of the binary share them). testcontainers-rs has no reaper
/// container; the watcher started by [`watch`] removes them once the process has exited.
static KEPT: Mutex<Vec<Box<dyn Send>>> = Mutex::new(Vec::new());

fn keep<I: Image + 'static>(container: Container<I>) {
    KEPT.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(Box::new(container));
}
