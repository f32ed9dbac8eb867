//! The futures of the calls an application awaits stay small, on every backend. sqlx's
//! own futures are large (a pool checkout alone is about 8.6 KB on PostgreSQL), and every
//! layer that holds one by value copies it on each move: before the lock-table layer
//! boxed them, `try_acquire`'s future was 146 KB and `release`'s 36 KB (release build),
//! and copying them was 88 % of the uncontended cycle's instructions (callgrind), about a
//! fifth of its client CPU in the bench. Bytes, unlike seconds, do not drift with the
//! machine's load.
//!
//! I broke it on purpose both ways (a checkout unboxed; `try_acquire`'s attempt
//! unboxed): this test failed each time.

// This binary uses part of the shared harness; the rest is for the conformance binaries.
#[allow(dead_code)]
mod common;

use std::time::Duration;

use common::{TestBackend, TestDb};

const LONG: Duration = Duration::from_secs(30);

/// The most any of them may take. Now 0.4-1.4 KB in a test build; with the checkout
/// unboxed again 6.4-30 KB, with the acquisitions' futures unboxed at the top
/// (`Locker::try_acquire`, `acquire`: the metrics wrapper and its span hold them by
/// value, a copy per layer) 9.2-12.6 KB, and with the span wrapper taking `release`'s
/// future by value (an async fn stores such an argument twice) 2.0-2.3 KB.
const MOST: usize = 2 * 1024 - 64;

async fn futures_stay_small<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let locker = &db.locker;
    let mut sizes = Vec::new();
    let try_acquire = locker.try_acquire("small", LONG);
    sizes.push(("try_acquire", size_of_val(&try_acquire)));
    let guard = try_acquire.await.unwrap().unwrap();
    let release = guard.release();
    sizes.push(("release", size_of_val(&release)));
    release.await.unwrap();
    let acquire = locker.acquire("small", LONG, LONG);
    sizes.push(("acquire", size_of_val(&acquire)));
    acquire.await.unwrap().release().await.unwrap();
    let with_lock = locker.with_lock("small", LONG, LONG, async |_| Ok::<_, dblock::Error>(()));
    sizes.push(("with_lock", size_of_val(&with_lock)));
    with_lock.await.unwrap();
    eprintln!("{}: {sizes:?}", DB::LABEL);
    for &(call, size) in &sizes {
        assert!(size <= MOST, "{call}'s future is {size} bytes: {sizes:?}");
    }
}

#[tokio::test]
async fn postgres_futures_stay_small() {
    futures_stay_small::<sqlx::Postgres>().await;
}

#[tokio::test]
async fn mysql_futures_stay_small() {
    futures_stay_small::<sqlx::MySql>().await;
}

#[tokio::test]
async fn sqlite_futures_stay_small() {
    futures_stay_small::<sqlx::Sqlite>().await;
}
