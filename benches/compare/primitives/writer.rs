//! Section 7's writer cell: how long a writer waits among streaming readers of one
//! read-write lock (reported, no target).

use std::time::Duration;

use dblock::{Backend, RwLock};
use tokio::time::Instant;

use super::contenders::{HOLD, READERS, WAIT};
use crate::handwritten::LEASE;
use crate::measure::{Stop, median};
use crate::report::ms_f;
use crate::settings::Settings;

/// A writer arrives this often among the readers.
const WRITER_EVERY: Duration = Duration::from_millis(250);

/// The cell's report line, writers on `lock` for the rounds' whole time.
pub async fn line<DB: Backend>(settings: &Settings, lock: &RwLock<DB>) -> String {
    let length = settings.round * u32::try_from(settings.rounds).unwrap_or(5);
    let mut waits = writer_waits(lock, length).await;
    waits.sort_by(f64::total_cmp);
    let longest = waits.last().copied().unwrap_or(f64::NAN);
    format!(
        "- a writer among {READERS} streaming readers (each holding 2 ms), one every {} ms for {:.0} s: {} writes, wait p50 {} ms, longest {} ms (report)",
        WRITER_EVERY.as_millis(),
        length.as_secs_f64(),
        waits.len(),
        ms_f(median(waits.iter().copied())),
        ms_f(longest),
    )
}

/// How long writers wait among [`READERS`] streaming readers: one writer every
/// [`WRITER_EVERY`] for `length`; each write's wait, in seconds.
async fn writer_waits<DB: Backend>(lock: &RwLock<DB>, length: Duration) -> Vec<f64> {
    let stop = Stop::after(length);
    let mut readers = tokio::task::JoinSet::new();
    for _ in 0..READERS {
        let lock = lock.clone();
        let stop = stop.clone();
        readers.spawn(async move {
            while !stop.is_set() {
                if let Ok(read) = lock.read(LEASE, WAIT).await {
                    tokio::time::sleep(HOLD).await;
                    let _ = read.release().await;
                }
            }
        });
    }
    let mut waits = Vec::new();
    while !stop.is_set() {
        tokio::time::sleep(WRITER_EVERY).await;
        let asked = Instant::now();
        if let Ok(write) = lock.write(LEASE, WAIT).await {
            waits.push(asked.elapsed().as_secs_f64());
            tokio::time::sleep(HOLD).await;
            let _ = write.release().await;
        }
    }
    while readers.join_next().await.is_some() {}
    waits
}
