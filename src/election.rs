//! [`Election`]: one leader among candidates, a term that rises with every new leader,
//! and a view of who leads for everyone.
//!
//! The leader holds the row `<name>~leader` as a mutex holder does (renewed by its
//! Locker's engine); its owner value is `<identity>~<32 hex digits>`, so anyone can read
//! who leads, and its fencing token is the term.

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};

use crate::acquire;
use crate::config::{MAX_WAIT, validate_lease, validate_range};
use crate::dialect::Backend;
use crate::error::{Error, LostReason, Result, shown_key};
use crate::guard::LockGuard;
use crate::locker::Locker;
use crate::metrics::{self, Kind};
use crate::primitive::{group_key, member_key, validate_name};
use crate::queue::GROUP_MARK;
use crate::retry::Backoff;

/// Longest candidate identity, in bytes: with `~` and 32 random hex digits it fills the
/// 64 bytes of `lock_value`.
pub const MAX_IDENTITY_BYTES: usize = 31;

/// Shortest pause between two reads of a [`LeaderWatch`].
pub const MIN_WATCH_INTERVAL: Duration = Duration::from_millis(10);

/// The part of the leader row's key after the name.
const LEADER: &str = "leader";

/// Leader election among candidates of any process: Curator's `LeaderLatch` /
/// `LeaderSelector`, etcd's election API, client-go's Lease-based leader election. Made by
/// [`Locker::election`]; cheap, it touches no database.
///
/// - [`campaign`](Self::campaign) waits until the caller leads and returns its
///   [`Leadership`]: a lease renewed by the Locker, whose [`term`](Leadership::term) (the
///   row's fencing token) is greater than every earlier leader's, so a resource can refuse
///   a deposed leader's writes.
/// - [`run`](Self::run) is the loop most services want: campaign, run the leader's work
///   while leading, stop it when leadership is lost, campaign again.
/// - [`leader`](Self::leader) and [`watch`](Self::watch) tell anyone (candidates or not)
///   who leads: the identity the leader campaigned with (for example its address, so that
///   followers can route to it), its term and since when.
///
/// A leader that crashes leads until its lease ends (database clock); then the next
/// candidate's attempt takes over. A leader that [resigns](Leadership::resign) hands over
/// to a candidate that was waiting, on every backend and in whatever process: candidates
/// of the same Locker are woken by the release, on PostgreSQL candidates elsewhere too (by
/// notification), and elsewhere they find the free row by paced polling
/// ([`RetryPolicy`](crate::RetryPolicy), at most its `max` apart). Meanwhile the resigner,
/// should it campaign again, stands aside for a hold-off (about twice that `max`) unless
/// someone else leads first: so it cannot win again before them. Alone, it leads again
/// after the hold-off.
///
/// **The lease is the failover time.** A dead leader's row was last renewed at most one
/// renew interval (`min(10 s, lease / 3)`) before its death, so the next leader takes over
/// between `lease - renew interval` and `lease` after it: 20-30 s with a 30 s lease,
/// 10-15 s with 15 s. Pick 10-15 s for an election (client-go's leader election uses a
/// 15 s lease) rather than the 30 s [`DEFAULT_LEASE`](crate::DEFAULT_LEASE) of locks
/// around work. Shorter costs more renewals, and a leader stalled longer than about two
/// thirds of the lease (a GC pause, a slow network, a database failover) loses the lead:
/// its work is dropped, and the next term is greater, so its fenced writes are refused.
/// The README's "How long a lease" has a table.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
///
/// # let pool = dblock::sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// # let locker = dblock::Locker::new(pool);
/// # locker.migrate().await?;
/// let election = locker.election("billing-scheduler");
/// let lease = Duration::from_secs(15);
/// let leading = election.campaign("10.0.0.7:8080", lease).await?;
///
/// let leader = election.leader().await?.expect("somebody leads");
/// assert_eq!(leader.identity, "10.0.0.7:8080");
/// assert_eq!(leader.term, leading.term());
///
/// leading.resign().await?; // a waiting candidate, of any process, leads next
/// assert_eq!(election.leader().await?, None);
/// # Ok(()) }
/// ```
pub struct Election<DB: Backend> {
    locker: Locker<DB>,
    name: String,
}

