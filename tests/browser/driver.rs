//! A headless Chromium driven through ChromeDriver (Debian's `chromium` and
//! `chromium-driver`), for the console's browser test: the driver process on a free port,
//! ready when its `/status` answers, and one WebDriver session with the flags this
//! machine needs (no sandbox as root; no background networking, which the closed network
//! refuses at every start).

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder};

pub const CHROMIUM: &str = "/usr/bin/chromium";
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// How long ChromeDriver may take to answer `/status` on a busy machine.
const DRIVER_START: Duration = Duration::from_secs(60);

/// Why the browser test cannot run here, if it cannot.
pub fn missing() -> Option<String> {
    [CHROMIUM, CHROMEDRIVER]
        .iter()
        .find(|path| !Path::new(path).exists())
        .map(|path| {
            format!("{path} is not installed (Debian packages chromium and chromium-driver)")
        })
}

/// A free port on the loopback interface (the listener is closed at once; the driver
/// binds it next).
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("its address").port()
}

/// The ChromeDriver process; killed when dropped.
pub struct Driver {
    child: Child,
    pub url: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Driver {
    /// Starts ChromeDriver and waits until its `/status` says it is ready.
    pub async fn start() -> Driver {
        let port = free_port();
        let child = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let driver = Driver {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let until = Instant::now() + DRIVER_START;
        while !status_ready(port).await {
            assert!(
                Instant::now() < until,
                "chromedriver did not answer /status in {DRIVER_START:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        driver
    }

    /// A new headless browser session.
    pub async fn session(&self) -> Client {
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({
                "binary": CHROMIUM,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                    "--window-size=1280,900",
                    format!("--user-data-dir={}", tempdir_for_profile()),
                ]
            }),
        );
        ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&self.url)
            .await
            .expect("a browser session")
    }
}

fn tempdir_for_profile() -> String {
    let dir = std::env::temp_dir().join(format!(
        "dblock-browser-{}-{}",
        std::process::id(),
        fastrand_suffix()
    ));
    std::fs::create_dir_all(&dir).expect("a profile directory");
    dir.display().to_string()
}

fn fastrand_suffix() -> u64 {
    use std::time::SystemTime;
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Whether ChromeDriver's `/status` answers `"ready":true` within a second (a plain
/// HTTP/1.1 GET; the answer is read until it says so: the driver may keep the connection).
async fn status_ready(port: u16) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ask = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        let request = b"GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
        stream.write_all(request).await.ok()?;
        let mut answer = Vec::new();
        let mut chunk = [0u8; 1024];
        loop {
            let read = stream.read(&mut chunk).await.ok()?;
            if read == 0 {
                return Some(false);
            }
            answer.extend_from_slice(&chunk[..read]);
            if String::from_utf8_lossy(&answer).contains("\"ready\":true") {
                return Some(true);
            }
        }
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(1), ask).await,
        Ok(Some(true))
    )
}
