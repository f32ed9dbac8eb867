//! Bells (MySQL/MariaDB): the holder's side. A won row whose acquisition saw a waiter of
//! another process registered for its queue gets its *bell* taken on the engine's
//! connection, and dropped once the lease's hold ends (its release committed, its loss,
//! or its guard gone): the listeners of the waiting processes, blocked on that bell in
//! the server, hear the release at once (`dialect/mysql/bells.rs`). Nothing of it runs
//! for a row nobody else waits for.
//!
//! Such a release also does not hand this Locker's own next waiter its turn in-process
//! when this Locker's listener hears the bell too: the local and the remote waiters then
//! learn of it the same way and race on equal terms, where a local waiter told at once
//! would win nearly every time and starve the other process.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, sleep};

use super::{Engine, EngineState};
use crate::dialect::Backend;
use crate::lease::Lease;
use crate::retry::by_deadline;

/// The tries at a bell another session still holds (the previous holder's release, its
/// drop a round trip behind its `DELETE`): pauses doubling from the first, this many.
const TAKE_FIRST: Duration = Duration::from_millis(1);
const TAKE_TRIES: u32 = 5;

impl<DB: Backend> Engine<DB> {
    /// Takes the bell of `lease`'s row, in the background, and drops it when the lease's
    /// hold ends. A bell it cannot take (held elsewhere all along, the engine's
    /// connection failing) is given up: the waiters of other processes poll for this
    /// hold, as they would without bells.
    pub(crate) fn ring_at_end(&self, lease: &Arc<Lease>) {
        let ends = lease.hold_ends();
        let held = Arc::downgrade(lease);
        let (key, deadline) = (lease.key.clone(), lease.deadline());
        let inner = Arc::clone(&self.inner);
        self.inner.jobs.spawn(async move {
            let mut ends = ends;
            let mut pause = TAKE_FIRST;
            for tries in 1..=TAKE_TRIES {
                let took = by_deadline(deadline, inner.table.take_bell(&key)).await;
                match took {
                    Ok(true) => break,
                    Ok(false) if tries < TAKE_TRIES => {}
                    Ok(false) | Err(_) => return,
                }
                // Over already: nothing to ring for.
                tokio::select! {
                    _ = &mut ends => return,
                    _ = sleep(pause) => {}
                }
                pause *= 2;
            }
            if let Some(lease) = held.upgrade() {
                lease.set_belled();
            }
            tokio::select! {
                _ = ends => {}
                _ = inner.jobs.stopping() => {}
            }
            inner.ring(&key).await;
        });
    }
}

impl<DB: Backend> EngineState<DB> {
    /// Drops the bell of `key`: the listeners blocked on it hear the release. A failure
    /// closes the engine's connection, which drops every bell it held.
    async fn ring(&self, key: &str) {
        let bound = Instant::now() + self.table.statement_timeout();
        if let Err(err) = by_deadline(bound, self.table.drop_bell(key)).await {
            tracing::debug!(key, error = %err, "could not drop a bell; its waiters poll");
        }
    }

    /// Hands the next waiter of this Locker for `lease`'s key its turn after the lease
    /// ended, unless its release rings a bell this Locker's listener hears (see the
    /// module docs): then the bell wakes it, as it wakes the other processes' waiters.
    pub(super) fn wake_local(&self, lease: &Lease) {
        if lease.belled() && self.queues.hears(&lease.key) {
            return;
        }
        self.queues.released(&lease.key);
    }
}
