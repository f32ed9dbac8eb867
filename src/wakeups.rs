//! Wake-ups across processes: one listener per Locker, owned by its engine, that hears
//! the releases of the lock table (PostgreSQL `LISTEN`; SQLite on a database file: a
//! connection that notices other connections' commits and reads the marks of this
//! Locker's waiters, `dialect/sqlite/listener.rs`; MySQL/MariaDB's bells, named locks its
//! own sessions block on, see `dialect/mysql/bells.rs`).
//!
//! A waiter that lost an attempt marks the row it waits for (`note_waiter`; SQLite: its
//! queue's key, for its Locker); deleting a marked row (release, reaper) sends a
//! notification at commit (SQLite: pokes the mark), and the listener hands the head of
//! that key's local queue its turn at once. With bells the listener itself registers the
//! keys its waiters wait for, and hears the release of a row whose holder saw that
//! registration. Correctness never depends on a wake-up: every waiter still sleeps at
//! most until the holder's known expiry or its capped backoff, so a lost one costs that
//! fallback wait, no more.
//!
//! The listener starts with the first waiter that has to sleep, and lives until the
//! engine stops. A dropped connection is opened again (with a capped backoff) and every
//! head is woken then, since releases may have gone unheard meanwhile. Behind a
//! transaction pooler, where `LISTEN` would reach other clients instead, the listener is
//! not opened at all unless it was given an address of its own.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::{Instant, sleep};

use crate::dialect::{Backend, Released, Waiting};
use crate::jobs::Jobs;
use crate::queue::LocalQueues;
use crate::retry::by_deadline;
use crate::stats::Counters;
use crate::table::{ConnectOptions, LockTable};

/// How long one try to open the listener may take.
const CONNECT_LIMIT: Duration = Duration::from_secs(10);
/// Pauses between tries to open the listener again: doubling from the first to the last.
const RECONNECT_FIRST: Duration = Duration::from_millis(100);
const RECONNECT_MAX: Duration = Duration::from_secs(5);
/// After this long without a notification the listener checks that its connection still
/// answers (within the Locker's statement timeout), and is opened anew if it does not:
/// a black-holed connection hears nothing and never fails by itself. Waiters poll
/// meanwhile, as they always may.
const LIVENESS_EVERY: Duration = Duration::from_secs(10);
/// How many of this Locker's own releases are remembered, so that their notifications
/// (which arrive after the local queue was already told) do not wake a waiter twice.
const OWN_RELEASES: usize = 4096;

const OFF: u8 = 0;
const NOT_STARTED: u8 = 1;
const CONNECTING: u8 = 2;
const LIVE: u8 = 3;
const UNAVAILABLE: u8 = 4;

/// The listener of one Locker: whether it runs, and what it must not report twice.
pub(crate) struct Wakeups<DB: Backend> {
    state: AtomicU8,
    /// Where to connect, when the caller gave an address of its own.
    options: Option<ConnectOptions<DB>>,
    own: Mutex<OwnReleases>,
}

#[derive(Default)]
struct OwnReleases {
    order: VecDeque<i64>,
    tokens: HashSet<i64>,
}

impl<DB: Backend> Wakeups<DB> {
    /// `listen`: whether to open a listener at all; `options`: its own address.
    pub(crate) fn new(listen: bool, options: Option<ConnectOptions<DB>>) -> Self {
        Wakeups {
            state: AtomicU8::new(if listen { NOT_STARTED } else { OFF }),
            options,
            own: Mutex::new(OwnReleases::default()),
        }
    }

    /// Whether releases elsewhere reach this Locker's waiters right now.
    pub(crate) fn live(&self) -> bool {
        self.state.load(Ordering::Acquire) == LIVE
    }

