//! The core of a Locker: what its clones, guards and [`Owner`](crate::Owner)s share, one
//! layer below the API. It owns the lock-table access layer, the counters and metrics,
//! the retry policy, the local queues of waiters, the release listener, fair mode's
//! tickets, the lease engine, and the background work of all of them; the API reaches
//! each part here, and the algorithm (`acquire.rs`, the engine) is handed the parts it
//! works with.

use std::sync::Arc;
use std::time::Duration;

use crate::config::{LeaseMargin, RetryPolicy};
use crate::dialect::Backend;
use crate::engine::{self, Engine};
use crate::fair::{Fair, Tickets};
use crate::jobs::Jobs;
use crate::key_label::KeyLabel;
use crate::metrics::TableMetrics;
use crate::queue::LocalQueues;
use crate::recorder::{self, Recorder};
use crate::stand_aside::StandAsides;
use crate::stats::Counters;
use crate::table::{ConnectOptions, LockTable};
use crate::wakeups::Wakeups;

/// What a Locker's clones, guards and owners share.
pub(crate) struct Core<DB: Backend> {
    pub(crate) table: Arc<LockTable<DB>>,
    pub(crate) metrics: TableMetrics,
    pub(crate) counters: Arc<Counters>,
    pub(crate) retry: RetryPolicy,
    /// This Locker's waiters, by key.
    pub(crate) queues: Arc<LocalQueues>,
    /// The listener that hears releases of other processes (PostgreSQL's `NOTIFY`,
    /// SQLite's look at the file, MySQL/MariaDB's bells).
    pub(crate) wakeups: Arc<Wakeups<DB>>,
    /// The stand-asides of this Locker's resigned leaders.
    pub(crate) stand_asides: StandAsides,
    /// Fair mode: the tickets of this Locker's waiters.
    pub(crate) tickets: Option<Arc<Tickets>>,
    /// Renews the held leases and ends them.
    pub(crate) engine: Engine<DB>,
    /// Every background task of the Locker: stopped (and awaited) together.
    pub(crate) jobs: Jobs,
    /// Put before the random part of every owner value.
    pub(crate) owner_prefix: String,
    pub(crate) default_lease: Duration,
    pub(crate) renew_interval: Duration,
    /// How long before the database may see a lease expire that it ends locally.
    pub(crate) margin: LeaseMargin,
    /// The lock history's recorder, when this Locker records one.
    pub(crate) history: Option<Arc<Recorder>>,
}

/// How a Locker hears releases of other processes.
pub(crate) struct Listen<DB: Backend> {
    /// Whether to listen at all (only backends with notifications do).
    pub(crate) on: bool,
    /// The listener's own address; `None`: the pool's, if it is a session of its own.
    pub(crate) options: Option<ConnectOptions<DB>>,
}

/// A Locker's validated options, from its builder.
pub(crate) struct Settings<DB: Backend> {
    pub(crate) table: LockTable<DB>,
    pub(crate) retry: RetryPolicy,
    pub(crate) listen: Listen<DB>,
    pub(crate) fair: bool,
    pub(crate) owner_prefix: String,
    pub(crate) default_lease: Duration,
    pub(crate) renew_interval: Duration,
    pub(crate) margin: LeaseMargin,
    pub(crate) key_label: KeyLabel,
    /// The lock history's retention, when the Locker records one.
    pub(crate) history: Option<Duration>,
}

