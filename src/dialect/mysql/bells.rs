//! MySQL/MariaDB: a Locker's release listener, built on named locks (the statements and
//! what the names are: `mysql.rs`, "Bells").
//!
//! The listener has a connection of its own, the *registry*, and up to [`MAX_BLOCKED`]
//! more, each blocked in the server on one row's bell. For every queue the Locker's
//! waiters wait in (the key of a mutex, the group `<name>~` of a primitive), the registry
//! holds one of the queue's wait names, and looks up the queue's live rows (one row for a
//! mutex or a leader, every member for a group) and who holds their bells. Each belled row
//! gets a blocked session; when the bell is let go (the holder's release committed, or its
//! session ended) the server wakes that session, and the listener hands the queue's head
//! its turn, as a heard `NOTIFY` does on PostgreSQL. A queue whose live rows are all
//! belled and blocked on is *heard* (`Waiting::hearing`): its waiters then sleep long,
//! waiting for the bell. Any other queue (a row without a bell: its holder saw nobody
//! registered, or is a plain-SQL client; more rows than blocked sessions) is looked at
//! again after a pause (1 ms a few times, then doubling to 500 ms), and its waiters keep
//! polling.
//!
//! Whatever goes wrong here costs polling, never a grant: a blocked session that fails
//! wakes the queue's head; the registry failing ends the listener, whose loop
//! (`wakeups.rs`) wakes every head and opens it again.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use sqlx::mysql::MySqlConnectOptions;
use sqlx::{Connection, MySql, MySqlConnection};
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, sleep_until, timeout};

use super::{BellSql, registered_key};
use crate::config::GROUP_MARK;
use crate::dialect::{
    Contention, ErrorCodes, ListenerOptions, Released, Releases, Waiting, audited,
};

/// Most sessions one listener keeps blocked on bells at once (beside its registry): a
/// Locker waits on at most this many belled rows (a semaphore's permits, several hot
/// keys); the waiters of rows past it poll.
pub(super) const MAX_BLOCKED: usize = 4;
/// How long one blocked statement waits for its bell before the listener looks at the
/// queue again: whole seconds (MySQL 8 takes no fraction). It bounds how long a blocked
/// session outlives the wait it served, and how late an unrung end of a row is seen (a
/// release whose bell could not be dropped, a force release).
const BLOCK_SECS: i64 = 1;
/// Bound on one round of registry statements.
const ROUND_LIMIT: Duration = Duration::from_secs(10);
/// Pause before a queue that is not heard is looked at again: the first, this many times
/// (a bell rang, and the next holder takes its bell a round trip after its win: the next
/// look should find it before that holder's release), then doubling to the last.
const LOOK_FIRST: Duration = Duration::from_millis(1);
const LOOKS_AT_FIRST: u32 = 8;
const LOOK_MAX: Duration = Duration::from_millis(500);
/// After a blocking session failed (to open, or to block), none blocks for this long.
const OPEN_PAUSE: Duration = Duration::from_secs(1);
/// A bell carries no fencing token: a heard release is never taken for one of the
/// Locker's own NOTIFYs.
const NO_TOKEN: i64 = i64::MIN;

/// A future that owns what it works on and hands it back.
type Owned<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The listener as its loop sees it: heard queues, one at a time.
pub(super) struct Bells {
    /// Everything the listener does, polled while `next` or `check` is: it owns its
    /// connections, so a dropped `next` (the loop's liveness check) interrupts nothing.
    driver: Option<Owned<sqlx::Error>>,
    heard: mpsc::UnboundedReceiver<String>,
    pings: mpsc::UnboundedSender<oneshot::Sender<()>>,
    waiting: Arc<dyn Waiting>,
}

impl Bells {
    /// The listener on `registry` (a session of its own, `session` its connection id).
    pub(super) fn start(
        registry: MySqlConnection,
        session: u64,
        listener: ListenerOptions<MySql>,
        sql: BellSql,
    ) -> Self {
        let (heard_tx, heard) = mpsc::unbounded_channel();
        let (pings, pings_rx) = mpsc::unbounded_channel();
        let waiting = listener.waiting;
        waiting.registered_as(Some(session));
        let driver = Driver {
            sql: Arc::new(sql),
            options: listener.options,
            waiting: Arc::clone(&waiting),
            heard: heard_tx,
            pings: pings_rx,
            registry: Some(registry),
            registered: HashSet::new(),
            queues: HashMap::new(),
            blocked: Vec::new(),
            spare: Vec::new(),
            sessions: HashSet::from([session]),
            open_after: None,
            register_at: None,
        };
        Bells {
            driver: Some(Box::pin(driver.run())),
            heard,
            pings,
            waiting,
        }
    }
}

