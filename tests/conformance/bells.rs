//! Bells (MySQL/MariaDB): waiters of other processes are woken by the server, not by
//! polling. A Locker whose waiters wait registers in the database (a named lock per
//! queue), an acquisition that sees another process registered takes the row's *bell*
//! (another named lock) on its engine's connection and drops it after the release, and
//! the waiters' listener, blocked on that bell in the server, wakes them then.
//!
//! MySQL-only: the cases watch named locks, bell sessions and server accounts, which the
//! other backends do not have (PostgreSQL's `NOTIFY` has its own cases in `wakeups.rs`,
//! `queue.rs` and `primitives.rs`; SQLite's waiters poll). "Processes" are Lockers with
//! pools of their own on the test's table.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dblock::{Locker, RetryPolicy};
use futures::future::BoxFuture;
use tokio::time::{Instant, sleep, timeout};

use super::{LONG, PATIENCE};
use crate::common::{Arg, TestBackend, TestDb, wait_until};

/// How long each grant of the contention cases holds its lock.
const HOLD: Duration = Duration::from_millis(2);
/// Grants counted in each contention case: with 2 processes at half each, a share below
/// a quarter is 100 grants short of it.
const GRANTS: usize = 400;
/// The most connections a Locker's listener opens for bells: one registry and at most
/// this many blocked ones (see `dialect/mysql.rs`).
const BELL_SESSIONS: i64 = 1 + 4;
/// The pool of each "process" in the contention cases.
const POOL: u32 = 4;
/// The backoff of the waiter that must be woken: capped at a minute, so that once its
/// Locker hears the key's bell it sleeps at least 30 s (or until the holder's lease ends,
/// [`LONG`]) after a lost attempt. Granted sooner than [`WOKEN_WITHIN`] after the
/// release, the bell woke it.
const SLEEPY: RetryPolicy = RetryPolicy {
    initial: Duration::from_millis(10),
    max: Duration::from_secs(60),
};
const WOKEN_WITHIN: Duration = Duration::from_secs(10);

/// A server account of one "process", so that its sessions can be counted and killed on
/// their own (`information_schema.PROCESSLIST.USER`), whatever else runs on the server.
/// Dropped at the end, also after a failed assertion.
struct Account {
    name: String,
    url: String,
    admin: String,
}

impl Account {
    async fn create<DB: TestBackend>(db: &TestDb<DB>, suffix: &str) -> Account {
        let name = format!("{}_{suffix}", db.table);
        for sql in [
            format!("CREATE USER '{name}'@'%'"),
            format!("GRANT ALL ON *.* TO '{name}'@'%'"),
        ] {
            DB::exec(&db.pool, sql, vec![])
                .await
                .expect("create an account");
        }
        let mut url = url::Url::parse(&db.location).expect("a server URL");
        url.set_username(&name).expect("a URL with a user");
        url.set_password(None).expect("a URL without a password");
        Account {
            name,
            url: url.to_string(),
            admin: db.location.clone(),
        }
    }

    /// This account's sessions on the server now.
    async fn sessions<DB: TestBackend>(&self, db: &TestDb<DB>) -> i64 {
        let sql = "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = ?";
        let n = DB::fetch_i64(&db.pool, sql.to_owned(), vec![self.name.as_str().into()]);
        n.await
            .expect("count sessions")
            .expect("COUNT returns a row")
    }

    /// A Locker on the test's table with a pool of `max` through this account.
    async fn locker<DB: TestBackend>(
        &self,
        db: &TestDb<DB>,
        max: u32,
        retry: RetryPolicy,
        listen: bool,
    ) -> Locker<DB> {
        Locker::builder(DB::connect(&self.url, max).await)
            .table(&db.table)
            .auto_renew(false)
            .retry(retry)
            .listen(listen)
            .build()
            .expect("a valid table name")
    }
}

