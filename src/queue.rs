//! Local waiting queues: the waiters of one Locker for one key, in arrival order. Only
//! the head of a queue sends acquisition attempts; a release of that key through the
//! same Locker hands the head its turn at once, and a waiter that leaves (timed out,
//! cancelled) hands the turn to the one behind it. A waiter that leaves because it won
//! hands the turn on too, but says the key is held: the one behind waits for the release
//! instead of sending an attempt that must fail.
//!
//! On PostgreSQL a sleeping mutex head also stands an offer (`take_offer`): a release
//! through the same Locker gives it the row in the release's own statement, unless a
//! waiter of another process marked the row, whose release then deletes it and wakes
//! that process (so local waiters never pass another process that waits). The local head
//! then waits for that release's notification too, through this Locker's listener, so
//! that it does not start ahead of the other process's waiter.
//!
//! On SQLite a release through this Locker that finds the key marked by a waiter of
//! another Locker holds this Locker's waiters of it back (`hold_back`): they attempt only
//! once this Locker's listener has looked at the table after the release (it looks every
//! few milliseconds, at random moments, as the other Locker's does), or after a moment
//! at the latest, so that neither the next local waiter nor a caller who just arrived
//! takes the key before the other process's waiter could even see it free.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

use crate::dialect::Waiting;
use crate::error::Result;
use crate::lease::Lease;
use crate::line::{self, Handed, Line, Offer, Step};
use crate::metrics::{self, TableMetrics};

// Where the group mark is defined: a leaf, so that the dialects can name groups too.
pub(crate) use crate::config::{GROUP_MARK, group_of};

/// A hold-back of the waiters of a key (see [`LocalQueues::hold_back`]).
struct Held {
    key: String,
    /// When the release that caused it had committed.
    since: Instant,
    /// When it ends at the latest.
    until: Instant,
}

/// Whether a hold-back of the key `held` keeps the waiters of the queue `queue` back: the
/// key's own queue, and its group's.
fn holds(queue: &str, held: &str) -> bool {
    held == queue || group_of(held) == Some(queue)
}

/// The queues of one Locker, by key.
pub(crate) struct LocalQueues {
    keys: Mutex<HashMap<String, VecDeque<Waiter>>>,
    /// How many waiters `keys` holds, changed under its lock: a release with nobody
    /// waiting (the usual case) reads this instead of taking the lock.
    waiters: AtomicUsize,
    next_id: AtomicU64,
    /// Told when a queue is opened (its first waiter joined) or closed (its last left):
    /// a listener that asks about keys (`Waiting`) looks at them again.
    opened: Notify,
    /// The listener's registration (MySQL/MariaDB: its session's id; 0: none), which this
    /// Locker's acquisitions tell from other processes' (see `Waiting::registered_as`).
    registration: AtomicU64,
    /// The queues whose rows' releases the listener hears, with those rows (bells: see
    /// `Waiting::hearing`). Taken after `keys` where both are.
    hearing: Mutex<HashMap<String, Vec<String>>>,
    /// Keys whose waiters hold back ([`hold_back`](Self::hold_back)), each with when the
    /// hold began and when it ends at the latest.
    held: Mutex<Vec<Held>>,
    /// How many entries `held` has: attempts read this instead of taking its lock while
    /// nothing is held back (always, but on SQLite with waiters in several processes).
    holding: AtomicUsize,
    /// The lock table's metrics (the waiters gauge).
    metrics: TableMetrics,
}

struct Waiter {
    id: u64,
    turn: Turn,
    /// Fair mode: every waiter tries on a release (tickets order them), not only the head.
    fair: bool,
    /// The head's standing offer to be handed the row by the next release (see
    /// [`LocalQueues::take_offer`]).
    offer: Option<(Arc<Offer>, Handed)>,
}

/// How a waiter is told to look again.
#[derive(Clone, Default)]
struct Turn {
    wake: Arc<Notify>,
    /// Set with the wake-up when the waiter ahead left because it won: the key is held.
    held: Arc<AtomicBool>,
}

