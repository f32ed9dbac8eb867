//! What scenario group 11 says to the Patroni cluster from outside: HTTP to Patroni's REST
//! API and etcd's health endpoint, and a write probe through HAProxy that measures the
//! write outage of a switchover or failover.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::pool::PoolOptions;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout};

use crate::Res;

/// One HTTP/1.0 exchange with a loopback server (Patroni's REST API, etcd's health):
/// the status and the body.
pub async fn http(
    port: u16,
    method: &str,
    path: &str,
    body: &str,
    within: Duration,
) -> Res<(u16, String)> {
    let exchange = async {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await?;
        let request = format!(
            "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        let response = String::from_utf8_lossy(&response);
        let status = response
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or("no HTTP status")?;
        let text = response
            .split_once("\r\n\r\n")
            .map(|(_, b)| b)
            .unwrap_or("");
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>((status, text.to_owned()))
    };
    timeout(within, exchange)
        .await
        .map_err(|_| format!("{method} {path} on port {port}: no answer within {within:?}"))?
}

/// Writes through HAProxy every 100 ms on a connection of its own (each write bounded
/// by 1 s) and keeps when each write that succeeded was sent and answered: the write
/// outage of a failover is the gap between the last answer before it and the first
/// answer to a write sent after it.
pub struct Probe {
    /// (sent, answered) of each successful write.
    writes: Arc<Mutex<Vec<(Instant, Instant)>>>,
    task: JoinHandle<()>,
}

impl Probe {
    /// Starts writing through `url`; returns once a write has been answered.
    pub async fn start(url: &str) -> Res<Probe> {
        let pool = PoolOptions::<sqlx::Postgres>::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(1))
            .connect(url)
            .await?;
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS fault_probe (id INT PRIMARY KEY, n BIGINT NOT NULL);
             INSERT INTO fault_probe VALUES (1, 0) ON CONFLICT DO NOTHING",
        )
        .execute(&pool)
        .await?;
        let writes = Arc::new(Mutex::new(Vec::new()));
        let task = tokio::spawn({
            let writes = Arc::clone(&writes);
            async move {
                loop {
                    let sent = Instant::now();
                    let write =
                        sqlx::query("UPDATE fault_probe SET n = n + 1 WHERE id = 1").execute(&pool);
                    if let Ok(Ok(_)) = timeout(Duration::from_secs(1), write).await {
                        writes
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push((sent, Instant::now()));
                    }
                    sleep(Duration::from_millis(100)).await;
                }
            }
        });
        let probe = Probe { writes, task };
        // Writing before the caller's event, or there is no "last write before" it.
        let start = Instant::now();
        probe.first_after(start, Duration::from_secs(10)).await?;
        Ok(probe)
    }

    /// How long after `at` the first write sent after it was answered; waits for it up
    /// to `within` (a client polling faster than the probe may get through first). A write
    /// sent before `at` may have been answered by the old primary just after it.
    pub async fn first_after(&self, at: Instant, within: Duration) -> Res<Duration> {
        let deadline = Instant::now() + within;
        loop {
            let first = {
                let writes = self.writes.lock().unwrap_or_else(|e| e.into_inner());
                writes.iter().find(|(sent, _)| *sent > at).map(|w| w.1)
            };
            if let Some(first) = first {
                return Ok(first - at);
            }
            ensure!(
                Instant::now() < deadline,
                "no probe write within {within:?}"
            );
            sleep(Duration::from_millis(20)).await;
        }
    }

    /// The longest gap between two successful writes from the last one before `from` on.
    pub fn longest_gap(&self, from: Instant) -> Option<Duration> {
        let writes = self.writes.lock().unwrap_or_else(|e| e.into_inner());
        let start = writes.iter().rposition(|(_, answered)| *answered <= from)?;
        writes[start..].windows(2).map(|w| w[1].1 - w[0].1).max()
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.task.abort();
    }
}