impl Drop for Account {
    fn drop(&mut self) {
        let (name, admin) = (self.name.clone(), self.admin.clone());
        let cleanup = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for cleanup");
            runtime.block_on(async {
                let pool = dblock::sqlx::MySqlPool::connect(&admin).await.ok()?;
                let drop = format!("DROP USER IF EXISTS '{name}'@'%'");
                sqlx::query(sqlx::AssertSqlSafe(drop))
                    .execute(&pool)
                    .await
                    .ok()?;
                pool.close().await;
                Some(())
            })
        });
        let _ = cleanup.join();
    }
}

/// The server-side name of `kind` (`w0`, `w1`: a waiter's registration; `b`: a row's
/// bell) for the key bound at its `?`, as the dialect derives it.
fn name_sql(table: &str, kind: &str) -> String {
    format!(
        "CONCAT('dblock:', MD5(CONCAT_WS(0x1F, CAST(DATABASE() AS BINARY), '{table}', ?)), ':{kind}')"
    )
}

/// Whether some session registered as a waiter of `key`'s queue.
async fn registered<DB: TestBackend>(db: &TestDb<DB>, key: &str) -> bool {
    let (w0, w1) = (name_sql(&db.table, "w0"), name_sql(&db.table, "w1"));
    let sql =
        format!("SELECT (IS_USED_LOCK({w0}) IS NOT NULL OR IS_USED_LOCK({w1}) IS NOT NULL) + 0");
    let n = DB::fetch_i64(&db.pool, sql, vec![key.into(), key.into()]).await;
    n.expect("read the registration") == Some(1)
}

/// Whether `key`'s row has its bell taken.
async fn belled<DB: TestBackend>(db: &TestDb<DB>, key: &str) -> bool {
    let sql = format!(
        "SELECT (IS_USED_LOCK({}) IS NOT NULL) + 0",
        name_sql(&db.table, "b")
    );
    let n = DB::fetch_i64(&db.pool, sql, vec![key.into()]).await;
    n.expect("read the bell") == Some(1)
}

/// One grant of a contention case: which process, when, after how long a wait.
#[derive(Clone, Copy)]
struct Grant {
    process: usize,
    at: Instant,
    waited: Duration,
}

/// Takes the contended lock once, holds it [`HOLD`] and releases it; how long it waited.
type Take<DB> = Arc<dyn Fn(Locker<DB>) -> BoxFuture<'static, Duration> + Send + Sync>;

/// What a contention run measured.
struct Run {
    grants: Vec<Grant>,
    started: Instant,
    ended: Instant,
    /// The most sessions each process's account had on the server at once.
    sessions: Vec<i64>,
}

impl Run {
    fn shares(&self, processes: usize) -> Vec<f64> {
        let total = self.grants.len() as f64;
        (0..processes)
            .map(|p| self.grants.iter().filter(|g| g.process == p).count() as f64 / total)
            .collect()
    }

    /// Each process's wait p99, in milliseconds.
    fn p99(&self, processes: usize) -> Vec<f64> {
        (0..processes)
            .map(|p| {
                let mut waits: Vec<Duration> = self
                    .grants
                    .iter()
                    .filter(|g| g.process == p)
                    .map(|g| g.waited)
                    .collect();
                waits.sort_unstable();
                let at = (waits.len() * 99).div_ceil(100).saturating_sub(1);
                waits.get(at).map_or(0.0, |w| w.as_secs_f64() * 1e3)
            })
            .collect()
    }

    /// Each process's longest spell without a grant (from the start, between its
    /// grants, and to the end), in milliseconds.
    fn droughts(&self, processes: usize) -> Vec<f64> {
        (0..processes)
            .map(|p| {
                let mut at: Vec<Instant> = self
                    .grants
                    .iter()
                    .filter(|g| g.process == p)
                    .map(|g| g.at)
                    .collect();
                at.sort_unstable();
                let edges = std::iter::once(self.started)
                    .chain(at)
                    .chain(std::iter::once(self.ended));
                let mut longest = Duration::ZERO;
                let mut last = None;
                for edge in edges {
                    if let Some(last) = last {
                        longest = longest.max(edge - last);
                    }
                    last = Some(edge);
                }
                longest.as_secs_f64() * 1e3
            })
            .collect()
    }