impl<DB: Backend> Clone for Election<DB> {
    fn clone(&self) -> Self {
        Election {
            locker: self.locker.clone(),
            name: self.name.clone(),
        }
    }
}

impl<DB: Backend> std::fmt::Debug for Election<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Election")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Who leads an [`Election`], as read from the database.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # use std::time::Duration;
/// # let pool = dblock::sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// # let locker = dblock::Locker::new(pool);
/// # locker.migrate().await?;
/// let election = locker.election("indexer");
/// let _leading = election.campaign("indexer-2", Duration::from_secs(15)).await?;
/// if let Some(leader) = election.leader().await? {
///     println!("{} leads in term {} since {}", leader.identity, leader.term, leader.since);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The identity the leader campaigned with.
    pub identity: String,
    /// The leader's term: its row's fencing token, greater than every earlier leader's.
    pub term: i64,
    /// When it took the lead, by the database clock.
    pub since: DateTime<Utc>,
    /// When its lease ends unless it is renewed, by the database clock.
    pub expires_at: DateTime<Utc>,
}

/// This caller leads: a [`LockGuard`] on the election's leader row (it derefs to one, for
/// [`lost`](LockGuard::lost), [`assert_held`](LockGuard::assert_held) and the rest).
/// [`resign`](Self::resign) hands the lead over; dropped, it is released in the background
/// as a guard is (without the resigner's stand-aside: a campaign after a drop does not
/// wait, nor does one after a release of the guard from [`into_guard`](Self::into_guard)).
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # use std::time::Duration;
/// # let pool = dblock::sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// # let locker = dblock::Locker::new(pool);
/// # locker.migrate().await?;
/// let election = locker.election("compactor");
/// let leading = election.campaign("node-a", Duration::from_secs(15)).await?;
/// assert_eq!(leading.identity(), "node-a");
/// tokio::select! {
///     reason = leading.lost() => println!("deposed: {reason}"),
///     _ = tokio::time::sleep(Duration::from_millis(10)) => println!("did the work as leader"),
/// }
/// let term = leading.term();
/// leading.resign().await?;
/// // Nobody else campaigns: "node-a" leads again after standing aside (about 1.1 s here).
/// let again = election.campaign("node-a", Duration::from_secs(15)).await?;
/// assert!(again.term() > term); // every new lead is a new term
/// # Ok(()) }
/// ```
#[must_use = "the leadership ends as soon as it is dropped; keep it and call resign().await"]
#[derive(Debug)]
pub struct Leadership<DB: Backend> {
    guard: LockGuard<DB>,
    identity: String,
    /// Where [`resign`](Self::resign) records its stand-aside.
    locker: Locker<DB>,
}

impl<DB: Backend> Deref for Leadership<DB> {
    type Target = LockGuard<DB>;

    fn deref(&self) -> &LockGuard<DB> {
        &self.guard
    }
}

impl<DB: Backend> Leadership<DB> {
    /// The term: this lead's fencing token, greater than every earlier leader's. Pass it
    /// with the leader's writes so that a resource can refuse a deposed leader.
    pub fn term(&self) -> i64 {
        self.guard.fencing_token()
    }

    /// The identity this caller campaigned with.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The guard on the leader row.
    pub fn into_guard(self) -> LockGuard<DB> {
        self.guard
    }

