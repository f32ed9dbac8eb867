//! A candidate that keeps campaigning, in the background: [`Election::spawn`] and the
//! [`CampaignHandle`] that owns its task (Curator's `LeaderSelector` with `autoRequeue`,
//! client-go's `leaderelection` run loop).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::validate_lease;
use crate::dialect::Backend;
use crate::election::{Election, Lead, Leadership, validate_identity};
use crate::error::Result;
use crate::primitive::validate_name;

/// A campaign running in the background, returned by [`Election::spawn`]. It owns the
/// task: [`stop`](Self::stop) ends it and waits for it (resigning a lead it holds);
/// dropping the handle ends it too, without waiting.
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
/// let (led, mut terms) = tokio::sync::mpsc::unbounded_channel();
/// let relay = locker
///     .election("outbox-relay")
///     .spawn("relay-1", Duration::from_secs(15), move |leading| {
///         let led = led.clone();
///         async move {
///             led.send(leading.term()).ok();
///             loop {
///                 // ... relay the outbox while leading; `?` ends this term with an
///                 // error (logged), and the candidate campaigns again ...
///                 tokio::time::sleep(Duration::from_millis(10)).await;
///                 leading.ensure_held()?;
///             }
///         }
///     })?;
/// let term = terms.recv().await.expect("it leads");
/// let stats = relay.stop().await; // resigns the lead and waits
/// assert_eq!((stats.terms, term > 0), (1, true));
/// # Ok(()) }
/// ```
#[must_use = "dropping the handle stops the campaign"]
pub struct CampaignHandle {
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
    state: Arc<CampaignState>,
}

/// What a [`CampaignHandle`]'s candidate did so far.
///
/// # Examples
/// ```
/// let stats = dblock::CampaignStats::default();
/// assert_eq!((stats.terms, stats.work_errors, stats.leading), (0, 0, false));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CampaignStats {
    /// Terms this candidate led.
    pub terms: u64,
    /// Terms whose work returned an error.
    pub work_errors: u64,
    /// Terms that ended because the lead was lost (expired, taken over, deleted,
    /// unreachable) while the work ran.
    pub lost: u64,
    /// Whether it leads right now.
    pub leading: bool,
}

#[derive(Default)]
struct CampaignState {
    terms: AtomicU64,
    work_errors: AtomicU64,
    lost: AtomicU64,
    leading: AtomicBool,
}

impl CampaignState {
    fn stats(&self) -> CampaignStats {
        CampaignStats {
            terms: self.terms.load(Relaxed),
            work_errors: self.work_errors.load(Relaxed),
            lost: self.lost.load(Relaxed),
            leading: self.leading.load(Relaxed),
        }
    }
}

impl std::fmt::Debug for CampaignHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CampaignHandle")
            .field("stats", &self.stats())
            .finish()
    }
}

impl CampaignHandle {
    /// What the candidate did so far.
    pub fn stats(&self) -> CampaignStats {
        self.state.stats()
    }

    /// Stops the campaign and waits until its task has ended: a term's work is dropped
    /// at its next await point and the lead resigned. Returns the counters.
    ///
    /// # Cancel safety
    /// Cancel safe: the campaign is told to stop at once; dropping this future only skips
    /// the wait.
    pub async fn stop(mut self) -> CampaignStats {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            task.await.ok();
        }
        self.stats()
    }
}