impl Turn {
    fn give(&self, held: bool) {
        self.held.store(held, Ordering::Release);
        self.wake.notify_one();
    }
}

/// One waiter's place in its key's queue; dropping it leaves the queue.
pub(crate) struct QueuePlace<'q> {
    queues: &'q LocalQueues,
    key: String,
    id: u64,
    turn: Turn,
    /// Whether this waiter is leaving because it won.
    won: bool,
}

impl LocalQueues {
    /// No waiters yet; the waiters gauge is recorded in `metrics`.
    pub(crate) fn new(metrics: TableMetrics) -> Self {
        LocalQueues {
            keys: Mutex::default(),
            waiters: AtomicUsize::new(0),
            next_id: AtomicU64::new(0),
            opened: Notify::new(),
            registration: AtomicU64::new(0),
            hearing: Mutex::default(),
            held: Mutex::default(),
            holding: AtomicUsize::new(0),
            metrics,
        }
    }

    fn keys(&self) -> MutexGuard<'_, HashMap<String, VecDeque<Waiter>>> {
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Joins the back of `key`'s queue.
    pub(crate) fn join(&self, key: &str) -> QueuePlace<'_> {
        self.join_as(key, false)
    }

    /// Joins `key`'s waiters in fair mode: woken by every release of the key, whatever
    /// its place (the database's tickets decide who goes first).
    pub(crate) fn join_fair(&self, key: &str) -> QueuePlace<'_> {
        self.join_as(key, true)
    }

    /// Every waiter, plain or fair, joins here and leaves in [`QueuePlace`]'s drop, exactly
    /// once however its wait ends (won, timed out, failed, cancelled): the waiters gauge
    /// moves at those two places only.
    fn join_as(&self, key: &str, fair: bool) -> QueuePlace<'_> {
        metrics::waiters(&self.metrics, 1);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let turn = Turn::default();
        let mut keys = self.keys();
        let queue = keys.entry(key.to_owned()).or_default();
        queue.push_back(Waiter {
            id,
            turn: turn.clone(),
            fair,
            offer: None,
        });
        if queue.len() == 1 {
            // One stored permit is enough: the listener reads every key when it wakes.
            self.opened.notify_one();
        }
        // Counted before the waiter's first attempt, which reads the row: a release that
        // deleted the row after that read counts it (SeqCst) and wakes it.
        self.waiters.fetch_add(1, Ordering::SeqCst);
        drop(keys);
        QueuePlace {
            queues: self,
            key: key.to_owned(),
            id,
            turn,
            won: false,
        }
    }

    /// `key` was released (through this Locker, or elsewhere as a listener heard): the
    /// head of its queue tries now, and the head of its group's (see [`group_of`]).
    /// Whether anyone was waiting. Ends a hold-back of the key (see
    /// [`hold_back`](Self::hold_back)): its waiters go now.
    pub(crate) fn released(&self, key: &str) -> bool {
        self.end_holds(|hold| !holds(key, &hold.key));
        if self.waiters.load(Ordering::SeqCst) == 0 {
            return false;
        }
        let keys = self.keys();
        // The waiters of the group the key belongs to (a semaphore's permits, a
        // read-write lock's rows) look again too: a member's release may let them in.
        let mut woke = false;
        let group = group_of(key).and_then(|group| keys.get(group));
        for queue in [group, keys.get(key)].into_iter().flatten() {
            for (place, waiter) in queue.iter().enumerate() {
                if place == 0 || waiter.fair {
                    waiter.turn.give(false);
                }
            }
            woke |= !queue.is_empty();
        }
        woke
    }

    /// Takes the offer of `key`'s head waiter, for a release of `key` through this Locker
    /// to hand it the row. None while the head stands none (it is attempting, or has
    /// not asked yet), and none while waiters of the key's group wait too (a semaphore's
    /// or a read-write lock's: a release of a member wakes them, which a handoff would
    /// not).
    pub(crate) fn take_offer(&self, key: &str) -> Option<(Arc<Offer>, Handed)> {
        if self.waiters.load(Ordering::SeqCst) == 0 {
            return None;
        }
        let mut keys = self.keys();
        if group_of(key).is_some_and(|group| keys.contains_key(group)) {
            return None;
        }
        keys.get_mut(key)?.front_mut()?.offer.take()
    }

    /// The head of `group`'s queue looks again: a member of the group was won by the
    /// waiter ahead (a permit), and another one may still be free.
    pub(crate) fn next_in_group(&self, group: &str) {
        if let Some(head) = self.keys().get(group).and_then(VecDeque::front) {
            head.turn.give(false);
        }
    }

    /// A release of `key` through this Locker, committed by now, found it marked by a
    /// waiter of another Locker, which learns of releases only through its own listener,
    /// a moment later. Until this Locker's listener has looked at the table since
    /// ([`Waiting::looked`]: it looks as often as the other's, so both start even), or
    /// until `until` at the latest, this Locker's waiters of the key, and of its group,
    /// do not attempt it, nor does a caller that arrives meanwhile
    /// ([`held_back`](Self::held_back)): so the key goes to neither the next local waiter
    /// nor a newcomer before the waiter elsewhere could see it free.
    pub(crate) fn hold_back(&self, key: &str, until: Instant) {
        let mut held = self.held();
        let now = Instant::now();
        held.retain(|hold| hold.until > now && hold.key != key);
        held.push(Held {
            key: key.to_owned(),
            since: now,
            until,
        });
        self.holding.store(held.len(), Ordering::SeqCst);
    }

    /// Until when the waiters of the queue `queue` (a key, or a group) hold back; `None`
    /// when they need not (see [`hold_back`](Self::hold_back)).
    pub(crate) fn held_back(&self, queue: &str) -> Option<Instant> {
        if self.holding.load(Ordering::SeqCst) == 0 {
            return None;
        }
        let mut held = self.held();
        let now = Instant::now();
        held.retain(|hold| hold.until > now);
        self.holding.store(held.len(), Ordering::SeqCst);
        let holds = held.iter().filter(|hold| holds(queue, &hold.key));
        holds.map(|hold| hold.until).max()
    }

    /// Ends the hold-backs that `keep` refuses; the keys they held.
    fn end_holds(&self, keep: impl Fn(&Held) -> bool) -> Vec<String> {
        if self.holding.load(Ordering::SeqCst) == 0 {
            return Vec::new();
        }
        let mut held = self.held();
        let (kept, ended): (Vec<Held>, Vec<Held>) = held.drain(..).partition(keep);
        *held = kept;
        self.holding.store(held.len(), Ordering::SeqCst);
        ended.into_iter().map(|hold| hold.key).collect()
    }

    fn held(&self) -> MutexGuard<'_, Vec<Held>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every head tries now: releases may have gone unheard (a listener reconnected).
    pub(crate) fn wake_all(&self) {
        for queue in self.keys().values() {
            if let Some(head) = queue.front() {
                head.turn.give(false);
            }
        }
    }

    /// How many waiters are queued for `key`.
    pub(crate) fn waiting(&self, key: &str) -> usize {
        self.keys().get(key).map_or(0, VecDeque::len)
    }

    fn hearing_now(&self) -> MutexGuard<'_, HashMap<String, Vec<String>>> {
        self.hearing.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The listener's registration, if it has one (see [`Waiting::registered_as`]).
    pub(crate) fn own_registration(&self) -> Option<u64> {
        Some(self.registration.load(Ordering::Acquire)).filter(|&session| session != 0)
    }

    /// Whether the listener hears every release of a row `queue`'s waiters wait for
    /// (bells: see [`Waiting::hearing`]).
    pub(crate) fn heard(&self, queue: &str) -> bool {
        self.hearing_now().contains_key(queue)
    }

    /// Whether every queue with waiters is [`heard`](Self::heard).
    pub(crate) fn all_heard(&self) -> bool {
        let keys = self.keys();
        let hearing = self.hearing_now();
        keys.keys().all(|queue| hearing.contains_key(queue))
    }

    /// Whether the listener hears the release of the row `key` for every queue of this
    /// Locker that the release wakes ([`released`](Self::released): the key's and its
    /// group's), so that the release's bell wakes them; `false` when none waits.
    pub(crate) fn hears(&self, key: &str) -> bool {
        if self.waiters.load(Ordering::SeqCst) == 0 {
            return false;
        }
        let keys = self.keys();
        let hearing = self.hearing_now();
        let mut waited = [Some(key), group_of(key)]
            .into_iter()
            .flatten()
            .filter(|queue| keys.contains_key(*queue))
            .peekable();
        waited.peek().is_some()
            && waited.all(|queue| {
                hearing
                    .get(queue)
                    .is_some_and(|rows| rows.iter().any(|r| r == key))
            })
    }
}