/// Polls `driver` until `until` completes; the driver's error if it ends first (then it
/// is gone: every later call fails at once).
async fn driven<T>(
    driver: &mut Option<Owned<sqlx::Error>>,
    until: impl Future<Output = T>,
) -> Result<T, sqlx::Error> {
    let Some(running) = driver.as_mut() else {
        return Err(sqlx::Error::PoolClosed);
    };
    // The driver first: once it ended, what it sent before is stale (its loop wakes
    // every waiter after an error anyway).
    tokio::select! {
        biased;
        err = running => {
            *driver = None;
            Err(err)
        }
        done = until => Ok(done),
    }
}

impl Drop for Bells {
    fn drop(&mut self) {
        // The registry goes with the driver: its names and every bell wait end with it.
        self.waiting.registered_as(None);
        for queue in self.waiting.keys() {
            self.waiting.hearing(&queue, &[]);
        }
    }
}

impl Releases for Bells {
    fn next(
        &mut self,
    ) -> Pin<Box<dyn Future<Output = Result<Option<Released>, sqlx::Error>> + Send + '_>> {
        Box::pin(async move {
            // The sender lives in the driver: `None` only once it ended, whose error the
            // driver's branch answers first (`Ok(None)` would say "reconnected").
            let queue = driven(&mut self.driver, self.heard.recv()).await?;
            let key = queue.ok_or(sqlx::Error::PoolClosed)?;
            Ok(Some(Released {
                key,
                fencing_token: NO_TOKEN,
            }))
        })
    }

    fn check(&mut self) -> Pin<Box<dyn Future<Output = Result<(), sqlx::Error>> + Send + '_>> {
        Box::pin(async move {
            let (answer, answered) = oneshot::channel();
            self.pings.send(answer).ok();
            driven(&mut self.driver, answered)
                .await?
                .map_err(|_| sqlx::Error::PoolClosed)
        })
    }
}

/// One queue the Locker's waiters wait in.
struct Watch {
    /// Its live rows the last look found belled and blocked on, with when each lease
    /// ends: the release of any of them wakes the queue's head.
    rows: Vec<(String, Instant)>,
    /// Whether those are all its live rows: the queue is heard, its waiters sleep long.
    heard: bool,
    /// When to look at it next; `None` while it is heard (a bell, or a blocked
    /// statement's end, says when).
    look_at: Option<Instant>,
    /// Looks in a row that found it unheard (they set the next pause).
    unheard: u32,
}

impl Watch {
    fn new(now: Instant) -> Self {
        Watch {
            rows: Vec::new(),
            heard: false,
            look_at: Some(now),
            unheard: 0,
        }
    }
}

/// A session blocked on the bell of `row` (or opening to be).
struct Blocked {
    row: String,
    outcome: Owned<(Option<Spare>, Result<Rang, sqlx::Error>)>,
}

/// An open blocking session, with its connection id.
type Spare = (MySqlConnection, u64);

/// How a blocked statement ended.
#[derive(Debug, PartialEq, Eq)]
enum Rang {
    /// The bell was let go (or was free already).
    Yes,
    /// Its bound ran out first.
    NotYet,
}

/// A live row as a look reads it: key, the session holding its bell, microseconds its
/// lease has left.
type LiveRow = (Vec<u8>, Option<i64>, i64);

/// What one round of registry statements is to do.
#[derive(Default)]
struct Plan {
    register: Vec<String>,
    unregister: Vec<String>,
    /// Queues to look at, with the key range of their rows.
    look: Vec<(String, Vec<u8>, Vec<u8>)>,
}

/// What a round found.
#[derive(Default)]
struct Round {
    /// Registered keys: whether this session holds a wait name of each now.
    registered: Vec<(String, bool)>,
    /// Each looked-at queue's live rows.
    found: Vec<(String, Vec<LiveRow>)>,
}

