//! A worker process: this test binary started again with [`ROLE_ENV`] set, so the
//! nemesis can SIGSTOP and SIGKILL it. It runs three loops at once until its stdin
//! closes, each a read-increment-write of a counter with the same read-write gap:
//!
//! - **guarded**: `acquire` the guarded key, then 1-3 writes, each ONE transaction:
//!   `assert_held`, read, pause, write, append to the history, commit; then `release`;
//! - **control**: the same read-pause-write with no lock at all;
//! - **unfenced**: as guarded, under a lock of its own key, but without `assert_held`.
//!
//! It prints one line per event on stdout, which the test counts:
//!
//! | line | meaning |
//! |---|---|
//! | `CONN <id>` | a new MariaDB connection of its pool (`CONNECTION_ID()`) |
//! | `ACQ <kind> <token>` | `acquire` won |
//! | `WROTE <kind> <token> <seq>` | a write committed (token 0: control) |
//! | `REFUSED <kind> <token>` | `assert_held` said the lock was no longer held |
//! | `FAILED <phase> <kind> <message>` | a statement failed (a killed session, ...) |
//! | `TIMEOUT <kind>` | `acquire` waited in vain |
//! | `RELEASED <kind> <outcome>` | `release` answered `ok`, `not_held` or `expired` |
//! | `LOST <kind> <reason>` | the guard's `lost()` had fired by the release |
//! | `ERROR <message>` | it cannot go on; it exits with status 1 |

use std::process::ExitCode;
use std::time::Duration;

use dblock::{Error, LockGuard, Locker, MySql, Postgres};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::watch;
use tokio::time::sleep;

use crate::Res;
use crate::db::{Kind, Names, NemesisDb, Write};

/// Set in a worker's environment: run as a worker, not as the test.
pub const ROLE_ENV: &str = "DBLOCK_NEMESIS_ROLE";

/// The lease of every hold, renewed by the Locker's engine every third of it.
pub const LEASE: Duration = Duration::from_millis(1500);
/// How long `acquire` waits before it reports a timeout and tries again.
const WAIT: Duration = Duration::from_secs(10);
/// Connections of a worker's pool: three loops, renewal, and the acquisitions.
const POOL: u32 = 6;

/// The pause between a write's read and its write: the window in which an unprotected
/// writer loses updates. Eight workers each leaving it open for about a third of their
/// time make the control's lost updates certain.
fn gap() -> Duration {
    Duration::from_millis(fastrand::u64(2..=20))
}

/// The pause before a loop's next round.
fn breather() -> Duration {
    Duration::from_millis(fastrand::u64(0..=10))
}

/// The start of every owner value of a worker's locks: `w<worker>.<incarnation>:`.
pub fn owner_prefix(worker: i32, incarnation: i32) -> String {
    format!("w{worker}.{incarnation}:")
}

/// Prints an event line (and nothing else may reach stdout).
macro_rules! say {
    ($($arg:tt)+) => {
        println!("{}", format!($($arg)+).replace('\n', " "))
    };
}

/// What a worker is: `<url> <lock table> <worker> <incarnation> <application name>`.
struct Worker<DB: NemesisDb> {
    pool: sqlx::Pool<DB>,
    locker: Locker<DB>,
    names: Names,
    worker: i32,
    incarnation: i32,
    stop: watch::Receiver<bool>,
}

/// Entry point of a worker process.
pub fn child_main() -> ExitCode {
    crate::standalone::child_main(async |args: Vec<String>| -> Res<()> {
        let url = args.first().ok_or("no URL")?;
        match url.split(':').next() {
            Some("postgres" | "postgresql") => work::<Postgres>(&args).await,
            Some("mysql" | "mariadb") => work::<MySql>(&args).await,
            _ => Err(format!("unknown URL scheme in {url}").into()),
        }
    })
}

async fn work<DB: NemesisDb>(args: &[String]) -> Res<()> {
    let [url, lock_table, worker, incarnation, app] = args else {
        return Err(format!("expected 5 arguments, got {args:?}").into());
    };
    let pool = DB::connect(url, app, POOL, true).await?;
    let names = Names::from_lock(lock_table);
    // The owner values name the worker, so the nemesis can find the holder of a key.
    let locker = Locker::builder(pool.clone())
        .table(&names.lock)
        .owner_prefix(owner_prefix(worker.parse()?, incarnation.parse()?))
        .build()?;
    // The test closes stdin to stop the worker (or dies, which closes it too).
    let (stop_tx, stop) = watch::channel(false);
    tokio::spawn(async move {
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        while let Ok(Some(_)) = lines.next_line().await {}
        let _ = stop_tx.send(true);
    });
    let me = Worker {
        pool,
        locker,
        names,
        worker: worker.parse()?,
        incarnation: incarnation.parse()?,
        stop,
    };
    tokio::join!(
        me.holds(Kind::Guarded),
        me.control(),
        me.holds(Kind::Unfenced)
    );
    // Background releases (of guards dropped on the way out) finish before the exit.
    me.locker.shutdown().await;
    me.pool.close().await;
    Ok(())
}

