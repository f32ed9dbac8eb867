//! A resigned leader stands aside: its next campaign waits before its first attempt, so
//! that the lead goes to a candidate that was waiting, in whatever process.
//!
//! Why it is needed: candidates of other processes find a free leader row by their own
//! attempts. On MariaDB and SQLite they poll (the Locker's [`RetryPolicy`], at most its
//! `max` apart); on PostgreSQL a notification wakes them, but only after the release's
//! commit has travelled to their listener. A resigner that campaigns again at once (a
//! loop of campaign, work, resign) sends its attempt as soon as its release is answered,
//! before any of them: measured, it won again nearly every time on MariaDB and SQLite, and
//! a quarter of the time on PostgreSQL.
//!
//! So [`Leadership::resign`](crate::Leadership::resign) records, in its Locker, the term it
//! gave up and an end instant (see [`hold_off`]); a campaign of the same identity for the
//! same election through that Locker makes no attempt before that instant, unless the row
//! shows a greater term first (someone else led meanwhile: then it campaigns as anyone
//! does, and waits its turn). Other candidates are not held off, nor is anyone else of the
//! Locker: a stand-aside is one identity's.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::{Instant, sleep};

use crate::config::RetryPolicy;
use crate::dialect::Backend;
use crate::retry::by_deadline;
use crate::table::LockTable;

/// Added to twice the [`RetryPolicy`]'s `max` in a resigner's hold-off: room for a polling
/// candidate's attempt (one round trip, perhaps a pool checkout, on a busy machine) that
/// starts at the very end of its longest sleep.
pub const RESIGN_HOLD_OFF_SLACK: Duration = Duration::from_millis(100);

/// How many times a standing-aside campaign reads the row, evenly spread over its
/// hold-off, to find out early that someone else leads.
const READS: u32 = 4;

/// How long a resigner stands aside: `2 x max + RESIGN_HOLD_OFF_SLACK` (1.1 s with the
/// default policy). A polling candidate sleeps at most `max` between attempts (a jittered
/// backoff draw, or its wait for the holder's lease, both capped there), so one that was
/// waiting when the row was released has looked at it within `max` plus its attempt's
/// time; the second `max` and the slack leave that attempt room on a busy machine.
///
/// No jitter: one election has one leader at a time, so its resigners never stand aside
/// from the same instant, and equal hold-offs end in the order of the resignations. With
/// a random part, a resigner could come back before one that resigned earlier (seen when
/// every candidate led and resigned within a few milliseconds, each standing aside while
/// the others did) and lead twice in a row.
pub(crate) fn hold_off(policy: &RetryPolicy) -> Duration {
    policy.max * 2 + RESIGN_HOLD_OFF_SLACK
}

/// One resigner's stand-aside.
#[derive(Debug, Clone, Copy)]
struct Aside {
    /// The term it gave up: a greater one on the row means someone else led since.
    term: i64,
    /// When the hold-off began and ends.
    from: Instant,
    until: Instant,
}

/// The stand-asides of a Locker's resigners, by (leader row's key, identity).
#[derive(Debug, Default)]
pub(crate) struct StandAsides {
    asides: Mutex<HashMap<(String, String), Aside>>,
}

impl StandAsides {
    /// `identity` just resigned the lead of `key` in `term`: its campaigns for `key`
    /// stand aside for [`hold_off`] from now. Ended stand-asides are dropped here, so the
    /// map holds no more than the resignations of one hold-off.
    pub(crate) fn record(&self, key: &str, identity: &str, term: i64, policy: &RetryPolicy) {
        let from = Instant::now();
        let aside = Aside {
            term,
            from,
            until: from + hold_off(policy),
        };
        let mut asides = self.asides.lock().expect("never poisoned: no panic inside");
        asides.retain(|_, aside| aside.until > from);
        asides.insert((key.to_owned(), identity.to_owned()), aside);
    }

    /// Waits until `identity`'s stand-aside for `key` ends, at once if it has none: until
    /// its end instant, or until a read of the row shows a greater term than the one given
    /// up (then the stand-aside is over for every campaign of the identity). A read that
    /// fails is not the campaign's error: the hold-off ends on time all the same, and the
    /// campaign's attempt reports an outage. Cancel safe: the stand-aside stays recorded.
    pub(crate) async fn wait_out<DB: Backend>(
        &self,
        table: &LockTable<DB>,
        key: &str,
        identity: &str,
    ) {
        let Some(aside) = self.find(key, identity) else {
            return;
        };
        let every = (aside.until - aside.from) / READS;
        loop {
            let left = aside.until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            sleep(left.min(every)).await;
            if Instant::now() >= aside.until {
                break;
            }
            match by_deadline(aside.until, table.inspect(key)).await {
                Ok(Some(row)) if row.fencing_token > aside.term => break,
                Ok(_) => {}
                Err(err) => {
                    tracing::debug!(key, identity, error = %err, "could not read the leader while standing aside")
                }
            }
        }
        self.forget(key, identity, aside.term);
    }

    /// The stand-aside of `identity` for `key` that has not ended.
    fn find(&self, key: &str, identity: &str) -> Option<Aside> {
        let asides = self.asides.lock().expect("never poisoned: no panic inside");
        // Most campaigns come with nobody standing aside: no key to build then.
        if asides.is_empty() {
            return None;
        }
        let aside = asides.get(&(key.to_owned(), identity.to_owned()))?;
        (aside.until > Instant::now()).then_some(*aside)
    }

    /// Drops the stand-aside of `identity` for `key` given up in `term`: not a later one
    /// (recorded meanwhile by another resignation of the same identity).
    fn forget(&self, key: &str, identity: &str, term: i64) {
        let mut asides = self.asides.lock().expect("never poisoned: no panic inside");
        let id = (key.to_owned(), identity.to_owned());
        if asides.get(&id).is_some_and(|aside| aside.term == term) {
            asides.remove(&id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hold_off_covers_two_longest_sleeps_and_the_slack() {
        assert_eq!(
            hold_off(&RetryPolicy::default()),
            Duration::from_millis(1100)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_stand_aside_is_one_identitys_until_it_ends() {
        let asides = StandAsides::default();
        let policy = RetryPolicy::default();
        asides.record("e~leader", "a", 7, &policy);
        assert!(asides.find("e~leader", "a").is_some());
        assert!(asides.find("e~leader", "b").is_none(), "another identity");
        assert!(asides.find("f~leader", "a").is_none(), "another election");
        tokio::time::advance(hold_off(&policy)).await;
        assert!(asides.find("e~leader", "a").is_none(), "ended");
        asides.record("e~leader", "b", 8, &policy);
        assert_eq!(asides.asides.lock().unwrap().len(), 1, "ended ones dropped");
        asides.forget("e~leader", "b", 7);
        assert!(asides.find("e~leader", "b").is_some(), "a later one stays");
        asides.forget("e~leader", "b", 8);
        assert!(asides.find("e~leader", "b").is_none());
    }
}
