//! How the waiters of one Locker line up for a key: the part of waiting that differs
//! between modes. The waiting loop itself is written once (`acquire.rs`); a mode is a
//! [`Line`] to join, whose [`Place`] says when its waiter may attempt, what an attempt
//! carries, and what to do after a loss and on a win. Two lines today:
//! - the local FIFO queue (`queue.rs`): only the head attempts, and a release through
//!   this Locker hands it the turn;
//! - fair mode's tickets (`fair.rs`): after a lost attempt a waiter takes a ticket, and an
//!   attempt is made only when no earlier live ticket exists, across processes.
//!
//! A semaphore, a read-write lock or a leader campaign waits the same way, with a line
//! of its own.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use tokio::sync::oneshot;

use crate::error::Result;
use crate::lease::Lease;

/// A step of a waiter that may talk to the database: boxed, so that its `Send` is part of
/// its type (a future returned by a trait method otherwise hides it from the waiting
/// loop's callers, which then cannot be spawned).
pub(crate) type Step<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a waiter at the head of its Locker's queue asks a release of its key through that
/// Locker to do: give the row to this owner value for this lease in the release's own
/// statement, and send the won lease (see `Engine::release`).
///
/// Its owner value is its own, not the one the waiter's attempts use: a handoff whose
/// statement failed may have committed, and its row is then removed in the background by
/// this owner value, which is never offered again.
pub(crate) struct Offer {
    pub(crate) owner: String,
    pub(crate) terms: Terms,
    /// Set by a release that took the offer but deleted the row for a waiter of another
    /// process (it had marked the row): this waiter then waits for the release's
    /// notification, as that process's waiter does, instead of attempting at once, so
    /// that the two processes' waiters start even (benches/compare cell 3.2).
    pub(crate) yielded: AtomicBool,
}

/// The lease a plain mutex waiter asks for: what a release that hands it the row writes.
#[derive(Clone, Copy)]
pub(crate) struct Terms {
    pub(crate) lease: Duration,
    /// Renew every this often; `None`: no renewal.
    pub(crate) renew: Option<Duration>,
}

/// Where a release that took an [`Offer`] sends the lease it won for the waiter. Dropped
/// without a send, it tells the waiter that the row was not handed over: it attempts on
/// its own (the release woke it as any release does).
pub(crate) type Handed = oneshot::Sender<Arc<Lease>>;

/// A way for waiters to line up for a key.
pub(crate) trait Line: Sync {
    /// Joins the line for `key`, at the back. Dropping the place leaves the line, however
    /// the wait ended (won, timed out, failed, cancelled).
    fn join<'a>(&'a self, key: &str) -> Box<dyn Place<'a> + 'a>;
}

/// One waiter's place in a [`Line`].
pub(crate) trait Place<'a>: Send {
    /// Whether this waiter's turn has come: it may send an attempt (only the head of the
    /// local queue; every fair waiter, whose attempt its ticket orders).
    fn may_attempt(&self) -> bool;

    /// Before an attempt: what it carries (fair mode: the waiter's ticket, taken again at
    /// the back if it lapsed; `None` when it has none).
    fn ticket(&mut self) -> Step<'_, Result<Option<i64>>>;

    /// After a lost attempt, before the waiter sleeps (fair mode takes a ticket).
    fn lost(&mut self) -> Step<'_, Result<()>>;

    /// The attempt won `lease`: leaves the line as the winner (the one behind is told
    /// the key is held; fair mode deletes the ticket) and hands the lease back.
    fn won(self: Box<Self>, lease: Arc<Lease>) -> Step<'a, Arc<Lease>>;

    /// Completes when this waiter is told to look again: its turn came, or the key was
    /// released. `true` when its turn came because the one ahead won (the key is held:
    /// wait for its release rather than attempt). A signal sent while nobody was
    /// listening is kept for the next call.
    fn signalled(&self) -> Step<'_, bool>;

    /// Stands this waiter's offer (the head of the local queue only; other lines have no
    /// handoffs): until it is withdrawn, a release of the key through this Locker may
    /// take it and send the won lease to the receiver. `None` when not offered.
    fn offer(&self, _offer: &Arc<Offer>) -> Option<oneshot::Receiver<Arc<Lease>>> {
        None
    }

    /// Withdraws the offer stood by [`offer`](Self::offer): `false` when a release took it
    /// already, whose answer the receiver gives (the lease, or a closed channel).
    fn withdraw(&self) -> bool {
        true
    }
}
