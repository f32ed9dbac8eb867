//! SQLite's release listener. SQLite has no notifications, so a connection of the
//! Locker's own to the same database file looks, every few milliseconds while the Locker
//! has waiters, whether another connection committed since it last looked (`PRAGMA
//! data_version`: a read of the database header, no write lock); when one did, it reads
//! the Locker's marks (`{table}_waiter`, see V3__waiters.sql), and a mark whose pokes
//! changed saw a row of its key or group deleted: the listener reports its key released,
//! with the token of the last row that went (the Locker skips it if the release was its
//! own, whose waiters it woke already), and the waiters of that key try. While the Locker has no waiters the listener waits
//! for one to join a queue, and sends nothing.
//!
//! It writes only to keep its marks: while its Locker waits it reads them at least every
//! quarter second, refreshes those of keys still waited for that are past half their
//! life, and then deletes every expired mark (of Lockers that stopped or died). Those
//! writes wait for SQLite's write lock briefly ([`BUSY_WAIT`]) and are tried again at the
//! next read when they could not have it: a listener stuck in the busy handler behind a
//! stream of writers would stop looking, and its Locker's waiters would hear nothing.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sqlx::{Connection, Sqlite, SqliteConnection};
use tokio::time::{Instant, sleep};

use super::{MAIN_FILE, MARKS, PURGE_MARKS, REFRESH_MARKS, sqlite_sql};
use crate::dialect::{ListenerOptions, Released, Releases, Sql, Waiting, audited};

/// The shortest pause between two looks; each adds a random part of up to
/// [`TICK_SPREAD`]. Random, so that the listeners of several processes look in no fixed
/// order: the waiter whose listener looks first after a release tries first, and with
/// fixed phases one process's listener would look first again and again.
const TICK_LEAST: Duration = Duration::from_micros(1500);
const TICK_SPREAD: Duration = Duration::from_millis(3);

/// The marks are read at least this often while the Locker waits, commits or not, so
/// that those of keys still waited for are refreshed before they expire (after a second,
/// `MARK_UNTIL`): a mark found past half its life is tried twice at least.
const REFRESH_EVERY: Duration = Duration::from_millis(250);

/// The listener connection's busy timeout: reads of a WAL database never wait for the
/// write lock, and the refresh gives up after this (sqlx's default is five seconds).
const BUSY_WAIT: &str = "PRAGMA busy_timeout = 10";

/// Opens the listener of the Locker numbered `listener.waiter` on `table`: `None` for an
/// in-memory database, which lives in this process only (every Locker on it is here, and
/// a release through one Locker wakes only that Locker's waiters; the others poll).
pub(super) async fn open(
    listener: ListenerOptions<Sqlite>,
    table: &str,
) -> Result<Option<Box<dyn Releases>>, sqlx::Error> {
    let mut conn = SqliteConnection::connect_with(&listener.options).await?;
    let file: Option<String> = sqlx::query_scalar(MAIN_FILE)
        .fetch_optional(&mut conn)
        .await?;
    if file.is_none_or(|file| file.is_empty()) {
        conn.close().await.ok();
        return Ok(None);
    }
    sqlx::query(BUSY_WAIT).execute(&mut conn).await?;
    Ok(Some(Box::new(Listener {
        conn,
        waiting: listener.waiting,
        waiter: listener.waiter,
        marks: sqlite_sql(MARKS, table),
        refresh: sqlite_sql(REFRESH_MARKS, table),
        purge: sqlite_sql(PURGE_MARKS, table),
        version: None,
        read_at: None,
        pokes: HashMap::new(),
        heard: Vec::new(),
    })))
}

struct Listener {
    conn: SqliteConnection,
    waiting: Arc<dyn Waiting>,
    waiter: i64,
    marks: Sql,
    refresh: Sql,
    purge: Sql,
    /// `PRAGMA data_version` when the marks were last read.
    version: Option<i64>,
    read_at: Option<Instant>,
    /// Each mark's pokes as last read, by key.
    pokes: HashMap<String, i64>,
    /// Releases read and not reported yet.
    heard: Vec<Released>,
}

impl Listener {
    /// One look: the marks are read if another connection committed since the last read,
    /// or a refresh is due. State changes only once a read is whole, so that a look
    /// dropped half-way (the caller's liveness check) leaves nothing half-done.
    async fn look(&mut self) -> Result<(), sqlx::Error> {
        let version: i64 = sqlx::query_scalar("PRAGMA data_version")
            .fetch_one(&mut self.conn)
            .await?;
        let due = self.read_at.is_none_or(|at| at.elapsed() >= REFRESH_EVERY);
        if self.version == Some(version) && !due {
            return Ok(());
        }
        let marks: Vec<(String, i64, i64, bool)> = sqlx::query_as(audited(&self.marks))
            .bind(self.waiter)
            .fetch_all(&mut self.conn)
            .await?;
        // Read after the marks: the waiter of a mark read had joined its queue by then
        // (it joins before its first attempt, and marks after a lost one).
        let waited = self.waiting.keys();
        let mut stale = Vec::new();
        let mut pokes = HashMap::with_capacity(marks.len());
        for (key, poked, fencing_token, fresh) in marks {
            // A mark not read before starts from no pokes: poked already, a row went
            // after the waiter marked it.
            if self.pokes.get(&key).copied().unwrap_or(0) != poked {
                self.heard.push(Released {
                    key: key.clone(),
                    fencing_token,
                });
            }
            if !fresh && waited.contains(&key) {
                stale.push(key.clone());
            }
            pokes.insert(key, poked);
        }
        self.pokes = pokes;
        self.version = Some(version);
        self.read_at = Some(Instant::now());
        if !stale.is_empty() {
            // Not the listener's failure: another writer held the lock (SQLITE_BUSY), and
            // the next read, a quarter second on, finds the marks stale still.
            let refreshed = sqlx::query(audited(&self.refresh))
                .bind(self.waiter)
                .bind(serde_json::Value::from(stale).to_string())
                .execute(&mut self.conn)
                .await;
            if refreshed.is_ok() {
                sqlx::query(audited(&self.purge))
                    .execute(&mut self.conn)
                    .await
                    .ok();
            }
        }
        Ok(())
    }
}

/// A pause between two looks: [`TICK_LEAST`] plus a random part of [`TICK_SPREAD`].
fn pause() -> Duration {
    TICK_LEAST + TICK_SPREAD.mul_f64(fastrand::f64())
}

impl Releases for Listener {
    fn next(
        &mut self,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Option<Released>, sqlx::Error>> + Send + '_>,
    > {
        Box::pin(async move {
            loop {
                if let Some(released) = self.heard.pop() {
                    return Ok(Some(released));
                }
                if self.waiting.keys().is_empty() {
                    self.waiting.joined().await;
                    continue;
                }
                sleep(pause()).await;
                let at = Instant::now();
                self.look().await?;
                // Every commit before `at` is seen now, whether it poked a mark of ours
                // or not: a release this Locker yielded to another is as visible to its
                // own waiters as to the other Locker's (see `Waiting::looked`).
                self.waiting.looked(at);
            }
        })
    }

    fn check(
        &mut self,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), sqlx::Error>> + Send + '_>>
    {
        Box::pin(async move {
            sqlx::query("SELECT 1")
                .execute(&mut self.conn)
                .await
                .map(drop)
        })
    }
}