struct Driver {
    sql: Arc<BellSql>,
    options: MySqlConnectOptions,
    waiting: Arc<dyn Waiting>,
    heard: mpsc::UnboundedSender<String>,
    pings: mpsc::UnboundedReceiver<oneshot::Sender<()>>,
    /// `None` while a round runs on it.
    registry: Option<MySqlConnection>,
    /// Keys whose wait name the registry holds.
    registered: HashSet<String>,
    queues: HashMap<String, Watch>,
    blocked: Vec<Blocked>,
    /// Blocking sessions not in use.
    spare: Vec<Spare>,
    /// This listener's sessions: a bell one of them holds (for the instant between being
    /// woken and letting go) is nobody's.
    sessions: HashSet<u64>,
    /// After a failure to open a blocking session, when to try again.
    open_after: Option<Instant>,
    /// When to try again registrations that found both wait names taken.
    register_at: Option<Instant>,
}

impl Driver {
    /// Runs until the registry fails; its error.
    async fn run(mut self) -> sqlx::Error {
        let mut round: Option<Owned<(MySqlConnection, Result<Round, sqlx::Error>)>> = None;
        let mut pings: Vec<oneshot::Sender<()>> = Vec::new();
        let mut answering: Vec<oneshot::Sender<()>> = Vec::new();
        let mut sync = true;
        loop {
            if round.is_none() {
                if self.register_at.is_some_and(|at| at <= Instant::now()) {
                    self.register_at = None;
                    sync = true;
                }
                let plan = self.plan(std::mem::take(&mut sync));
                let ping = !pings.is_empty();
                if ping || !plan.is_empty() {
                    let conn = self.registry.take().expect("the registry is idle");
                    round = Some(Box::pin(registry_round(Arc::clone(&self.sql), conn, plan)));
                    answering = std::mem::take(&mut pings);
                }
            }
            let next_look = round
                .is_none()
                .then(|| {
                    let looks = self.queues.values().filter_map(|w| w.look_at);
                    looks.chain(self.register_at).min()
                })
                .flatten();
            tokio::select! {
                (at, (spare, rang)) = first_done(&mut self.blocked), if !self.blocked.is_empty() => {
                    let blocked = self.blocked.swap_remove(at);
                    self.unblocked(blocked.row, spare, rang);
                }
                (conn, found) = async { round.as_mut().expect("a round").await }, if round.is_some() => {
                    round = None;
                    self.registry = Some(conn);
                    match found {
                        Ok(found) => self.apply(found),
                        Err(err) => return err,
                    }
                    for ping in answering.drain(..) {
                        ping.send(()).ok();
                    }
                }
                _ = self.waiting.joined() => sync = true,
                _ = sleep_until(next_look.unwrap_or_else(Instant::now)), if next_look.is_some() => {}
                Some(ping) = self.pings.recv() => pings.push(ping),
            }
        }
    }

    /// The next round: registrations to take or drop (`sync`: the waited queues may
    /// have changed), and the queues due for a look.
    fn plan(&mut self, sync: bool) -> Plan {
        let now = Instant::now();
        let mut plan = Plan::default();
        if sync {
            let keys: HashSet<String> = self.waiting.keys().into_iter().collect();
            self.queues.retain(|queue, _| keys.contains(queue));
            for queue in &keys {
                self.queues
                    .entry(queue.clone())
                    .or_insert_with(|| Watch::new(now));
            }
            let wanted: HashSet<String> = keys
                .iter()
                .map(|queue| registered_key(queue).to_owned())
                .collect();
            plan.unregister = self.registered.difference(&wanted).cloned().collect();
            plan.register = wanted.difference(&self.registered).cloned().collect();
            if keys.is_empty() {
                // Nobody waits: the blocking sessions are closed (opened again when needed).
                self.spare.clear();
            }
        }
        for (queue, watch) in &mut self.queues {
            if watch.look_at.is_some_and(|at| at <= now) {
                watch.look_at = None;
                let (from, to) = rows_of(queue);
                plan.look.push((queue.clone(), from, to));
            }
        }
        plan
    }

    /// What a round found: registrations, and each looked-at queue's rows.
    fn apply(&mut self, round: Round) {
        let now = Instant::now();
        for (key, held) in round.registered {
            if held {
                self.registered.insert(key);
            } else {
                // Two other processes hold the names: any holder sees them, and rings
                // for everyone. Tried again: one of them may leave.
                self.register_at.get_or_insert(now + LOOK_MAX);
            }
        }
        self.registered.retain(|key| {
            self.queues
                .keys()
                .any(|queue| registered_key(queue) == key.as_str())
        });
        for (queue, rows) in round.found {
            self.watch(&queue, rows, now);
        }
    }