    fn report(&self, what: &str, processes: usize) -> String {
        let round = |v: Vec<f64>| v.iter().map(|x| format!("{x:.1}")).collect::<Vec<_>>();
        let shares: Vec<String> = self
            .shares(processes)
            .iter()
            .map(|s| format!("{:.1}%", s * 100.0))
            .collect();
        format!(
            "{what}: {} grants in {:.2} s; shares {shares:?}; wait p99 ms {:?}; longest drought ms {:?}; most sessions per process {:?}",
            self.grants.len(),
            (self.ended - self.started).as_secs_f64(),
            round(self.p99(processes)),
            round(self.droughts(processes)),
            self.sessions,
        )
    }
}

/// `tasks` tasks in each of `lockers` take the lock with `take` until [`GRANTS`]
/// grants were made, while the accounts' sessions are counted.
async fn contend<DB: TestBackend>(
    db: &TestDb<DB>,
    accounts: &[Account],
    lockers: &[Locker<DB>],
    tasks: usize,
    take: Take<DB>,
) -> Run {
    let grants = Arc::new(Mutex::new(Vec::new()));
    let count = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = Vec::new();
    for (process, locker) in lockers.iter().enumerate() {
        for _ in 0..tasks {
            let (locker, take) = (locker.clone(), Arc::clone(&take));
            let (grants, count) = (Arc::clone(&grants), Arc::clone(&count));
            workers.push(tokio::spawn(async move {
                while count.load(Ordering::SeqCst) < GRANTS {
                    let waited = take(locker.clone()).await;
                    let at = Instant::now();
                    count.fetch_add(1, Ordering::SeqCst);
                    grants.lock().unwrap().push(Grant {
                        process,
                        at,
                        waited,
                    });
                }
            }));
        }
    }
    let mut sessions = vec![0; accounts.len()];
    while !workers.iter().all(|w| w.is_finished()) {
        for (most, account) in sessions.iter_mut().zip(accounts) {
            *most = (*most).max(account.sessions(db).await);
        }
        sleep(Duration::from_millis(20)).await;
    }
    let ended = Instant::now();
    for worker in workers {
        timeout(PATIENCE, worker)
            .await
            .expect("the workers end")
            .expect("a worker");
    }
    let grants = std::mem::take(&mut *grants.lock().unwrap());
    Run {
        grants,
        started,
        ended,
        sessions,
    }
}

/// The bound on one process's sessions: its pool, its engine's connection and its
/// listener's.
fn session_bound() -> i64 {
    i64::from(POOL) + 1 + BELL_SESSIONS
}

/// A waiter of another "process" asleep on the bell of `key`: what [`rung`] sets up.
struct Rung<DB: TestBackend> {
    /// The key's holder, a guard of `db.locker`'s that took the bell.
    holder: dblock::LockGuard<DB>,
    account: Account,
    waiters: Locker<DB>,
    waiter: tokio::task::JoinHandle<(dblock::LockGuard<DB>, Instant)>,
}

