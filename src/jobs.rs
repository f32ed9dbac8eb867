//! Background work a Locker owns: its lease engine's task, the release listener, the
//! ticket job, and the clean-ups after statements whose callers went away. All of it is
//! spawned on the caller's tokio runtime, tracked so that stopping can wait for it, and
//! told to stop by one token.

use std::future::Future;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The background work of one Locker (cheap to clone: the clones share it).
#[derive(Clone, Default)]
pub(crate) struct Jobs {
    tracker: TaskTracker,
    stop: CancellationToken,
}

impl Jobs {
    /// Runs `job` in the background, tracked: [`stopped`](Self::stopped) waits for it.
    /// Without a tokio runtime there is nowhere to run it: it is dropped, and said so.
    pub(crate) fn spawn(&self, job: impl Future<Output = ()> + Send + 'static) {
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(self.tracker.track_future(job));
            }
            Err(_) => {
                tracing::warn!("no tokio runtime: background lock work dropped; leases will expire")
            }
        }
    }

    /// Completes when the work is told to stop.
    pub(crate) async fn stopping(&self) {
        self.stop.cancelled().await;
    }

    /// Whether the work was told to stop.
    pub(crate) fn is_stopping(&self) -> bool {
        self.stop.is_cancelled()
    }

    /// Tells every job to stop (each finishes what it must: see its own docs).
    pub(crate) fn stop(&self) {
        self.stop.cancel();
    }

    /// Tells every job to stop and waits until all of them, and whatever they spawned
    /// meanwhile, have ended.
    pub(crate) async fn stopped(&self) {
        self.stop();
        self.tracker.close();
        self.tracker.wait().await;
    }
}
