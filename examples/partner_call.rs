//! Calling another service under a lock (README, "Calling another service under a lock"):
//! a semaphore of 3 permits keeps a partner's API at 3 calls at once; each caller checks
//! its permit just before the call (`ensure_held`, no statement), bounds the call by what
//! is left of the lease (`remaining`), and passes its fencing token. A caller frozen past
//! its lease (here: one whose lease is not renewed, as a stopped process's is not) is
//! refused by its own check when it wakes, before it calls.
//!
//! `cargo run --example partner_call` (embedded SQLite, no server needed)

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dblock::{Error, Locker};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};

/// The partner: counts calls in flight and remembers the most it saw at once.
#[derive(Default)]
struct Partner {
    in_flight: AtomicUsize,
    most_at_once: AtomicUsize,
    calls: AtomicUsize,
}

impl Partner {
    async fn charge(&self, _fencing_token: i64) {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_at_once.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(20)).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.calls.fetch_add(1, Ordering::SeqCst);
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::temp_dir().join(format!("dblock-partner-{}.db", std::process::id()));
    let options = SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true);
    let pool = SqlitePoolOptions::new().connect_with(options).await?;
    let locker = Locker::new(pool);
    locker.migrate().await?;
    let partner = Arc::new(Partner::default());

    // Twelve callers, three permits.
    let mut callers = Vec::new();
    for _ in 0..12 {
        let (calls, partner) = (locker.semaphore("partner-api", 3), Arc::clone(&partner));
        callers.push(tokio::spawn(async move {
            let permit = calls
                .acquire(Duration::from_secs(10), Duration::from_secs(30))
                .await?;
            permit.ensure_held()?;
            let bound = permit.remaining();
            let call = tokio::time::timeout(bound, partner.charge(permit.fencing_token()));
            call.await.map_err(|_| "the call outlived the lease")?;
            permit.release().await?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    for caller in callers {
        caller.await?.map_err(|err| err.to_string())?;
    }
    let most = partner.most_at_once.load(Ordering::SeqCst);
    println!("12 calls made, at most {most} at once (limit 3)");
    assert!(most <= 3, "the partner saw {most} calls at once");

    // A caller frozen past its lease: nothing renews it, as nothing runs in a stopped
    // process. When it wakes, its own check refuses the call.
    let frozen = locker.auto_renew(false).semaphore("partner-api", 3);
    let permit = frozen
        .try_acquire(Duration::from_millis(300))
        .await?
        .expect("a free permit");
    permit.lost().await; // "frozen" until past the lease's local deadline
    match permit.ensure_held() {
        Err(Error::LockLost { reason, .. }) => {
            println!("the thawed caller did not call: its permit was lost ({reason})")
        }
        other => panic!("a permit past its lease: {other:?}"),
    }
    assert_eq!(permit.remaining(), Duration::ZERO);
    assert_eq!(
        partner.calls.load(Ordering::SeqCst),
        12,
        "no call on a lost permit"
    );
    drop(permit);
    locker.shutdown().await;
    std::fs::remove_file(&path).ok();
    Ok(())
}