/// A waiter of a Locker of its own (its own account, [`SLEEPY`]'s backoff) asleep on
/// `key`'s bell, which `db.locker` holds. The holder is a reentrant owner that takes over
/// a row written by hand in its name, so that its acquisition comes while the waiter is
/// registered (and takes the bell) without the key ever being free. A second waiter then
/// queues behind the first, which goes: the second makes its first attempt, loses, and,
/// the bell heard, sleeps its long pause. Once the waiters' pool is idle again nothing
/// but the bell (or the holder's lease's end, 30 s away) wakes it.
async fn rung<DB: TestBackend>(db: &TestDb<DB>, key: &'static str) -> Rung<DB> {
    let owner = db.locker.owner();
    db.plain.insert(key, owner.value(), 30).await.unwrap();
    let account = Account::create(db, "w").await;
    let waiters = account.locker(db, POOL, SLEEPY, true).await;
    let first = spawn_acquire(&waiters, key);
    wait_until("the waiter registered", PATIENCE, async || {
        registered(db, key).await
    })
    .await;
    let holder = owner.acquire(key, LONG, PATIENCE).await.unwrap();
    wait_until("the bell is taken", PATIENCE, async || {
        belled(db, key).await
    })
    .await;
    wait_until("the waiters' Locker hears the bell", PATIENCE, async || {
        waiters.listening()
    })
    .await;
    let waiter = spawn_acquire(&waiters, key);
    wait_until("two waiters queue", PATIENCE, async || {
        waiters.waiting(key) == 2
    })
    .await;
    let attempts = waiters.stats().attempts;
    first.abort();
    // Asleep: it tried, and its pool has been idle, with no attempt since, at two looks
    // in a row (one idle look could fall between its attempt and the read that follows).
    let mut quiet = None;
    wait_until("the second waiter tried and sleeps", PATIENCE, async || {
        let now = waiters.stats().attempts;
        let idle = waiters.pool().num_idle() == waiters.pool().size() as usize;
        let settled = now > attempts && idle && waiters.listening();
        let again = settled && quiet == Some(now);
        quiet = settled.then_some(now);
        again
    })
    .await;
    Rung {
        holder,
        account,
        waiters,
        waiter,
    }
}

/// (a) A waiter of another Locker, whose backoff would let it sleep for half a minute,
/// is granted within seconds of the release (not a tight bound: without the bell it
/// would sleep until the holder's lease ends, 30 s on), and its wake-up counter says
/// the bell woke it, exactly once. The bell is dropped after the release.
pub async fn a_bell_wakes_a_waiter_of_another_process<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    if !DB::WAKES_BY_BELLS {
        return;
    }
    let key = "rung";
    let Rung {
        holder,
        waiters,
        waiter,
        ..
    } = rung(&db, key).await;
    let before = waiters.stats();
    let released = Instant::now();
    holder.release().await.unwrap();
    let (guard, acquired) = timeout(PATIENCE, waiter)
        .await
        .expect("the waiter gets the lock after the release")
        .expect("the waiter's task");
    let after = waiters.stats();
    assert_eq!(
        after.wakeups - before.wakeups,
        1,
        "the bell woke the waiter: {before:?} -> {after:?}"
    );
    let took = acquired - released;
    assert!(took < WOKEN_WITHIN, "woken {took:?} after the release");
    guard.release().await.unwrap();
    wait_until("the bell is dropped", PATIENCE, async || {
        !belled(&db, key).await
    })
    .await;
}

/// `locker.acquire(key)` on a task of its own, waiting up to a minute: longer than the
/// holder's lease, so that only a wake-up, not the wait's end, gets it the key in time.
fn spawn_acquire<DB: TestBackend>(
    locker: &Locker<DB>,
    key: &'static str,
) -> tokio::task::JoinHandle<(dblock::LockGuard<DB>, Instant)> {
    let locker = locker.clone();
    tokio::spawn(async move {
        let guard = locker.acquire(key, LONG, 2 * LONG).await.unwrap();
        (guard, Instant::now())
    })
}