    /// Steps down: releases the leader row (as [`LockGuard::release`], with its answer),
    /// so that a candidate that was waiting leads next, in this process or another, on
    /// every backend.
    ///
    /// For that, this identity stands aside in this election through this Locker: its
    /// next [`campaign`](Election::campaign) (or [`run`](Election::run)) makes no attempt
    /// for a hold-off of `2 x max + `[`RESIGN_HOLD_OFF_SLACK`](crate::RESIGN_HOLD_OFF_SLACK)
    /// (100 ms), `max` being the Locker's [`RetryPolicy`](crate::RetryPolicy)'s: 1.1 s by
    /// default, counted from the release's answer. A candidate elsewhere that polls sleeps
    /// at most its own `max` between attempts, so it finds the free row within the
    /// hold-off if that `max` is no longer than this Locker's. The standing-aside campaign
    /// reads the row four times during its hold-off: once it shows a greater term
    /// (someone else leads, or led), it campaigns as any candidate does, and waits its
    /// turn. So with nobody else campaigning it leads again after the hold-off; with
    /// others, after one of them. Other identities, and so this Locker's other
    /// candidates, are not held off, nor is this identity through another Locker.
    ///
    /// # Cancel safety
    /// As [`LockGuard::release`]; a resignation dropped before the release's answer
    /// records no stand-aside.
    pub async fn resign(self) -> Result<()> {
        let (key, term) = (self.guard.key().to_owned(), self.term());
        let released = self.guard.release().await;
        // Whatever the answer: an error leaves the row to expire, or says that it is
        // gone already; either way this identity should not win it back first.
        let core = &self.locker.core;
        core.stand_asides
            .record(&key, &self.identity, term, &core.retry);
        released
    }
}

/// What [`Election::run_as`] and `Election::spawn_as` (campaign.rs) need of a won
/// lead: a [`Leadership`], or an [`AnyLeadership`](crate::AnyLeadership) over one, so
/// that the work receives the type its caller asked for while the loops stay here.
pub(crate) trait Lead: Send + Sync + Sized {
    /// The lead's term.
    fn lead_term(&self) -> i64;
    /// Completes with the reason when the lead is lost.
    fn on_lost(&self) -> impl Future<Output = LostReason> + Send + '_;
    /// [`Leadership::resign`].
    fn step_down(self) -> impl Future<Output = Result<()>> + Send;
}

impl<DB: Backend> Lead for Leadership<DB> {
    fn lead_term(&self) -> i64 {
        self.term()
    }

    fn on_lost(&self) -> impl Future<Output = LostReason> + Send + '_ {
        self.lost()
    }

    fn step_down(self) -> impl Future<Output = Result<()>> + Send {
        self.resign()
    }
}

impl<DB: Backend> Locker<DB> {
    /// The election `name`: see [`Election`]. Touches no database; the name is checked
    /// by the first call that would (a key without `~`, at most 121 bytes).
    pub fn election(&self, name: &str) -> Election<DB> {
        Election {
            locker: self.clone(),
            name: name.to_owned(),
        }
    }
}

