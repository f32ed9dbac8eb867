//! Where the database servers are: a URL from the environment, else a container started
//! once per test binary when a Docker engine is reachable, else a skip with a reason.

use std::io::Write;
use std::sync::{Mutex, OnceLock, PoisonError};

use testcontainers_modules::mariadb::Mariadb;
use testcontainers_modules::postgres::Postgres;
use testcontainers_modules::testcontainers::runners::SyncRunner;
use testcontainers_modules::testcontainers::{Container, Image, ImageExt};

use super::Unavailable;

type Found = Result<String, Unavailable>;

/// The PostgreSQL server's URL (shared by all tests of the binary; pools are not).
pub fn postgres_url() -> Found {
    static URL: OnceLock<Found> = OnceLock::new();
    URL.get_or_init(|| {
        find("DBLOCK_TEST_POSTGRES_URL", || {
            let image = env_or("DBLOCK_TEST_POSTGRES_IMAGE", "postgres");
            let tag = env_or("DBLOCK_TEST_POSTGRES_TAG", "15-alpine");
            let request = Postgres::default()
                .with_host_auth()
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
            let request = Mariadb::default().with_name(image).with_tag(tag);
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
    // The sync runner drives its own runtime and must not run on a tokio worker thread.
    std::thread::scope(|s| s.spawn(start).join())
        .unwrap_or_else(|_| Err("starting the container panicked".to_owned()))
        .map_err(|err| Unavailable::Broken(format!("{url_var} unset; {err}")))
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
/// stops them early. Removing them afterwards is left to testcontainers' reaper container
/// (Ryuk) where the engine runs it; the suite uses no `unsafe` exit hooks.
static KEPT: Mutex<Vec<Box<dyn Send>>> = Mutex::new(Vec::new());

fn keep<I: Image + 'static>(container: Container<I>) {
    KEPT.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(Box::new(container));
}