impl Waiting for LocalQueues {
    fn keys(&self) -> Vec<String> {
        let keys = self.keys();
        let open = keys.iter().filter(|(_, queue)| !queue.is_empty());
        open.map(|(key, _)| key.clone()).collect()
    }

    fn joined(&self) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(self.opened.notified())
    }

    fn registered_as(&self, session: Option<u64>) {
        self.registration
            .store(session.unwrap_or(0), Ordering::Release);
    }

    fn hearing(&self, queue: &str, rows: &[String]) {
        // Only a queue that has waiters: one closed meanwhile stays unheard.
        let keys = self.keys();
        let mut hearing = self.hearing_now();
        if rows.is_empty() || !keys.contains_key(queue) {
            hearing.remove(queue);
        } else {
            hearing.insert(queue.to_owned(), rows.to_vec());
        }
    }

    fn looked(&self, at: Instant) {
        for key in self.end_holds(|hold| hold.since >= at) {
            self.released(&key);
        }
    }
}

impl QueuePlace<'_> {
    /// Whether this waiter is at the head of its queue (its turn to try).
    pub(crate) fn is_head(&self) -> bool {
        self.queues
            .keys()
            .get(&self.key)
            .and_then(VecDeque::front)
            .is_some_and(|head| head.id == self.id)
    }

    /// Completes when this waiter is told to look again: it became the head, or, as the
    /// head, the key was released. `true` when it became the head because the waiter
    /// ahead won (the key is held: wait for its release). A signal sent while nobody was
    /// listening is kept for the next call.
    pub(crate) async fn next_turn(&self) -> bool {
        self.turn.wake.notified().await;
        self.turn.held.swap(false, Ordering::AcqRel)
    }

    /// Stands `offer` for this waiter if it is the head (replacing one it stood before).
    pub(crate) fn stand_offer(&self, offer: &Arc<Offer>) -> Option<oneshot::Receiver<Arc<Lease>>> {
        let mut keys = self.queues.keys();
        let head = keys.get_mut(&self.key)?.front_mut()?;
        if head.id != self.id || head.fair {
            return None;
        }
        let (handed, receiver) = oneshot::channel();
        head.offer = Some((Arc::clone(offer), handed));
        Some(receiver)
    }

    /// Takes this waiter's offer back: `false` when a release took it first.
    pub(crate) fn withdraw_offer(&self) -> bool {
        let mut keys = self.queues.keys();
        let mine = keys
            .get_mut(&self.key)
            .and_then(|queue| queue.iter_mut().find(|waiter| waiter.id == self.id));
        mine.is_some_and(|waiter| waiter.offer.take().is_some())
    }

    /// Leaves the queue because this waiter won: the one behind is told the key is held.
    pub(crate) fn leave_won(mut self) {
        self.won = true;
    }
}