impl<DB: Backend> Election<DB> {
    /// The Locker it campaigns through.
    pub(crate) fn locker(&self) -> &Locker<DB> {
        &self.locker
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The key of the leader's row: `<name>~leader`.
    pub fn key(&self) -> String {
        member_key(&self.name, LEADER)
    }

    /// Waits until this caller leads, with a lease of `lease` renewed by the Locker
    /// (unless it does not renew: [`Locker::auto_renew`]), and returns its leadership.
    /// `identity` (1 to [`MAX_IDENTITY_BYTES`] bytes, no NUL) is what [`leader`](Self::leader)
    /// tells others. Waits without limit; wrap it in `tokio::time::timeout` for one.
    ///
    /// An identity that has just [resigned](Leadership::resign) this election through
    /// this Locker first stands aside, for at most its hold-off: see there.
    ///
    /// Errors: [`Error::InvalidKey`], [`Error::InvalidConfig`] (identity),
    /// [`Error::InvalidDuration`] (nothing is written); [`Error::Database`] ends the
    /// campaign at once ([`run`](Self::run) campaigns again after it).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`Locker::acquire`]: a lead the database granted to a dropped
    /// future is released at once in the background; a stand-aside cut short stays
    /// recorded until its end, for the next campaign.
    pub async fn campaign(&self, identity: &str, lease: Duration) -> Result<Leadership<DB>> {
        validate_name(&self.name, LEADER.len())?;
        validate_identity(identity)?;
        validate_lease(lease)?;
        let campaign = Box::pin(self.lead_as(identity, lease));
        let metrics = &self.locker.core.metrics;
        metrics::acquire(metrics, Kind::Leader, &self.name, MAX_WAIT, campaign).await
    }

    async fn lead_as(&self, identity: &str, lease: Duration) -> Result<Leadership<DB>> {
        let owner = owner_of(identity);
        let key = self.key();
        let core = &self.locker.core;
        // Just resigned: a candidate that was waiting, maybe elsewhere, leads first.
        core.stand_asides
            .wait_out(&core.table, &key, identity)
            .await;
        loop {
            let won = Box::pin(acquire::wait_for(
                core,
                &key,
                MAX_WAIT,
                None,
                async |ticket| {
                    self.locker
                        .attempt(&key, &owner, lease, ticket, &mut None)
                        .await
                },
            ))
            .await;
            match won {
                Ok(lease) => {
                    return Ok(Leadership {
                        guard: self.locker.guard(lease),
                        identity: identity.to_owned(),
                        locker: self.locker.clone(),
                    });
                }
                Err(Error::Timeout { .. }) => continue,
                Err(err) => return Err(err),
            }
        }
    }

    /// Who leads now, or `None` (nobody, or a leader whose lease has run out by the
    /// database clock and whom nobody has replaced yet).
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        validate_name(&self.name, LEADER.len())?;
        let holder = self.locker.holder(&self.key()).await?;
        Ok(holder.filter(|row| !row.expired).map(|row| Leader {
            identity: identity_of(&row.owner).to_owned(),
            term: row.fencing_token,
            since: row.acquired_at,
            expires_at: row.expires_at,
        }))
    }

    /// Follows who leads: a background task, owned by the returned [`LeaderWatch`], reads
    /// [`leader`](Self::leader) every `every` (at least [`MIN_WATCH_INTERVAL`]) and at once
    /// when the leader's row is released through this Locker or, on PostgreSQL, anywhere
    /// (the watch marks the row so that its deletion notifies, as a waiter does). A
    /// takeover after a crash is seen at the next read. Must be called inside a tokio
    /// runtime.
    ///
    /// Errors: [`Error::InvalidKey`], [`Error::InvalidDuration`]. Read errors are not
    /// reported: the watch keeps its last value and reads again after `every`.
    pub fn watch(&self, every: Duration) -> Result<LeaderWatch> {
        validate_name(&self.name, LEADER.len())?;
        validate_range("watch interval", every, MIN_WATCH_INTERVAL, MAX_WAIT)?;
        let (sender, receiver) = watch::channel(None);
        let stop = Arc::new(Notify::new());
        let election = self.clone();
        let stopped = Arc::clone(&stop);
        let task = tokio::spawn(async move { election.follow(every, sender, stopped).await });
        Ok(LeaderWatch {
            receiver,
            stop,
            task: Some(task),
        })
    }

    async fn follow(
        self,
        every: Duration,
        sender: watch::Sender<Option<Leader>>,
        stop: Arc<Notify>,
    ) {
        let core = &self.locker.core;
        let (key, group) = (self.key(), group_key(&self.name));
        // Woken by every release of the group's rows through this Locker, and by the
        // listener's notifications (PostgreSQL).
        let place = core.queues.join_fair(&group);
        loop {
            match self.leader().await {
                Ok(leader) => {
                    sender.send_if_modified(|now| {
                        let changed = *now != leader;
                        *now = leader;
                        changed
                    });
                }
                Err(err) => {
                    tracing::debug!(election = %self.name, error = %err, "could not read the leader")
                }
            }
            if DB::NOTIFIES {
                core.start_listener();
                let _ = core.table.note_waiter(&key).await;
            }
            tokio::select! {
                _ = stop.notified() => break,
                _ = sender.closed() => break,
                _ = place.next_turn() => {}
                _ = sleep(every) => {}
            }
        }
    }