impl<DB: Backend> Core<DB> {
    pub(crate) fn new(settings: Settings<DB>) -> Self {
        let table = Arc::new(settings.table);
        let metrics = TableMetrics::new(table.name(), settings.key_label);
        let counters = Arc::new(Counters::default());
        let queues = Arc::new(LocalQueues::new(metrics.clone()));
        let listen = settings.listen;
        let wakes = DB::NOTIFIES || DB::RINGS_BELLS;
        let wakeups = Arc::new(Wakeups::new(listen.on && wakes, listen.options));
        let jobs = Jobs::default();
        let history = settings.history.map(|retention| {
            let recorder = Arc::new(Recorder::new(retention, Arc::clone(&counters)));
            recorder::start_flusher(Arc::clone(&recorder), Arc::clone(&table), &jobs);
            recorder
        });
        let engine = Engine::new(engine::Parts {
            table: Arc::clone(&table),
            metrics: metrics.clone(),
            counters: Arc::clone(&counters),
            retry: settings.retry,
            queues: Arc::clone(&queues),
            wakeups: Arc::clone(&wakeups),
            jobs: jobs.clone(),
            margin: settings.margin,
            history: history.clone(),
        });
        let tickets = settings.fair.then(|| {
            Arc::new(Tickets::new(
                settings.default_lease,
                settings.renew_interval,
            ))
        });
        Core {
            table,
            metrics,
            counters,
            retry: settings.retry,
            queues,
            wakeups,
            stand_asides: StandAsides::default(),
            tickets,
            engine,
            jobs,
            owner_prefix: settings.owner_prefix,
            default_lease: settings.default_lease,
            renew_interval: settings.renew_interval,
            margin: settings.margin,
            history,
        }
    }

    /// Fair mode's line, when the Locker is fair.
    pub(crate) fn fair_line(&self) -> Option<Fair<'_, DB>> {
        self.tickets.as_ref().map(|tickets| Fair {
            table: &self.table,
            tickets,
            queues: &self.queues,
            jobs: &self.jobs,
            retry: &self.retry,
            engine: &self.engine,
        })
    }

    /// Starts the release listener if it is not running yet (it lives until the Locker's
    /// jobs stop); [`listening`](Self::listening) says when it is up.
    pub(crate) fn start_listener(&self) {
        if self.wakeups.claim_start() {
            let (wakeups, table) = (Arc::clone(&self.wakeups), Arc::clone(&self.table));
            let (queues, counters) = (Arc::clone(&self.queues), Arc::clone(&self.counters));
            let jobs = self.jobs.clone();
            self.jobs
                .spawn(async move { wakeups.run(&table, &queues, &counters, &jobs).await });
        }
    }

    /// Whether releases elsewhere wake this Locker's waiters right now: the listener is
    /// up and, with bells (MySQL/MariaDB), hears the rows of every queue with waiters.
    pub(crate) fn listening(&self) -> bool {
        self.wakeups.live() && (DB::NOTIFIES || self.queues.all_heard())
    }

    /// Whether a release wakes the waiters of `queue` right now: the listener is up and
    /// hears every release (PostgreSQL's `NOTIFY`), or the bells of `queue`'s rows.
    pub(crate) fn hears(&self, queue: &str) -> bool {
        self.wakeups.live() && (DB::NOTIFIES || self.queues.heard(queue))
    }

    /// A fresh, unguessable owner value: the prefix and 32 hex digits of a random UUID.
    pub(crate) fn new_owner(&self) -> String {
        // Built by hand: `format!` costs more than the rest of making the value.
        let mut digits = uuid::Uuid::encode_buffer();
        let digits = uuid::Uuid::new_v4().simple().encode_lower(&mut digits);
        let mut owner = String::with_capacity(self.owner_prefix.len() + digits.len());
        owner.push_str(&self.owner_prefix);
        owner.push_str(digits);
        owner
    }

    /// Stops every background task of the Locker and waits for them: renewal ends (held
    /// leases lapse at their deadlines), the engine finishes its background releases, the
    /// ticket job deletes the tickets given up. Then the history's last events are
    /// written, those the stopping jobs noted too.
    pub(crate) async fn shutdown(&self) {
        self.jobs.stopped().await;
        if let Some(history) = &self.history {
            history.flush_all(&self.table).await;
        }
    }
}

impl<DB: Backend> Drop for Core<DB> {
    /// The last clone and the last guard are gone: the background work stops (without
    /// anyone waiting for it).
    fn drop(&mut self) {
        self.jobs.stop();
    }
}