impl Drop for QueuePlace<'_> {
    fn drop(&mut self) {
        metrics::waiters(&self.queues.metrics, -1);
        let mut keys = self.queues.keys();
        let Some(queue) = keys.get_mut(&self.key) else {
            return;
        };
        let was_head = queue.front().is_some_and(|head| head.id == self.id);
        let before = queue.len();
        queue.retain(|waiter| waiter.id != self.id);
        if queue.len() < before {
            self.queues.waiters.fetch_sub(1, Ordering::SeqCst);
        }
        match queue.front() {
            None => {
                keys.remove(&self.key);
                self.queues.hearing_now().remove(&self.key);
                // A listener that registered the key lets go of it.
                self.queues.opened.notify_one();
            }
            // The one behind takes the turn at once, whatever ended this waiter's wait.
            Some(next) if was_head => next.turn.give(self.won),
            Some(_) => {}
        }
    }
}

/// The local FIFO line: waiters of this Locker for one key, in arrival order; only the
/// head attempts.
pub(crate) struct Fifo<'q>(pub(crate) &'q LocalQueues);

impl Line for Fifo<'_> {
    fn join<'a>(&'a self, key: &str) -> Box<dyn line::Place<'a> + 'a> {
        Box::new(self.0.join(key))
    }
}

impl<'a> line::Place<'a> for QueuePlace<'a> {
    fn may_attempt(&self) -> bool {
        self.is_head()
    }

    fn ticket(&mut self) -> Step<'_, Result<Option<i64>>> {
        Box::pin(std::future::ready(Ok(None)))
    }

    fn lost(&mut self) -> Step<'_, Result<()>> {
        Box::pin(std::future::ready(Ok(())))
    }

    fn won(self: Box<Self>, lease: Arc<Lease>) -> Step<'a, Arc<Lease>> {
        self.leave_won();
        Box::pin(std::future::ready(lease))
    }

    fn signalled(&self) -> Step<'_, bool> {
        Box::pin(self.next_turn())
    }

    fn offer(&self, offer: &Arc<Offer>) -> Option<oneshot::Receiver<Arc<Lease>>> {
        self.stand_offer(offer)
    }

    fn withdraw(&self) -> bool {
        self.withdraw_offer()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_turn_passes_in_arrival_order_and_skips_who_left() {
        let queues = LocalQueues::new(TableMetrics::new("t", crate::key_label::KeyLabel::Off));
        let first = queues.join("k");
        let second = queues.join("k");
        let third = queues.join("k");
        assert_eq!(queues.waiting("k"), 3);
        assert_eq!(queues.waiters.load(Ordering::SeqCst), 3);
        assert!(queues.released("k"), "three waiters heard it");
        assert!(first.is_head() && !second.is_head());
        drop(second); // left from the middle: nobody's turn changes
        assert!(first.is_head() && !third.is_head());
        drop(first);
        assert!(third.is_head());
        drop(third);
        assert_eq!(queues.waiting("k"), 0);
        assert_eq!(queues.waiters.load(Ordering::SeqCst), 0);
        assert!(!queues.released("k"), "nobody waits");
        assert!(queues.keys().is_empty(), "an empty queue is removed");
    }

    #[test]
    fn a_hold_back_covers_the_key_and_its_group_until_a_look_after_it() {
        let queues = LocalQueues::new(TableMetrics::new("t", crate::key_label::KeyLabel::Off));
        let before = Instant::now();
        let until = before + std::time::Duration::from_secs(60);
        queues.hold_back("sem~permit-1-of-3", until);
        assert_eq!(queues.held_back("sem~permit-1-of-3"), Some(until));
        assert_eq!(queues.held_back("sem~"), Some(until), "the group's queue");
        assert_eq!(queues.held_back("sem~permit-2-of-3"), None);
        assert_eq!(queues.held_back("other"), None);
        // A look that began before the release was committed has not seen it.
        queues.looked(before);
        assert_eq!(queues.held_back("sem~"), Some(until));
        queues.looked(Instant::now());
        assert_eq!(
            queues.held_back("sem~"),
            None,
            "seen by this Locker's listener"
        );
        // A reported release of the key (or its group) ends it as well; so does time.
        queues.hold_back("k", until);
        assert!(!queues.released("k"));
        assert_eq!(queues.held_back("k"), None);
        queues.hold_back("k", Instant::now());
        assert_eq!(queues.held_back("k"), None, "past its end");
        assert_eq!(queues.holding.load(Ordering::SeqCst), 0);
    }
}