    /// The loop of a singleton worker: campaign as `identity`; while leading, run `lead`
    /// (client-go's `OnStartedLeading`); if the lead is lost first, drop `lead`'s future at
    /// its next await point (`OnStoppedLeading`) and campaign again. Returns what `lead`
    /// returned, after resigning, when `lead` finishes while leading (whether it returned
    /// `Ok` or `Err`): the lead goes to a waiting candidate, and a later `run` or
    /// [`campaign`](Self::campaign) of `identity` through this Locker stands aside first
    /// (see [`Leadership::resign`]). A lost lead is no resignation: `run` campaigns again
    /// at once. `lead` is a
    /// `Clone` async closure called once per term (each term on a fresh clone): so a
    /// capturing closure's future is `Send`, and `run` works inside `tokio::spawn` and
    /// web handlers (an `AsyncFnMut` made it "not general enough" there).
    ///
    /// A database error while campaigning is logged and the campaign starts again after
    /// a pause ([`RetryPolicy`](crate::RetryPolicy)), so an outage does not end the loop;
    /// invalid input ends it at once.
    ///
    /// # Cancel safety
    /// Dropping the future drops `lead` and the leadership, which is released in the
    /// background (see [`LockGuard`]).
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # use std::time::Duration;
    /// # let pool = dblock::sqlx::SqlitePool::connect("sqlite::memory:").await?;
    /// # let locker = dblock::Locker::new(pool);
    /// # locker.migrate().await?;
    /// let election = locker.election("outbox-relay");
    /// let relayed = election
    ///     .run("relay-1", Duration::from_secs(15), async |leading| {
    ///         // The leader's work: runs only while leading, stopped when the lead is lost.
    ///         println!("leading in term {}", leading.term());
    ///         Ok::<_, dblock::Error>(42)
    ///     })
    ///     .await?;
    /// assert_eq!(relayed, 42);
    /// # Ok(()) }
    /// ```
    pub async fn run<T, E>(
        &self,
        identity: &str,
        lease: Duration,
        lead: impl AsyncFnOnce(&Leadership<DB>) -> Result<T, E> + Clone,
    ) -> Result<T, E>
    where
        E: From<Error>,
    {
        self.run_as(identity, lease, std::convert::identity, lead)
            .await
    }

    /// [`run`](Self::run) with each won leadership wrapped by `wrap` before `lead` sees
    /// it (an [`AnyElection`](crate::AnyElection) hands `lead` an
    /// [`AnyLeadership`](crate::AnyLeadership)), so the loop is written once.
    pub(crate) async fn run_as<G: Lead, T, E>(
        &self,
        identity: &str,
        lease: Duration,
        wrap: impl Fn(Leadership<DB>) -> G,
        lead: impl AsyncFnOnce(&G) -> Result<T, E> + Clone,
    ) -> Result<T, E>
    where
        E: From<Error>,
    {
        let policy = self.locker.core.retry;
        let mut backoff = Backoff::new(&policy, Instant::now() + MAX_WAIT);
        loop {
            let leadership = match self.campaign(identity, lease).await {
                Ok(leadership) => leadership,
                // A win answered after its own deadline (`LockLost`) was no win: again.
                Err(err) if err.is_retryable() || matches!(err, Error::LockLost { .. }) => {
                    tracing::warn!(election = %self.name, error = %err, "campaign failed; campaigning again");
                    sleep(backoff.longest()).await;
                    continue;
                }
                Err(err) => return Err(err.into()),
            };
            let leadership = wrap(leadership);
            backoff = Backoff::new(&policy, Instant::now() + MAX_WAIT);
            let outcome = tokio::select! {
                biased;
                reason = leadership.on_lost() => Err(reason),
                done = lead.clone()(&leadership) => Ok(done),
            };
            match outcome {
                Ok(done) => {
                    if let Err(err) = leadership.step_down().await {
                        tracing::debug!(election = %self.name, error = %err, "resigning after the work ended");
                    }
                    return done;
                }
                Err(reason) => {
                    // The lease's own WARN line ("lock lost") already said it: one line
                    // per lost lease.
                    tracing::debug!(election = %self.name, term = leadership.lead_term(), %reason, "leadership lost; campaigning again");
                }
            }
        }
    }
}

