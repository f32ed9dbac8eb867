//! [`AnyElection`] and its [`AnyLeadership`]: the backend's [`Election`] and
//! [`Leadership`] through an [`AnyLocker`]. The campaign loops (`run`, `spawn`) are the
//! `Election`'s own, handing the work an `AnyLeadership`.

use std::sync::Arc;
use std::time::Duration;

use super::held::{any_from, lease_methods, row_methods};
use super::{AnyLocker, dispatch};
use crate::campaign::{CampaignHandle, WorkError};
use crate::election::{Election, Lead, Leader, LeaderWatch, Leadership};
use crate::error::{Error, LostReason, Result};

/// Leader election among candidates of any process: the backend's [`Election`], made by
/// [`AnyLocker::election`], with the same terms, hand-over, stand-aside, errors and
/// cancel safety (each method's documentation is the `Election` method's it names). A
/// won lead is an [`AnyLeadership`].
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
///
/// let locker = dblock::AnyLocker::connect("sqlite::memory:").await?;
/// locker.migrate().await?;
/// let election = locker.election("billing-scheduler");
/// let leading = election.campaign("10.0.0.7:8080", Duration::from_secs(15)).await?;
/// let leader = election.leader().await?.expect("somebody leads");
/// assert_eq!((leader.identity.as_str(), leader.term), ("10.0.0.7:8080", leading.term()));
/// leading.resign().await?; // a waiting candidate, of any process, leads next
/// assert_eq!(election.leader().await?, None);
///
/// // The singleton worker's loop: campaign, work while leading, resign when done.
/// let done = election
///     .run("10.0.0.8:8080", Duration::from_secs(15), async |leading| {
///         Ok::<_, dblock::Error>(leading.term())
///     })
///     .await?;
/// assert!(done > leader.term);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct AnyElection(ElectionOf);

#[derive(Debug, Clone)]
enum ElectionOf {
    #[cfg(feature = "postgres")]
    Postgres(Election<sqlx::Postgres>),
    #[cfg(feature = "mysql")]
    MySql(Election<sqlx::MySql>),
    #[cfg(feature = "sqlite")]
    Sqlite(Election<sqlx::Sqlite>),
}

/// This caller leads an [`AnyElection`]: the backend's [`Leadership`], a lease on the
/// election's leader row renewed by the Locker, whose [`term`](Self::term) is its
/// fencing token. [`resign`](Self::resign) hands the lead over; dropped, it is released
/// in the background as a guard is.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
///
/// let locker = dblock::AnyLocker::connect("sqlite::memory:").await?;
/// locker.migrate().await?;
/// let leading = locker.election("compactor").campaign("node-a", Duration::from_secs(15)).await?;
/// assert_eq!((leading.identity(), leading.key()), ("node-a", "compactor~leader"));
/// assert_eq!(leading.term(), leading.fencing_token());
/// let mut tx = locker.begin().await?;
/// leading.assert_held(&mut tx).await?; // a leader's write, fenced by its term
/// leading.commit(tx).await?;
/// leading.resign().await?;
/// # Ok(()) }
/// ```
#[must_use = "the leadership ends as soon as it is dropped; keep it and call resign().await"]
#[derive(Debug)]
pub struct AnyLeadership(LeadershipOf);

#[derive(Debug)]
enum LeadershipOf {
    #[cfg(feature = "postgres")]
    Postgres(Leadership<sqlx::Postgres>),
    #[cfg(feature = "mysql")]
    MySql(Leadership<sqlx::MySql>),
    #[cfg(feature = "sqlite")]
    Sqlite(Leadership<sqlx::Sqlite>),
}

any_from!(AnyLeadership, LeadershipOf, Leadership);

impl AnyLocker {
    /// [`Locker::election`](crate::Locker::election): the election `name`. Touches no
    /// database.
    pub fn election(&self, name: &str) -> AnyElection {
        AnyElection(dispatch!(into self, AnyLocker => ElectionOf, locker => locker.election(name)))
    }
}

impl AnyElection {
    /// [`Election::name`].
    pub fn name(&self) -> &str {
        dispatch!(&self.0, ElectionOf, election => election.name())
    }

    /// [`Election::key`]: the leader row's key, `<name>~leader`.
    pub fn key(&self) -> String {
        dispatch!(&self.0, ElectionOf, election => election.key())
    }

    /// [`Election::campaign`]: waits until this caller leads as `identity`.
    ///
    /// # Cancel safety
    /// As [`Election::campaign`]: cancel safe.
    pub async fn campaign(&self, identity: &str, lease: Duration) -> Result<AnyLeadership> {
        dispatch!(&self.0, ElectionOf, election => {
            election.campaign(identity, lease).await.map(AnyLeadership::from)
        })
    }

    /// [`Election::leader`]: who leads now, or `None`.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        dispatch!(&self.0, ElectionOf, election => election.leader().await)
    }

    /// [`Election::watch`]: follows who leads, in a background task.
    pub fn watch(&self, every: Duration) -> Result<LeaderWatch> {
        dispatch!(&self.0, ElectionOf, election => election.watch(every))
    }

    /// [`Election::run`], `lead` receiving the [`AnyLeadership`]: campaign, run `lead`
    /// while leading (dropped if the lead is lost first, then campaign again), resign
    /// when it returns, and return what it returned.
    ///
    /// # Cancel safety
    /// As [`Election::run`]: dropping the future drops `lead` and the leadership, which
    /// is released in the background.
    pub async fn run<T, E>(
        &self,
        identity: &str,
        lease: Duration,
        lead: impl AsyncFnOnce(&AnyLeadership) -> Result<T, E> + Clone,
    ) -> Result<T, E>
    where
        E: From<Error>,
    {
        dispatch!(&self.0, ElectionOf, election => {
            election.run_as(identity, lease, AnyLeadership::from, lead).await
        })
    }

    /// [`Election::spawn`], `work` receiving the [`AnyLeadership`]: a candidate that
    /// keeps campaigning in the background, owned by the returned [`CampaignHandle`].
    pub fn spawn<F, Fut>(&self, identity: &str, lease: Duration, work: F) -> Result<CampaignHandle>
    where
        F: Fn(Arc<AnyLeadership>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<(), WorkError>> + Send,
    {
        dispatch!(&self.0, ElectionOf, election => {
            election.spawn_as(identity, lease, AnyLeadership::from, work)
        })
    }
}

impl AnyLeadership {
    /// [`Leadership::term`]: this lead's fencing token, above every earlier leader's.
    pub fn term(&self) -> i64 {
        dispatch!(&self.0, LeadershipOf, leadership => leadership.term())
    }

    /// [`Leadership::identity`]: the identity this caller campaigned with.
    pub fn identity(&self) -> &str {
        dispatch!(&self.0, LeadershipOf, leadership => leadership.identity())
    }

    lease_methods!(LeadershipOf, "LockGuard");
    row_methods!(LeadershipOf);

    /// [`Leadership::resign`]: steps down, so that a waiting candidate leads next.
    ///
    /// # Cancel safety
    /// As [`Leadership::resign`].
    pub async fn resign(self) -> Result<()> {
        dispatch!(self.0, LeadershipOf, leadership => leadership.resign().await)
    }
}

impl Lead for AnyLeadership {
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
