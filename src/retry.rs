//! The one retry loop of the crate: a deadline plus a [`RetryPolicy`]'s delays. Waiting
//! acquires, releases that must outlive an outage, deadlock victims and optimistic
//! updates all go through [`retry`], so every retry sleeps with the same jittered
//! backoff and none runs past its deadline.

use std::future::Future;

use tokio::time::{Instant, sleep};

use crate::config::RetryPolicy;

/// What one failed try asks of [`retry`].
#[derive(Debug)]
pub(crate) enum Retry<E> {
    /// Try again after the next delay, unless the deadline has come; then this error is
    /// the answer.
    Again(E),
    /// Give up now with this error.
    Stop(E),
}

/// Calls `attempt` with the try's number (1, 2, ...) until it returns `Ok` or
/// [`Retry::Stop`], sleeping the policy's next delay (cut short at `deadline`) after each
/// [`Retry::Again`]. Once `deadline` has passed, the last `Again` error is returned
/// instead of sleeping. The first try is made at once, whatever the deadline.
///
/// `attempt` is a closure returning a future (not an async closure): the futures of
/// async closures lose their `Send` proof inside generic code that is spawned.
pub(crate) async fn retry<T, E, F>(
    policy: &RetryPolicy,
    deadline: Instant,
    mut attempt: impl FnMut(u32) -> F,
) -> Result<T, E>
where
    F: Future<Output = Result<T, Retry<E>>>,
{
    let mut backoff = Backoff::new(policy, deadline);
    for tries in 1.. {
        match attempt(tries).await {
            Ok(value) => return Ok(value),
            Err(Retry::Stop(err)) => return Err(err),
            Err(Retry::Again(err)) => {
                if !backoff.pause().await {
                    return Err(err);
                }
            }
        }
    }
    unreachable!("u32 tries run out after years of retrying")
}

/// Runs `statement`, but gives up at `deadline` with a timed-out I/O error: for work
/// nobody waits on, whose answer is worthless past that moment (a black-holed connection
/// never fails by itself).
pub(crate) async fn by_deadline<T, E: From<sqlx::Error>>(
    deadline: Instant,
    statement: impl Future<Output = Result<T, E>>,
) -> Result<T, E> {
    tokio::time::timeout_at(deadline, statement)
        .await
        .unwrap_or_else(|_| Err(E::from(timed_out("no answer before the deadline"))))
}

/// The error of a statement that got no answer in time.
pub(crate) fn timed_out(why: &'static str) -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::new(std::io::ErrorKind::TimedOut, why))
}

/// The pauses of [`retry`], for loops that cannot hand their tries to a closure (one
/// calls the caller's own async closure, which only a plain loop can borrow; one races
/// its pauses against a signal).
pub(crate) struct Backoff {
    policy: RetryPolicy,
    /// The policy's delays, made at the first pause: most statements never pause, and
    /// making them is an allocation (three an uncontended `try_acquire` + `release`).
    delays: Option<Box<dyn Iterator<Item = std::time::Duration> + Send>>,
    deadline: Instant,
}

impl Backoff {
    pub(crate) fn new(policy: &RetryPolicy, deadline: Instant) -> Self {
        Backoff {
            policy: *policy,
            delays: None,
            deadline,
        }
    }

    /// Sleeps the next delay, cut short at the deadline; `false` (at once) when the
    /// deadline has passed and the caller should give up.
    pub(crate) async fn pause(&mut self) -> bool {
        match self.next_pause() {
            Some(pause) => {
                sleep(pause).await;
                true
            }
            None => false,
        }
    }

    /// A draw from the policy's longest delay (`max` with the same jitter, but at least
    /// half of it), cut short at the deadline: the sleep of a waiter that expects to be
    /// woken and only guards against a wake-up that never comes.
    pub(crate) fn longest(&self) -> std::time::Duration {
        let max = self.policy.max;
        let pause = max.mul_f64(0.5 + fastrand::f64() / 2.0);
        pause.min(self.deadline.saturating_duration_since(Instant::now()))
    }

    /// The next delay, cut short at the deadline; `None` when the deadline has passed.
    pub(crate) fn next_pause(&mut self) -> Option<std::time::Duration> {
        let now = Instant::now();
        (now < self.deadline).then(|| {
            let policy = &self.policy;
            self.delays
                .get_or_insert_with(|| Box::new(policy.delays()))
                .next()
                .unwrap_or_default()
                .min(self.deadline - now)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn retries_until_the_deadline_then_returns_the_last_error() {
        let started = Instant::now();
        let outcome: Result<(), u32> = retry(
            &RetryPolicy::default(),
            started + Duration::from_secs(2),
            |tries| async move { Err(Retry::Again(tries)) },
        )
        .await;
        assert!(matches!(outcome, Err(tries) if tries > 3), "{outcome:?}");
        assert!(Instant::now() - started <= Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn stops_at_once_and_returns_success() {
        let stopped: Result<(), u32> = retry(
            &RetryPolicy::default(),
            Instant::now() + Duration::from_secs(60),
            |tries| async move { Err(Retry::Stop(tries)) },
        )
        .await;
        assert_eq!(stopped, Err(1));
        let done: Result<u32, ()> = retry(
            &RetryPolicy::default(),
            Instant::now() + Duration::from_secs(60),
            |tries| async move {
                if tries == 3 {
                    Ok(tries)
                } else {
                    Err(Retry::Again(()))
                }
            },
        )
        .await;
        assert_eq!(done, Ok(3));
    }
}