/// Follows who leads an [`Election`]: see [`Election::watch`]. Owns the task that reads;
/// [`stop`](Self::stop) ends it and waits for it, a drop ends it without waiting.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # use std::time::Duration;
/// # let pool = dblock::sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// # let locker = dblock::Locker::new(pool);
/// # locker.migrate().await?;
/// let election = locker.election("router");
/// let mut watch = election.watch(Duration::from_millis(100))?;
/// let leading = election.campaign("10.0.0.9:7000", Duration::from_secs(15)).await?;
/// let leader = watch.changed().await.expect("a leader");
/// assert_eq!((leader.identity.as_str(), leader.term), ("10.0.0.9:7000", leading.term()));
/// leading.resign().await?;
/// assert_eq!(watch.changed().await, None); // released here: seen at once
/// watch.stop().await;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct LeaderWatch {
    receiver: watch::Receiver<Option<Leader>>,
    stop: Arc<Notify>,
    task: Option<JoinHandle<()>>,
}

impl LeaderWatch {
    /// The leader as last read (`None`: nobody leads, or nothing was read yet).
    pub fn current(&self) -> Option<Leader> {
        self.receiver.borrow().clone()
    }

    /// Waits until the leader read differs from the last one this watch returned, and
    /// returns it.
    ///
    /// # Cancel safety
    /// Cancel safe: a change seen while it was dropped is returned by the next call.
    pub async fn changed(&mut self) -> Option<Leader> {
        if self.receiver.changed().await.is_err() {
            // The task ended: nothing changes any more.
            std::future::pending::<()>().await;
        }
        self.receiver.borrow_and_update().clone()
    }

    /// Stops the watch's task and waits until it has ended.
    ///
    /// # Cancel safety
    /// Cancel safe: the task is told to stop at once; dropping the future skips the wait.
    pub async fn stop(mut self) {
        self.stop.notify_one();
        if let Some(task) = self.task.take() {
            task.await.ok();
        }
    }
}

impl Drop for LeaderWatch {
    fn drop(&mut self) {
        self.stop.notify_one();
    }
}

/// Rejects an identity that is empty, over [`MAX_IDENTITY_BYTES`] or has a NUL byte.
pub(crate) fn validate_identity(identity: &str) -> Result<()> {
    if identity.is_empty() || identity.len() > MAX_IDENTITY_BYTES || identity.contains('\0') {
        return Err(Error::InvalidConfig(format!(
            "candidate identity {:?} ({} bytes) must be 1 to {MAX_IDENTITY_BYTES} bytes without NUL",
            shown_key(identity),
            identity.len()
        )));
    }
    Ok(())
}

/// A candidate's owner value: its identity, `~` and 32 random hex digits.
fn owner_of(identity: &str) -> String {
    let mut digits = uuid::Uuid::encode_buffer();
    let digits = uuid::Uuid::new_v4().simple().encode_lower(&mut digits);
    format!("{identity}{GROUP_MARK}{digits}")
}

/// The identity in a leader's owner value (the whole value if it has no `~`: a row
/// written by something else than a campaign).
fn identity_of(owner: &str) -> &str {
    owner
        .rsplit_once(GROUP_MARK)
        .map_or(owner, |(identity, _)| identity)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_survive_the_owner_value() {
        let owner = owner_of("10.0.0.7:8080");
        assert_eq!(identity_of(&owner), "10.0.0.7:8080");
        assert_eq!(owner.len(), "10.0.0.7:8080".len() + 33);
        assert!(owner_of(&"x".repeat(MAX_IDENTITY_BYTES)).len() <= 64);
        assert_eq!(identity_of("a~b~c"), "a~b");
        assert_eq!(identity_of("plain"), "plain");
        assert!(validate_identity("").is_err());
        assert!(validate_identity(&"x".repeat(32)).is_err());
        assert!(validate_identity("ok").is_ok());
    }
}
