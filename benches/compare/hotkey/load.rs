//! What cells 3.1 and 3.1b run beside the contenders: busy loops that keep the cores
//! busy, and a pool that counts the statements sent through it.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sqlx::Pool;

use crate::servers::{BenchDb, POOL_SIZE, pool_settings};

/// Busy loops (`sh -c 'while :; do :; done'`, the loop a shell builtin: no child of its
/// own) that run while this lives: killed and reaped when it is dropped, also when the
/// cell returns early or panics. They share the bench's process group, so an interrupt
/// from the terminal ends them too.
pub struct Burners(Vec<Child>);

impl Burners {
    pub fn start(n: usize) -> std::io::Result<Burners> {
        let mut burners = Burners(Vec::with_capacity(n));
        for _ in 0..n {
            // On an error, `burners` is dropped with the loops started so far.
            let child = Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()?;
            burners.0.push(child);
        }
        Ok(burners)
    }

    /// CPU time the loops have had so far (`/proc/<pid>/schedstat`; zero where unknown).
    pub fn cpu(&self) -> Duration {
        self.0
            .iter()
            .filter_map(|child| {
                let stat = std::fs::read_to_string(format!("/proc/{}/schedstat", child.id()));
                stat.ok()?.split_whitespace().next()?.parse().ok()
            })
            .map(Duration::from_nanos)
            .sum()
    }
}

impl Drop for Burners {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A pool of the bench's settings on `url`, its connections opened, that counts the
/// connections given back to it: the lock-table contenders send one statement per
/// checkout on PostgreSQL (an attempt, a wake-up request, a release), so the count is
/// their statements. sqlx gives a connection back on a task of its own either way; the
/// hook only adds a count there.
pub async fn counting_pool<DB: BenchDb>(
    url: &str,
) -> Result<(Pool<DB>, Arc<AtomicU64>), sqlx::Error> {
    let given_back = Arc::new(AtomicU64::new(0));
    let count = Arc::clone(&given_back);
    let pool = pool_settings::<DB>()
        .after_release(move |_, _| {
            count.fetch_add(1, Ordering::Relaxed);
            Box::pin(async { Ok(true) })
        })
        .connect(url)
        .await?;
    let mut open = Vec::new();
    for _ in 0..POOL_SIZE {
        open.push(pool.acquire().await?);
    }
    drop(open);
    Ok((pool, given_back))
}