/// (b) One hot key, 2 processes x 4 tasks, each holding it 2 ms: each process gets at
/// least a quarter of [`GRANTS`] grants, and no process has more sessions than its pool,
/// its engine's and its listener's. It cannot flake on timing: it measures no time, only
/// counts, and a slow machine slows both processes alike. A release whose acquisition
/// saw the other process registered rings both processes' waiters the same way (neither
/// is handed the turn in-process), so each grant is a race between the two heads in
/// which nothing favours either process: at most 100 wins of 400 such races is as likely
/// as at most 100 heads in 400 fair tosses (below 1e-20); a stall of one process (the
/// shared machine's) costs it the races of the stall, not its later ones. (Only the
/// first grants, before the processes registered, are polled for.) Before the bells
/// (each process polling, the releasing process's next waiter told at once) the less
/// served process got 8-41 % in four runs here (17 % and 8 % in two of them), its wait
/// p99 up to 1.8 s.
pub async fn hot_key_is_shared_between_processes<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    if !DB::WAKES_BY_BELLS {
        return;
    }
    let key = "hot";
    let accounts = [
        Account::create(&db, "a").await,
        Account::create(&db, "b").await,
    ];
    let mut lockers = Vec::new();
    for account in &accounts {
        lockers.push(
            account
                .locker(&db, POOL, RetryPolicy::default(), true)
                .await,
        );
    }
    let take: Take<DB> = Arc::new(move |locker: Locker<DB>| {
        Box::pin(async move {
            let asked = Instant::now();
            let guard = locker.acquire(key, LONG, PATIENCE).await.unwrap();
            let waited = asked.elapsed();
            sleep(HOLD).await;
            guard.release().await.unwrap();
            waited
        })
    });
    let run = contend(&db, &accounts, &lockers, 4, take).await;
    println!("{}", run.report("hot key, 2 processes x 4 tasks", 2));
    for locker in &lockers {
        let s = locker.stats();
        println!(
            "  attempts {} acquired {} wakeups {}",
            s.attempts, s.acquired, s.wakeups
        );
    }
    for (process, share) in run.shares(2).into_iter().enumerate() {
        assert!(
            share >= 0.25,
            "process {process} got {:.1} % of the grants",
            share * 100.0
        );
    }
    for (process, most) in run.sessions.iter().enumerate() {
        assert!(
            *most <= session_bound(),
            "process {process} had {most} sessions (pool {POOL} + engine 1 + listener {BELL_SESSIONS})"
        );
    }
    let stats: Vec<_> = lockers.iter().map(Locker::stats).collect();
    assert!(
        stats
            .iter()
            .all(|s| s.wakeups > 0 && s.listener_connects == 1),
        "{stats:?}"
    );
}

/// (c) A semaphore of 3 permits, 4 processes x 3 tasks each holding a permit 2 ms:
/// every process gets at least a tenth of [`GRANTS`] grants (a fair share is a
/// quarter). Counts only, as (b): every release of a permit whose acquisition saw
/// another process waiting rings all of them. Before the bells the least served
/// process got 8-24 % in four runs here, with droughts up to 0.8 s.
pub async fn semaphore_permits_are_shared_between_processes<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    if !DB::WAKES_BY_BELLS {
        return;
    }
    let mut accounts = Vec::new();
    let mut lockers = Vec::new();
    for suffix in ["a", "b", "c", "d"] {
        let account = Account::create(&db, suffix).await;
        lockers.push(
            account
                .locker(&db, POOL, RetryPolicy::default(), true)
                .await,
        );
        accounts.push(account);
    }
    let take: Take<DB> = Arc::new(|locker: Locker<DB>| {
        Box::pin(async move {
            let asked = Instant::now();
            let permit = locker
                .semaphore("pool", 3)
                .acquire(LONG, PATIENCE)
                .await
                .unwrap();
            let waited = asked.elapsed();
            sleep(HOLD).await;
            permit.release().await.unwrap();
            waited
        })
    });
    let run = contend(&db, &accounts, &lockers, 3, take).await;
    println!("{}", run.report("semaphore of 3, 4 processes x 3 tasks", 4));
    for locker in &lockers {
        let s = locker.stats();
        println!(
            "  attempts {} acquired {} wakeups {}",
            s.attempts, s.acquired, s.wakeups
        );
    }
    for (process, share) in run.shares(4).into_iter().enumerate() {
        assert!(
            share >= 0.10,
            "process {process} got {:.1} % of the grants",
            share * 100.0
        );
    }
    for (process, most) in run.sessions.iter().enumerate() {
        assert!(
            *most <= session_bound(),
            "process {process} had {most} sessions"
        );
    }
    // Each process heard bells (the fix removed, nobody does).
    let stats: Vec<_> = lockers.iter().map(Locker::stats).collect();
    assert!(stats.iter().all(|s| s.wakeups > 0), "{stats:?}");
}