/// Why a write under a hold did not commit.
enum NotWritten {
    /// `assert_held` refused: the lock was lost.
    Refused,
    Failed(String),
}

impl From<Box<dyn std::error::Error + Send + Sync>> for NotWritten {
    fn from(err: Box<dyn std::error::Error + Send + Sync>) -> Self {
        NotWritten::Failed(err.to_string())
    }
}

impl From<sqlx::Error> for NotWritten {
    fn from(err: sqlx::Error) -> Self {
        NotWritten::Failed(err.to_string())
    }
}

impl<DB: NemesisDb> Worker<DB> {
    fn stopped(&self) -> bool {
        *self.stop.borrow()
    }

    /// The guarded (or unfenced) loop: acquire, write 1-3 times, release.
    async fn holds(&self, kind: Kind) {
        let mut stop = self.stop.clone();
        while !self.stopped() {
            let acquired = tokio::select! {
                acquired = self.locker.acquire(kind.key(), LEASE, WAIT) => acquired,
                // Cancel safe: a lock granted meanwhile is released in the background.
                _ = stop.changed() => break,
            };
            match acquired {
                Ok(guard) => self.hold(kind, guard).await,
                Err(Error::Timeout { .. }) => say!("TIMEOUT {kind}"),
                Err(err) => {
                    say!("FAILED acquire {kind} {err}");
                    sleep(Duration::from_millis(50)).await;
                }
            }
            sleep(breather()).await;
        }
    }

    async fn hold(&self, kind: Kind, guard: LockGuard<DB>) {
        let token = guard.fencing_token();
        say!("ACQ {kind} {token}");
        for i in 0..fastrand::u32(1..=3) {
            if i > 0 {
                sleep(breather()).await;
            }
            match self.write_holding(kind, &guard).await {
                Ok(seq) => say!("WROTE {kind} {token} {seq}"),
                Err(NotWritten::Refused) => {
                    say!("REFUSED {kind} {token}");
                    break;
                }
                Err(NotWritten::Failed(err)) => {
                    say!("FAILED write {kind} {err}");
                    break;
                }
            }
        }
        if let Some(reason) = guard.lost_reason() {
            say!("LOST {kind} {reason:?}");
        }
        match guard.release().await {
            Ok(()) => say!("RELEASED {kind} ok"),
            Err(Error::NotHeld { .. }) => say!("RELEASED {kind} not_held"),
            Err(Error::LockLost { .. }) => say!("RELEASED {kind} expired"),
            Err(err) => say!("FAILED release {kind} {err}"),
        }
    }

    /// One write under a hold, in ONE transaction; the guarded kind checks the lock in
    /// it first. Returns the write's sequence number.
    async fn write_holding(&self, kind: Kind, guard: &LockGuard<DB>) -> Result<i64, NotWritten> {
        let mut tx = self.pool.begin().await?;
        if kind == Kind::Guarded {
            match guard.assert_held(&mut tx).await {
                Ok(()) => {}
                Err(Error::NotHeld { .. }) => return Err(NotWritten::Refused),
                Err(err) => return Err(NotWritten::Failed(err.to_string())),
            }
        }
        let read = DB::read_value(&mut *tx, &self.names, kind).await?;
        sleep(gap()).await;
        let seq = DB::write(
            &mut *tx,
            &self.names,
            &self.entry(kind, guard.fencing_token(), read),
        )
        .await?;
        tx.commit().await?;
        Ok(seq)
    }

    /// The control loop: the same read-pause-write with no lock; the read is on its own,
    /// the write and its history row one transaction.
    async fn control(&self) {
        let kind = Kind::Control;
        while !self.stopped() {
            match self.write_unlocked().await {
                Ok(seq) => say!("WROTE {kind} 0 {seq}"),
                Err(err) => {
                    say!("FAILED write {kind} {err}");
                    sleep(Duration::from_millis(50)).await;
                }
            }
            sleep(breather()).await;
        }
    }

    async fn write_unlocked(&self) -> Res<i64> {
        let kind = Kind::Control;
        let read = {
            let mut conn = self.pool.acquire().await?;
            DB::read_value(&mut *conn, &self.names, kind).await?
        };
        sleep(gap()).await;
        let mut tx = self.pool.begin().await?;
        let seq = DB::write(&mut *tx, &self.names, &self.entry(kind, 0, read)).await?;
        tx.commit().await?;
        Ok(seq)
    }

    fn entry(&self, kind: Kind, token: i64, read: i64) -> Write {
        Write {
            kind,
            worker: self.worker,
            incarnation: self.incarnation,
            token,
            read,
            written: read + 1,
        }
    }
}
