//! `Leadership::resign` hands the lead over on every backend: a candidate that was waiting,
//! in this process or another, leads before the resigner can win again; a lone resigner
//! leads again after its hold-off; other candidates of its Locker are not held off.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dblock::{Locker, RetryPolicy};
use tokio::task::JoinSet;
use tokio::time::{Instant, timeout};

use super::{LONG, PATIENCE};
use crate::common::{TestBackend, TestDb};

/// The candidates' pacing: a polling candidate looks at most 100 ms apart, so a
/// resigner stands aside for 300 ms (twice that plus the slack).
const POLLING: RetryPolicy = RetryPolicy {
    initial: Duration::from_millis(10),
    max: Duration::from_millis(100),
};

/// The shortest stand-aside the documentation promises: twice [`POLLING`]'s `max`.
const HOLD_OFF_AT_LEAST: Duration = Duration::from_millis(200);

/// Resignations counted by [`resign_hands_the_lead_to_another_process`].
const RESIGNATIONS: usize = 20;

/// A Locker on a pool of its own (another "process", to the database), pacing [`POLLING`].
async fn process<DB: TestBackend>(db: &TestDb<DB>) -> Locker<DB> {
    Locker::builder(DB::connect(&db.location, 3).await)
        .table(db.table.clone())
        .retry(POLLING)
        .build()
        .expect("valid options")
}

/// Returns once every process but `number` has sent an attempt since the call: its
/// candidate waits in its campaign (one standing aside after its own resignation makes
/// no attempt). Polled: no signal tells of another process's attempt.
async fn others_wait<DB: TestBackend>(processes: &[Locker<DB>], number: usize) {
    let attempts = || {
        processes
            .iter()
            .map(|p| p.stats().attempts)
            .collect::<Vec<_>>()
    };
    let before = attempts();
    let deadline = Instant::now() + PATIENCE;
    loop {
        let now = attempts();
        if (0..now.len()).all(|other| other == number || now[other] > before[other]) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the other candidates never attempted"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Four processes, one candidate each, every one resigning once the other three wait
/// (each sent an attempt during its lead) and campaigning again at once: after each of
/// [`RESIGNATIONS`] resignations the next lead is another process's. Prints how many
/// moved (`--nocapture`) before asserting.
pub async fn resign_hands_the_lead_to_another_process<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let mut processes = Vec::new();
    for _ in 0..4 {
        processes.push(process(&db).await);
    }
    let processes = Arc::new(processes);
    // Which process led, in the order of the leads (leads never overlap).
    let leads = Arc::new(Mutex::new(Vec::new()));
    let mut candidates = JoinSet::new();
    for number in 0..processes.len() {
        let election = processes[number].election("handover");
        let (leads, processes) = (Arc::clone(&leads), Arc::clone(&processes));
        candidates.spawn(async move {
            let identity = format!("node-{number}");
            loop {
                let lead = election.campaign(&identity, LONG).await.expect("leads");
                let count = {
                    let mut leads = leads.lock().unwrap();
                    leads.push(number);
                    leads.len()
                };
                // A candidate that attempted while this one leads waits in its campaign
                // (one standing aside after its own resignation makes no attempt).
                others_wait(&processes, number).await;
                lead.resign().await.expect("resigned while leading");
                if count > RESIGNATIONS {
                    break;
                }
            }
        });
    }
    // The candidate whose lead followed the last counted resignation stops; the others
    // are still campaigning (cancel safe) and are dropped.
    timeout(PATIENCE * 4, candidates.join_next())
        .await
        .expect("the resignations are done in time")
        .expect("a candidate")
        .expect("the candidate's task");
    candidates.shutdown().await;
    let leads = leads.lock().unwrap()[..=RESIGNATIONS].to_vec();
    let moved = leads.windows(2).filter(|pair| pair[0] != pair[1]).count();
    println!(
        "{}: {moved} of {RESIGNATIONS} resignations moved the lead to another process (leaders in order: {leads:?})",
        DB::LABEL
    );
    assert_eq!(
        moved, RESIGNATIONS,
        "a resigner led again while candidates of other processes waited: {leads:?}"
    );
}

/// With nobody else campaigning, a resigner that campaigns again leads again, after
/// standing aside for its hold-off (at least twice the policy's `max`) and within a
/// generous bound, in a greater term; so does `run` after its work ended by choice (it
/// resigned) and `run` is called again.
pub async fn a_lone_resigner_leads_again_after_its_hold_off<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let election = process(&db).await.election("solo");
    let first = election.campaign("solo", LONG).await.unwrap();
    let term = first.term();
    first.resign().await.unwrap();
    let resigned = Instant::now();
    let again = timeout(PATIENCE, election.campaign("solo", LONG))
        .await
        .expect("the lone resigner leads again")
        .unwrap();
    let stood_aside = resigned.elapsed();
    assert!(
        stood_aside >= HOLD_OFF_AT_LEAST,
        "led again {stood_aside:?} after resigning: it did not stand aside"
    );
    assert!(again.term() > term);
    again.resign().await.unwrap();

    // `run` resigns when its work ends; the next `run` stands aside as `campaign` does.
    let work = async |leading: &dblock::Leadership<DB>| Ok::<_, dblock::Error>(leading.term());
    let term = election.run("solo", LONG, work).await.unwrap();
    let resigned = Instant::now();
    let next = timeout(PATIENCE, election.run("solo", LONG, work))
        .await
        .expect("the lone resigner's run leads again")
        .unwrap();
    let stood_aside = resigned.elapsed();
    assert!(
        stood_aside >= HOLD_OFF_AT_LEAST,
        "run led again {stood_aside:?} after its work ended: it did not stand aside"
    );
    assert!(next > term);
    assert_eq!(election.leader().await.unwrap(), None, "run resigned");
}

/// A resigner that campaigns again at once stands aside for its own identity only: a
/// second candidate of the same Locker that campaigns after it leads at once (before the
/// resigner), and the resigner, now waiting behind it, leads when it resigns.
pub async fn a_resigner_holds_off_no_other_local_candidate<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let election = process(&db).await.election("local");
    let first = election.campaign("a", LONG).await.unwrap();
    let term = first.term();
    first.resign().await.unwrap();
    let mut again = Box::pin({
        let election = election.clone();
        async move { election.campaign("a", LONG).await }
    });
    // Polled once before "b" campaigns: without a stand-aside, "a" would now head the
    // Locker's line with its attempt sent, and "b" would wait behind it.
    tokio::select! {
        biased;
        _ = &mut again => panic!("the resigner led again at once"),
        _ = std::future::ready(()) => {}
    }
    let again = tokio::spawn(again);
    let other = timeout(PATIENCE, election.campaign("b", LONG))
        .await
        .expect("the other local candidate is not held off")
        .unwrap();
    assert!(!again.is_finished(), "two leaders");
    assert!(other.term() > term);
    let leader = election.leader().await.unwrap().expect("a leader");
    assert_eq!((leader.identity.as_str(), leader.term), ("b", other.term()));
    let other_term = other.term();
    other.resign().await.unwrap();
    let again = timeout(PATIENCE, again)
        .await
        .expect("the resigner, waiting behind the other candidate, leads after it")
        .expect("the resigner's task")
        .unwrap();
    assert!(again.term() > other_term);
    again.resign().await.unwrap();
}
