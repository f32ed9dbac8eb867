//! Issue 43, point 2: a candidate that keeps campaigning (`Election::spawn`): after its
//! work fails it resigns, pauses and leads again; after its lead is lost it campaigns
//! again at once; stopping it resigns the lead.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use dblock::Locker;
use tokio::sync::mpsc;
use tokio::time::timeout;

use super::PATIENCE;
use crate::common::{TestBackend, TestDb};

/// Renewed every second: a deleted leader row is noticed within one.
const LEASE: Duration = Duration::from_secs(3);

pub async fn a_spawned_candidate_keeps_leading_through_errors_and_losses<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let locker = Locker::builder(db.pool.clone())
        .table(&db.table)
        .build()
        .unwrap();
    let election = locker.election("relay");
    let (terms, mut led) = mpsc::unbounded_channel();
    let calls = Arc::new(AtomicU32::new(0));
    let handle = election
        .spawn("relay-1", LEASE, move |leading| {
            let (terms, calls) = (terms.clone(), Arc::clone(&calls));
            async move {
                let call = calls.fetch_add(1, Ordering::SeqCst) + 1;
                terms.send((call, leading.term())).ok();
                if call == 1 {
                    return Err("a transient failure of the leader's work".into());
                }
                // A leader that never returns: no dummy Ok(()) needed after the loop.
                loop {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    leading.ensure_held()?;
                }
            }
        })
        .unwrap();
    let mut next = async || {
        timeout(PATIENCE, led.recv())
            .await
            .expect("led again")
            .unwrap()
    };
    let (first_call, first_term) = next().await;
    // The first term's work failed: resigned, paused, and led again in a greater term.
    let (second_call, second_term) = next().await;
    assert_eq!((first_call, second_call), (1, 2));
    assert!(second_term > first_term, "{second_term} after {first_term}");
    let stats = handle.stats();
    assert_eq!(
        (stats.terms, stats.work_errors, stats.leading),
        (2, 1, true)
    );

    // The lead deleted behind its back: lost at the next renewal, led again at once.
    assert!(locker.force_release(&election.key()).await.unwrap());
    let (third_call, third_term) = next().await;
    assert_eq!(third_call, 3);
    assert!(third_term > second_term, "{third_term} after {second_term}");
    assert_eq!(handle.stats().lost, 1);

    // Stopping resigns: nobody leads afterwards.
    let stats = handle.stop().await;
    assert_eq!((stats.terms, stats.leading), (3, false));
    assert_eq!(election.leader().await.unwrap(), None);
}

pub async fn a_spawned_candidate_refuses_bad_input<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let election = db.locker.election("relay");
    let work = |_| async { Ok(()) };
    assert!(
        election.spawn("", LEASE, work).is_err(),
        "an empty identity"
    );
    assert!(
        election.spawn("relay-1", Duration::ZERO, work).is_err(),
        "a zero lease"
    );
    assert_eq!(db.plain.row_count().await, 0, "nothing written");
}