    /// Blocks on the belled rows of `queue` (as many as there are sessions for), and
    /// says whether it is heard now: every live row belled and blocked on.
    fn watch(&mut self, queue: &str, rows: Vec<LiveRow>, now: Instant) {
        let Some(watch) = self.queues.get(queue) else {
            return; // nobody waits there any more
        };
        let was_heard = watch.heard;
        let mut watched = Vec::new();
        let mut all = !rows.is_empty();
        for (key, bell, left) in rows {
            // Keys are written as UTF-8 by dblock; a plain-SQL client's stray bytes are
            // shown, not refused (their releases are never heard: no bell).
            let key = String::from_utf8_lossy(&key).into_owned();
            let ends = now + Duration::from_micros(u64::try_from(left).unwrap_or(0));
            let belled = bell
                .and_then(|id| u64::try_from(id).ok())
                .is_some_and(|id| !self.sessions.contains(&id));
            if belled && self.block(&key, now) {
                watched.push((key, ends));
            } else {
                all = false;
            }
        }
        let watch = self.queues.get_mut(queue).expect("looked up above");
        let keys: Vec<String> = watched.iter().map(|(key, _)| key.clone()).collect();
        let changed = watch.heard != all
            || watch.rows.len() != watched.len()
            || watch.rows.iter().zip(&watched).any(|(a, b)| a.0 != b.0);
        watch.heard = all;
        watch.rows = watched;
        if all {
            watch.look_at = None;
            watch.unheard = 0;
        } else {
            // Its waiters poll; the next holder of a free or unbelled row may take its
            // bell at any moment.
            let doubled = watch.unheard.saturating_sub(LOOKS_AT_FIRST).min(10);
            watch.look_at = Some(now + (LOOK_FIRST * 2u32.pow(doubled)).min(LOOK_MAX));
            watch.unheard += 1;
        }
        if changed {
            self.waiting.hearing(queue, if all { &keys } else { &[] });
        }
        if was_heard && !all {
            // Heard until now, and no bell rang: the rows ended unrung (a force release,
            // a bell that could not be dropped), or one more came. The waiters, asleep
            // on the bells, try now and keep their own pace from then on.
            self.heard.send(queue.to_owned()).ok();
        }
    }

    /// A blocked session on `row`'s bell: `true` when one is (already, or now).
    fn block(&mut self, row: &str, now: Instant) -> bool {
        if self.blocked.iter().any(|blocked| blocked.row == row) {
            return true;
        }
        if self.blocked.len() >= MAX_BLOCKED {
            return false;
        }
        // A session that failed (to open, or to block) pauses the blocking for a while:
        // its waiters poll meanwhile, rather than being woken at every failure.
        if self.open_after.is_some_and(|at| now < at) {
            return false;
        }
        let spare = self.spare.pop();
        let (sql, options, key) = (Arc::clone(&self.sql), self.options.clone(), row.to_owned());
        let outcome = Box::pin(async move {
            let (mut conn, session) = match spare {
                Some(spare) => spare,
                None => match open(&options).await {
                    Ok(opened) => opened,
                    Err(err) => return (None, Err(err)),
                },
            };
            let rang = wait_for_bell(&mut conn, &sql, &key).await;
            // A database's error answer leaves the session usable; anything else may not.
            let usable = !matches!(rang, Err(ref err) if !matches!(err, sqlx::Error::Database(_)));
            (usable.then_some((conn, session)), rang)
        });
        self.blocked.push(Blocked {
            row: row.to_owned(),
            outcome,
        });
        true
    }

    /// A blocked statement on `row`'s bell ended.
    fn unblocked(&mut self, row: String, spare: Option<Spare>, rang: Result<Rang, sqlx::Error>) {
        let now = Instant::now();
        if let Some((conn, session)) = spare {
            self.sessions.insert(session);
            if !self.queues.is_empty() {
                self.spare.push((conn, session));
            }
        }
        if rang.is_err() {
            self.open_after = Some(now + OPEN_PAUSE);
        }
        let rang = match rang {
            Ok(rang) => rang,
            Err(err) => {
                tracing::debug!(error = %err, "a session blocked on a bell failed; its waiters try now");
                Rang::Yes
            }
        };
        for (queue, watch) in &mut self.queues {
            let Some(at) = watch.rows.iter().position(|(key, _)| *key == row) else {
                continue;
            };
            watch.look_at = Some(now);
            watch.unheard = 0;
            // Rung, or the row's lease has ended meanwhile (a holder that stopped
            // answering keeps its bell): the head tries now. Otherwise the look that
            // follows blocks on the bell again.
            let (_, ends) = watch.rows[at];
            if rang == Rang::Yes || ends <= now {
                watch.rows.swap_remove(at);
                if std::mem::take(&mut watch.heard) {
                    self.waiting.hearing(queue, &[]);
                }
                self.heard.send(queue.clone()).ok();
            }
        }
    }
}