impl Drop for CampaignHandle {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// What a term's work may fail with: any error, boxed.
pub type WorkError = Box<dyn std::error::Error + Send + Sync>;

/// How a term ended.
enum TermEnd {
    Stopped,
    Lost,
    Done(std::result::Result<(), WorkError>),
}

impl<DB: Backend> Election<DB> {
    /// Campaigns as `identity` in the background until the returned handle is stopped or
    /// dropped, and keeps campaigning: while leading, `work` runs with the
    /// [`Leadership`] (shared, for [`assert_held`](crate::LockGuard::assert_held),
    /// [`ensure_held`](crate::LockGuard::ensure_held) and the rest); when the lead is
    /// lost, `work` is dropped at its next await point and the candidate campaigns again
    /// at once; when `work` returns, the lead is resigned (a waiting candidate of any
    /// process leads next, see [`Leadership::resign`]) and the candidate campaigns again,
    /// after an error (logged at `WARN`) first pausing the Locker's longest retry pause
    /// ([`RetryPolicy`](crate::RetryPolicy)). A database error while campaigning is
    /// logged and retried the same way. `work` is called once per term, in the style of
    /// [`Schedule::run`](crate::Schedule::run) (a `Fn` returning a `Send` future); its
    /// error is any error, boxed, so that `?` works on every error type and a leader that
    /// never returns is a plain `loop` with `?` in it, with no type to spell and no
    /// `Ok(())` after it.
    ///
    /// [`run`](Self::run) is the one-shot form, on the caller's task: it returns when the
    /// work does.
    ///
    /// Errors: [`Error::InvalidKey`](crate::Error::InvalidKey), [`Error::InvalidConfig`](crate::Error::InvalidConfig) (identity),
    /// [`Error::InvalidDuration`](crate::Error::InvalidDuration): nothing is started or written. Needs a tokio runtime.
    pub fn spawn<F, Fut>(&self, identity: &str, lease: Duration, work: F) -> Result<CampaignHandle>
    where
        F: Fn(Arc<Leadership<DB>>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<(), WorkError>> + Send,
    {
        self.spawn_as(identity, lease, std::convert::identity, work)
    }

    /// [`spawn`](Self::spawn) with each won leadership wrapped by `wrap` before `work`
    /// sees it (an [`AnyElection`](crate::AnyElection)'s candidates get an
    /// [`AnyLeadership`](crate::AnyLeadership)).
    pub(crate) fn spawn_as<G, F, Fut>(
        &self,
        identity: &str,
        lease: Duration,
        wrap: fn(Leadership<DB>) -> G,
        work: F,
    ) -> Result<CampaignHandle>
    where
        G: Lead + 'static,
        F: Fn(Arc<G>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<(), WorkError>> + Send,
    {
        validate_name(self.name(), "leader".len())?;
        validate_identity(identity)?;
        validate_lease(lease)?;
        let locker = self.locker();
        locker.core.margin.check(lease, locker.renew_every(lease))?;
        let stop = CancellationToken::new();
        let state = Arc::new(CampaignState::default());
        let (election, identity) = (self.clone(), identity.to_owned());
        let (stopping, shared) = (stop.clone(), Arc::clone(&state));
        let task = tokio::spawn(async move {
            election
                .keep_campaigning(&identity, lease, wrap, &work, &stopping, &shared)
                .await;
        });
        Ok(CampaignHandle {
            stop,
            task: Some(task),
            state,
        })
    }

    async fn keep_campaigning<G, F, Fut>(
        &self,
        identity: &str,
        lease: Duration,
        wrap: fn(Leadership<DB>) -> G,
        work: &F,
        stopping: &CancellationToken,
        state: &CampaignState,
    ) where
        G: Lead,
        F: Fn(Arc<G>) -> Fut,
        Fut: Future<Output = std::result::Result<(), WorkError>>,
    {
        let pause = self.locker().core.retry.max;
        while !stopping.is_cancelled() {
            let campaign = tokio::select! {
                _ = stopping.cancelled() => return,
                campaign = self.campaign(identity, lease) => campaign,
            };
            let leadership = match campaign {
                Ok(leadership) => Arc::new(wrap(leadership)),
                Err(err) => {
                    tracing::warn!(election = %self.name(), error = %err, "campaign failed; campaigning again");
                    pause_unless_stopped(pause, stopping).await;
                    continue;
                }
            };
            state.terms.fetch_add(1, Relaxed);
            state.leading.store(true, Relaxed);
            let end = tokio::select! {
                biased;
                _ = stopping.cancelled() => TermEnd::Stopped,
                _ = leadership.on_lost() => TermEnd::Lost,
                done = work(Arc::clone(&leadership)) => TermEnd::Done(done),
            };
            state.leading.store(false, Relaxed);
            let term = leadership.lead_term();
            let failed = matches!(end, TermEnd::Done(Err(_)));
            match end {
                TermEnd::Lost => {
                    // The lease's own WARN line ("lock lost") said it.
                    state.lost.fetch_add(1, Relaxed);
                    continue;
                }
                TermEnd::Stopped | TermEnd::Done(Ok(())) => {}
                TermEnd::Done(Err(err)) => {
                    state.work_errors.fetch_add(1, Relaxed);
                    tracing::warn!(election = %self.name(), term, error = %err, "the leader's work failed; resigning and campaigning again");
                }
            }
            resign(leadership, self.name()).await;
            if failed {
                pause_unless_stopped(pause, stopping).await;
            }
        }
    }
}

/// Resigns `leadership` if the work kept no clone of it; otherwise it is released when
/// the last clone goes (in the background, as a dropped guard is).
async fn resign<G: Lead>(leadership: Arc<G>, election: &str) {
    match Arc::try_unwrap(leadership) {
        Ok(leadership) => {
            if let Err(err) = leadership.step_down().await {
                tracing::debug!(election, error = %err, "resigning after the term ended");
            }
        }
        Err(_) => tracing::debug!(
            election,
            "the leader's work kept its leadership; released when dropped"
        ),
    }
}

async fn pause_unless_stopped(pause: Duration, stopping: &CancellationToken) {
    let until = Instant::now() + pause;
    tokio::select! {
        _ = stopping.cancelled() => {}
        _ = tokio::time::sleep_until(until) => {}
    }
}