    /// Claims the start of the listener: `true` exactly once, for the caller that must
    /// spawn [`run`](Self::run).
    pub(crate) fn claim_start(&self) -> bool {
        self.state
            .compare_exchange(NOT_STARTED, CONNECTING, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Remembers that this Locker released the row with `fencing_token`: its
    /// notification, when it comes, is not news.
    pub(crate) fn released_here(&self, fencing_token: i64) {
        // Only a listener that was opening or open when the DELETE committed can hear its
        // notification (one that starts later LISTENs after that commit, and PostgreSQL
        // delivers a notification to the sessions listening at commit), so without one
        // there is nothing to remember: the uncontended cycle skips the lock and the set.
        // Bells (MySQL/MariaDB) carry no token: only NOTIFYs can be this Locker's own.
        if !DB::NOTIFIES || !matches!(self.state.load(Ordering::Acquire), CONNECTING | LIVE) {
            return;
        }
        let mut own = self.own();
        if own.tokens.insert(fencing_token) {
            own.order.push_back(fencing_token);
        }
        while own.order.len() > OWN_RELEASES {
            if let Some(oldest) = own.order.pop_front() {
                own.tokens.remove(&oldest);
            }
        }
    }

    fn own(&self) -> MutexGuard<'_, OwnReleases> {
        self.own.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a heard release came from this Locker (forgetting it: it is heard once).
    fn was_own(&self, released: &Released) -> bool {
        // Its entry in `order` stays until it is the oldest: removing it is a no-op then.
        self.own().tokens.remove(&released.fencing_token)
    }

    /// The listener's loop, until the Locker's jobs stop: opens the listener, hands every
    /// heard release of another Locker to the local queues, and opens it again when it
    /// breaks.
    pub(crate) async fn run(
        &self,
        table: &LockTable<DB>,
        queues: &Arc<LocalQueues>,
        counters: &Counters,
        jobs: &Jobs,
    ) {
        let mut pause = RECONNECT_FIRST;
        loop {
            self.state.store(CONNECTING, Ordering::Release);
            let opened = by_deadline(
                Instant::now() + CONNECT_LIMIT,
                table.listen(
                    self.options.as_ref(),
                    Arc::clone(queues) as Arc<dyn Waiting>,
                ),
            );
            let opened = tokio::select! {
                _ = jobs.stopping() => return,
                opened = opened => opened,
            };
            match opened {
                Ok(Some(mut releases)) => {
                    self.state.store(LIVE, Ordering::Release);
                    Counters::bump(&counters.listener_connects);
                    pause = RECONNECT_FIRST;
                    tracing::debug!(table = table.name(), "listening for releases");
                    // Releases before the listener was up went unheard: everyone looks.
                    queues.wake_all();
                    loop {
                        // `next` may be dropped for the check: sqlx's receive is cancel
                        // safe (it takes a message from its buffer only once whole).
                        let heard = tokio::select! {
                            _ = jobs.stopping() => return,
                            heard = releases.next() => heard,
                            _ = sleep(LIVENESS_EVERY) => {
                                let bound = Instant::now() + table.statement_timeout();
                                match by_deadline(bound, releases.check()).await {
                                    Ok(()) => continue,
                                    Err(err) => Err(err),
                                }
                            }
                        };
                        match heard {
                            Ok(Some(released)) => {
                                if !self.was_own(&released) && queues.released(&released.key) {
                                    Counters::bump(&counters.wakeups);
                                }
                            }
                            Ok(None) => {
                                Counters::bump(&counters.listener_connects);
                                queues.wake_all();
                            }
                            Err(err) => {
                                tracing::warn!(table = table.name(), error = %err, "the release listener broke; waiters poll until it is back");
                                break;
                            }
                        }
                    }
                    self.state.store(CONNECTING, Ordering::Release);
                    queues.wake_all();
                }
                Ok(None) => {
                    self.state.store(UNAVAILABLE, Ordering::Release);
                    return;
                }
                Err(err) => {
                    tracing::debug!(table = table.name(), error = %err, "could not open the release listener; trying again");
                }
            }
            tokio::select! {
                _ = jobs.stopping() => return,
                _ = sleep(pause) => {}
            }
            pause = (pause * 2).min(RECONNECT_MAX);
        }
    }
}