/// (d) The waiting Locker's listener is cut off while its waiter sleeps on a rung key:
/// its sessions (the one holding the registration, the one blocked on the bell) are
/// killed, so the release that follows reaches no bell of it. The waiter still gets the
/// key, by polling, not half a minute later at the holder's lease end: a listener that
/// fails wakes its waiters (they may have missed a release), which from then on keep
/// their own pace until it hears them again. The listener opened again 100 ms later
/// wakes every head too. This case checks the grant and that no bell of the dead
/// listener counted, not which wake came first.
pub async fn a_waiter_whose_listener_is_cut_off_still_gets_the_key<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    if !DB::WAKES_BY_BELLS {
        return;
    }
    let key = "deaf";
    let Rung {
        holder,
        account,
        waiters,
        waiter,
    } = rung(&db, key).await;
    // The pool's sessions idle between attempts; the listener's hold a wait name or wait
    // in GET_LOCK.
    let (w0, w1) = (name_sql(&db.table, "w0"), name_sql(&db.table, "w1"));
    let listener = format!(
        "SELECT ID FROM information_schema.PROCESSLIST WHERE USER = ? \
           AND (ID IN (IS_USED_LOCK({w0}), IS_USED_LOCK({w1})) OR STATE = 'User lock')"
    );
    let ids = sessions_of(&db, &listener, &account.name, key).await;
    assert!(ids.len() >= 2, "a registry and a blocked session: {ids:?}");
    // Asleep until now (`rung`): an attempt after this is the polling that gets the key
    // (it may be in flight when the holder releases, and win).
    let asleep = waiters.stats();
    for id in &ids {
        DB::exec(&db.pool, format!("KILL {id}"), vec![]).await.ok();
    }
    let gone = format!(
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID IN ({})",
        ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
    );
    wait_until("the listener broke", PATIENCE, async || {
        let left = DB::fetch_i64(&db.pool, gone.clone(), vec![]).await.unwrap();
        left == Some(0) && !waiters.listening()
    })
    .await;
    // The release below rings no bell of it: no session of its listener is left. Its
    // failure may still count one wake-up after the check above (the blocked session's
    // failure wakes the queue's head, counted when the listener's loop takes it, unless
    // the loop sees the registry's failure first). A listener opened again (100 ms after
    // the break, sooner than a busy machine may get to the release) may hear the bell:
    // then only the grant is checked.
    let before = waiters.stats();
    holder.release().await.unwrap();
    let (guard, _) = timeout(PATIENCE, waiter)
        .await
        .expect("the waiter gets the lock by polling")
        .expect("the waiter's task");
    let after = waiters.stats();
    if after.listener_connects == before.listener_connects {
        assert!(after.wakeups <= before.wakeups + 1, "no bell: {after:?}");
    }
    assert!(after.attempts > asleep.attempts, "{after:?}");
    guard.release().await.unwrap();
}

/// The session ids `sql` (bound with `user`, then `key` twice) picks.
async fn sessions_of<DB: TestBackend>(
    db: &TestDb<DB>,
    sql: &str,
    user: &str,
    key: &str,
) -> Vec<i64> {
    let mut ids = Vec::new();
    // One id per query: the harness reads one integer at a time.
    loop {
        let not_in = if ids.is_empty() {
            String::new()
        } else {
            let list: Vec<String> = ids.iter().map(i64::to_string).collect();
            format!(" AND ID NOT IN ({})", list.join(","))
        };
        let args: Vec<Arg> = vec![user.into(), key.into(), key.into()];
        let next = DB::fetch_i64(&db.pool, format!("{sql}{not_in} LIMIT 1"), args).await;
        match next.expect("read the sessions") {
            Some(id) => ids.push(id),
            None => return ids,
        }
    }
}