impl Plan {
    fn is_empty(&self) -> bool {
        self.register.is_empty() && self.unregister.is_empty() && self.look.is_empty()
    }
}

/// The key range of the rows a queue waits for: a group's members (`<name>~...`), or
/// the one row of a mutex's key.
fn rows_of(queue: &str) -> (Vec<u8>, Vec<u8>) {
    let from = queue.as_bytes().to_vec();
    let mut to = from.clone();
    match to.last_mut() {
        // The byte after the mark, which is ASCII: every key that starts with the group.
        Some(last) if queue.ends_with(GROUP_MARK) => *last += 1,
        // The first key past this one.
        _ => to.push(0),
    }
    (from, to)
}

/// The first of `blocked` to end: its place and outcome.
async fn first_done(
    blocked: &mut [Blocked],
) -> (usize, (Option<Spare>, Result<Rang, sqlx::Error>)) {
    std::future::poll_fn(|cx| {
        for (at, blocked) in blocked.iter_mut().enumerate() {
            if let Poll::Ready(outcome) = blocked.outcome.as_mut().poll(cx) {
                return Poll::Ready((at, outcome));
            }
        }
        Poll::Pending
    })
    .await
}

/// A blocking session: a connection of its own, and its id.
async fn open(options: &MySqlConnectOptions) -> Result<Spare, sqlx::Error> {
    let mut conn = MySqlConnection::connect_with(options).await?;
    let session: i64 = sqlx::query_scalar("SELECT CAST(CONNECTION_ID() AS SIGNED)")
        .fetch_one(&mut conn)
        .await?;
    Ok((conn, u64::try_from(session).unwrap_or_default()))
}

/// Blocks on the bell of `row` for at most [`BLOCK_SECS`].
async fn wait_for_bell(
    conn: &mut MySqlConnection,
    sql: &BellSql,
    row: &str,
) -> Result<Rang, sqlx::Error> {
    let rang: Result<Option<i64>, sqlx::Error> = sqlx::query_scalar(audited(&sql.block))
        .bind(row)
        .bind(row)
        .bind(BLOCK_SECS)
        .bind(row)
        .fetch_one(conn)
        .await;
    let rang = match rang {
        // A server-wide `max_statement_time` shorter than the wait cut it: not rung.
        Err(err) if MySql::contention(&err) == Contention::LostRace => return Ok(Rang::NotYet),
        rang => rang?,
    };
    Ok(match rang {
        Some(0 | 1) => Rang::Yes,
        _ => Rang::NotYet,
    })
}

/// One round of registry statements, on `conn`, which it hands back.
async fn registry_round(
    sql: Arc<BellSql>,
    mut conn: MySqlConnection,
    plan: Plan,
) -> (MySqlConnection, Result<Round, sqlx::Error>) {
    let work = async {
        let mut round = Round::default();
        for key in &plan.unregister {
            sqlx::query(audited(&sql.unregister))
                .bind(key)
                .bind(key)
                .execute(&mut conn)
                .await?;
        }
        for key in &plan.register {
            let held: Option<i64> = sqlx::query_scalar(audited(&sql.register))
                .bind(key)
                .bind(key)
                .bind(key)
                .bind(key)
                .fetch_one(&mut conn)
                .await?;
            round.registered.push((key.clone(), held == Some(1)));
        }
        for (queue, from, to) in &plan.look {
            let rows: Vec<(Vec<u8>, Option<i64>, i64)> = sqlx::query_as(audited(&sql.discover))
                .bind(from)
                .bind(to)
                .bind(MAX_BLOCKED as i64 + 1)
                .fetch_all(&mut conn)
                .await?;
            round.found.push((queue.clone(), rows));
        }
        if plan.is_empty() {
            // Only a liveness check was asked for.
            sqlx::query("SELECT 1").execute(&mut conn).await?;
        }
        Ok(round)
    };
    let round = timeout(ROUND_LIMIT, work).await.unwrap_or_else(|_| {
        Err(sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "the bell registry did not answer in time",
        )))
    });
    (conn, round)
}
