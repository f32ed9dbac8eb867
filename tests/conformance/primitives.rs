//! Semaphores, read-write locks, leader election and several-key locks: their invariants
//! under concurrency, on every backend, with Lockers on pools of their own (as separate
//! processes would be, to the database).

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::time::Duration;

use dblock::{Error, Locker, LostReason, RetryPolicy};
use tokio::sync::Barrier;
use tokio::task::JoinSet;

use super::{LONG, PATIENCE, SHORT};
use crate::common::{TestBackend, TestDb, wait_until};

/// Connections of each of [`lockers`]' pools. Few: eight such Lockers, with the engine's
/// and the listener's connection each, must stay far below PostgreSQL's default of 100
/// connections while other cases run beside them (a pool that cannot connect makes its
/// callers wait until they time out); a task that waits for a pooled connection only
/// waits a little longer.
const POOL: u32 = 3;

/// Lockers on pools of their own, on the test's table, with short retry sleeps.
async fn lockers<DB: TestBackend>(db: &TestDb<DB>, count: usize) -> Vec<Locker<DB>> {
    let mut lockers = Vec::new();
    for _ in 0..count {
        let locker = Locker::builder(DB::connect(&db.location, POOL).await)
            .table(db.table.clone())
            .retry(RetryPolicy {
                initial: Duration::from_millis(2),
                max: Duration::from_millis(50),
            })
            .build()
            .expect("valid options");
        lockers.push(locker);
    }
    lockers
}

/// Raises `max` to `now` if it is higher.
fn note_max(max: &AtomicUsize, now: usize) {
    max.fetch_max(now, Ordering::SeqCst);
}

/// Three permits: exactly three holders at once (reached, and never four) among 32 tasks
/// of 8 Lockers; a mismatched count is a typed error; a crashed holder's permit comes
/// back when its lease ends, not before.
pub async fn semaphore_admits_exactly_its_permits<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let lockers = lockers(&db, 8).await;
    let name = "exports";

    // Every holder counts itself in and out of a counter in fenced transactions.
    db.plain.counter_create().await;
    let counter = db.plain.counter_table();

    // Reached: three holders at once, and a fourth is refused.
    let mut held = Vec::new();
    for locker in &lockers[..3] {
        let permit = locker.semaphore(name, 3).try_acquire(LONG).await.unwrap();
        let permit = permit.expect("a free permit");
        let now = DB::fenced_add(&db.pool, &permit, &counter, 1)
            .await
            .unwrap();
        assert_eq!(now, held.len() as i64 + 1);
        held.push(permit);
    }
    assert_eq!(db.plain.counter_get().await, 3, "three holders at once");
    let numbers: HashSet<u32> = held.iter().map(|permit| permit.number()).collect();
    assert_eq!(numbers, HashSet::from([0, 1, 2]));
    let rows = db.locker.list("exports~", 10).await.unwrap();
    assert!(rows.iter().all(|row| row.kind() == "semaphore"), "{rows:?}");
    let fourth = lockers[3].semaphore(name, 3);
    assert!(fourth.try_acquire(LONG).await.unwrap().is_none());
    assert_eq!(fourth.available().await.unwrap(), 0);
    assert_eq!(fourth.holders().await.unwrap().len(), 3);
    let other_count = lockers[3].semaphore(name, 4).try_acquire(LONG).await;
    assert!(
        matches!(
            other_count,
            Err(Error::PermitsMismatch {
                permits: 4,
                found: 3,
                ..
            })
        ),
        "{other_count:?}"
    );
    for permit in held {
        DB::fenced_add(&db.pool, &permit, &counter, -1)
            .await
            .unwrap();
        permit.release().await.unwrap();
    }
    assert_eq!(
        db.plain.row_count().await,
        0,
        "a mismatched handle wrote nothing"
    );

    // Never more: 8 Lockers x 4 tasks, each taking a permit 4 times; each holder adds
    // itself to the counter in a fenced transaction, and takes itself off again.
    let max = Arc::new(AtomicUsize::new(0));
    let mut tasks = JoinSet::new();
    for task in 0..32 {
        let locker = lockers[task % lockers.len()].clone();
        let (max, counter) = (Arc::clone(&max), counter.clone());
        tasks.spawn(async move {
            let semaphore = locker.semaphore(name, 3);
            for _ in 0..4 {
                let permit = semaphore.acquire(LONG, PATIENCE).await.expect("a permit");
                let pool = locker.pool();
                let now = DB::fenced_add(pool, &permit, &counter, 1)
                    .await
                    .expect("fenced");
                note_max(&max, usize::try_from(now).expect("a count"));
                tokio::time::sleep(Duration::from_millis(3)).await;
                DB::fenced_add(pool, &permit, &counter, -1)
                    .await
                    .expect("fenced");
                permit.release().await.expect("released while held");
            }
        });
    }
    while let Some(task) = tasks.join_next().await {
        task.expect("semaphore task");
    }
    assert!(max.load(Ordering::SeqCst) <= 3, "max holders {max:?}");
    assert_eq!(db.plain.counter_get().await, 0);
    assert_eq!(db.plain.row_count().await, 0);

    // A crashed holder (its permit forgotten, never renewed): back after its lease only.
    let one = db.locker.semaphore("single", 1);
    let crashed = one.try_acquire(SHORT * 4).await.unwrap().expect("free");
    let key = crashed.key().to_owned();
    std::mem::forget(crashed);
    assert!(
        one.try_acquire(LONG).await.unwrap().is_none(),
        "not before its lease ends"
    );
    wait_until("the crashed permit expired", PATIENCE, async || {
        db.plain.is_expired(&key).await
    })
    .await;
    let back = one
        .acquire(LONG, PATIENCE)
        .await
        .expect("the permit came back");
    assert_eq!(back.key(), key);
    back.release().await.unwrap();
}

/// Readers share, a writer excludes everyone, a writer among a stream of readers gets
/// in (within the test's patience), and its token is above every earlier grant's.
pub async fn rw_lock_excludes_and_does_not_starve_writers<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let lockers = lockers(&db, 4).await;
    let name = "catalog";

    // Readers share: four at once.
    let mut reads = Vec::new();
    for locker in &lockers {
        reads.push(
            locker
                .rw_lock(name)
                .try_read(LONG)
                .await
                .unwrap()
                .expect("shared"),
        );
    }
    assert!(
        lockers[0]
            .rw_lock(name)
            .try_write(LONG)
            .await
            .unwrap()
            .is_none()
    );
    let highest_read = reads.iter().map(|read| read.fencing_token()).max().unwrap();
    for read in reads {
        read.release().await.unwrap();
    }
    assert_eq!(
        db.plain.row_count().await,
        0,
        "the refused writer left nothing"
    );

    // A reader waiting behind a held write is paced and woken by the write's release; it
    // does not spin on writing its row and stepping back (1,098 attempts in 2 s before).
    let write = lockers[0]
        .rw_lock(name)
        .try_write(LONG)
        .await
        .unwrap()
        .expect("free");
    let before = lockers[1].stats().attempts;
    let waited = lockers[1].rw_lock(name).read(LONG, SHORT * 4).await;
    assert!(matches!(waited, Err(Error::Timeout { .. })), "{waited:?}");
    let attempts = lockers[1].stats().attempts - before;
    assert!(
        attempts <= 30,
        "{attempts} read attempts behind a held write"
    );
    write.release().await.unwrap();

    // Interleaved: a writer never overlaps a reader or another writer.
    let (readers, writers) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    // Every grant's token is noted; a write's is above all of them.
    let last_write = Arc::new(AtomicI64::new(highest_read));
    let mut tasks = JoinSet::new();
    for task in 0..12 {
        let lock = lockers[task % lockers.len()].rw_lock(name);
        let (readers, writers) = (Arc::clone(&readers), Arc::clone(&writers));
        let last_write = Arc::clone(&last_write);
        tasks.spawn(async move {
            for round in 0..5 {
                if (task + round) % 4 == 0 {
                    let write = lock.write(LONG, PATIENCE).await.expect("a write");
                    assert_eq!(writers.fetch_add(1, Ordering::SeqCst), 0, "two writers");
                    assert_eq!(readers.load(Ordering::SeqCst), 0, "a reader during a write");
                    let token = write.fencing_token();
                    assert!(last_write.fetch_max(token, Ordering::SeqCst) < token);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    writers.fetch_sub(1, Ordering::SeqCst);
                    write.release().await.expect("released while held");
                } else {
                    let read = lock.read(LONG, PATIENCE).await.expect("a read");
                    last_write.fetch_max(read.fencing_token(), Ordering::SeqCst);
                    readers.fetch_add(1, Ordering::SeqCst);
                    assert_eq!(writers.load(Ordering::SeqCst), 0, "a write during a read");
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    readers.fetch_sub(1, Ordering::SeqCst);
                    read.release().await.expect("released while held");
                }
            }
        });
    }
    while let Some(task) = tasks.join_next().await {
        task.expect("read-write task");
    }

    // A stream of readers that never leaves a gap: each reader takes its next read before
    // it lets go of the one it holds (try_read, so it never waits while holding), and only
    // when that is refused, because a writer waits, steps back and queues. A lock that
    // does not put a waiting writer first grants every such try_read, the readers never
    // all let go at once, and the writer waits out its patience (15 s): that is the bound.
    let streaming = Arc::new(AtomicBool::new(true));
    let reading = Arc::new(AtomicUsize::new(0));
    let mut stream = JoinSet::new();
    for locker in lockers.iter().take(3) {
        let lock = locker.rw_lock(name);
        let (streaming, reading) = (Arc::clone(&streaming), Arc::clone(&reading));
        stream.spawn(async move {
            let (mut granted, mut stepped_back) = (1u32, 0u32);
            let mut held = lock.read(LONG, PATIENCE).await.expect("a read");
            reading.fetch_add(1, Ordering::SeqCst);
            while streaming.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(20)).await;
                let next = match lock.try_read(LONG).await.expect("try_read") {
                    Some(next) => next,
                    None => {
                        // Counted out before the release: the writer's check below never
                        // sees fewer readers than hold a read.
                        reading.fetch_sub(1, Ordering::SeqCst);
                        held.release().await.expect("released while held");
                        stepped_back += 1;
                        held = lock.read(LONG, PATIENCE).await.expect("a read");
                        reading.fetch_add(1, Ordering::SeqCst);
                        granted += 1;
                        continue;
                    }
                };
                reading.fetch_add(1, Ordering::SeqCst);
                reading.fetch_sub(1, Ordering::SeqCst);
                held.release().await.expect("released while held");
                held = next;
                granted += 1;
            }
            reading.fetch_sub(1, Ordering::SeqCst);
            held.release().await.expect("released while held");
            (granted, stepped_back)
        });
    }
    wait_until("readers are streaming", PATIENCE, async || {
        reading.load(Ordering::SeqCst) > 0
    })
    .await;
    let write = lockers[3].rw_lock(name).write(LONG, PATIENCE).await;
    let write = write.expect("a writer among gapless streaming readers gets in (writer first)");
    assert_eq!(reading.load(Ordering::SeqCst), 0, "a read during the write");
    streaming.store(false, Ordering::SeqCst);
    write.release().await.unwrap();
    let mut stepped_back = 0;
    while let Some(task) = stream.join_next().await {
        let (granted, backs) = task.expect("reader");
        assert!(granted > 0);
        stepped_back += backs;
    }
    // The writer got in because readers stepped back for it, not through a gap.
    assert!(
        stepped_back > 0,
        "no reader stepped back for the waiting writer"
    );
}

/// Candidates of four Lockers: one leader at a time, every new lead a greater term,
/// `leader()` names it; resign hands over; a crashed leader is replaced after its lease
/// with a greater term; a watch follows the changes.
pub async fn election_has_one_leader_at_a_time<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let lockers = lockers(&db, 4).await;
    let leading = Arc::new(AtomicUsize::new(0));
    let last_term = Arc::new(AtomicI64::new(0));
    let mut candidates = JoinSet::new();
    for (number, locker) in lockers.iter().enumerate() {
        let election = locker.election("scheduler");
        let (leading, last_term) = (Arc::clone(&leading), Arc::clone(&last_term));
        candidates.spawn(async move {
            let identity = format!("node-{number}");
            for _ in 0..4 {
                let lead = election.campaign(&identity, LONG).await.expect("leads");
                assert_eq!(leading.fetch_add(1, Ordering::SeqCst), 0, "two leaders");
                let term = lead.term();
                assert!(
                    last_term.fetch_max(term, Ordering::SeqCst) < term,
                    "term went back"
                );
                let leader = election.leader().await.unwrap().expect("a leader");
                assert_eq!((leader.identity, leader.term), (identity.clone(), term));
                tokio::time::sleep(Duration::from_millis(2)).await;
                leading.fetch_sub(1, Ordering::SeqCst);
                lead.resign().await.expect("resigned while leading");
            }
        });
    }
    while let Some(candidate) = candidates.join_next().await {
        candidate.expect("candidate");
    }
    let election = db.locker.election("scheduler");
    assert_eq!(election.leader().await.unwrap(), None);
    let lead = election.campaign("operator-view", LONG).await.unwrap();
    let rows = db.locker.list("scheduler~", 10).await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (rows[0].kind(), rows[0].key.as_str()),
        ("leader", "scheduler~leader")
    );
    lead.resign().await.unwrap();

    // A watch sees a leader come and go.
    let mut watch = election.watch(Duration::from_millis(50)).unwrap();
    let first = election.campaign("alpha", SHORT * 4).await.unwrap();
    let seen = loop {
        if let Some(leader) = watch.changed().await {
            break leader;
        }
    };
    assert_eq!((seen.identity.as_str(), seen.term), ("alpha", first.term()));

    // Crashed (never renewed, forgotten): replaced only after its lease, in a new term.
    let crashed_term = first.term();
    std::mem::forget(first);
    let next = lockers[0].election("scheduler");
    let taken = next.campaign("beta", LONG).await.expect("takes over");
    assert!(taken.term() > crashed_term);
    let seen = loop {
        if let Some(leader) = watch.changed().await
            && leader.identity == "beta"
        {
            break leader;
        }
    };
    assert_eq!(seen.term, taken.term());
    taken.resign().await.unwrap();
    watch.stop().await;
}

/// `run`: the work runs while leading, is stopped when the lead is lost (the row
/// force-released), and runs again after the next campaign.
pub async fn election_run_stops_the_work_on_loss_and_campaigns_again<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let locker = Locker::builder(db.another_pool().await)
        .table(db.table.clone())
        .renew_interval(Duration::from_millis(100))
        .build()
        .unwrap();
    let election = locker.election("relay");
    let starts = AtomicUsize::new(0);
    let operator = db.locker.clone();
    let outcome = election
        .run("relay-1", Duration::from_secs(2), async |leading| {
            match starts.fetch_add(1, Ordering::SeqCst) {
                0 => {
                    // Deposed by an operator: this future is dropped once the engine sees it.
                    assert!(operator.force_release(leading.key()).await?);
                    let reason = leading.lost().await;
                    assert_eq!(reason, LostReason::Deleted);
                    std::future::pending::<()>().await;
                    unreachable!("the work is dropped when the lead is lost")
                }
                _ => Ok::<_, Error>(leading.term()),
            }
        })
        .await
        .expect("led again");
    assert_eq!(starts.load(Ordering::SeqCst), 2);
    assert!(outcome > 0);
    assert_eq!(
        election.leader().await.unwrap(),
        None,
        "resigned after the work"
    );
}

/// How long the several-key case's eight tasks take pairs.
const MULTI_KEY_RUN: Duration = Duration::from_secs(10);

/// Eight tasks taking random pairs of four keys in random order for 10 s: no deadlock,
/// never a key held twice, exact counts; a refused set holds nothing.
pub async fn multi_key_locks_are_all_or_nothing<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let lockers = lockers(&db, 4).await;
    let keys = ["acct:1", "acct:2", "acct:3", "acct:4"];

    // All or nothing: with acct:2 held, {acct:1, acct:2} is refused and acct:1 stays free.
    let held = db
        .locker
        .try_acquire("acct:2", LONG)
        .await
        .unwrap()
        .unwrap();
    let refused = lockers[0]
        .try_acquire_all(&["acct:2", "acct:1"], LONG)
        .await
        .unwrap();
    assert!(refused.is_none());
    assert_eq!(
        db.plain.row_count().await,
        1,
        "nothing of the refused set is held"
    );
    held.release().await.unwrap();

    let in_use: Arc<Vec<AtomicBool>> =
        Arc::new(keys.iter().map(|_| AtomicBool::new(false)).collect());
    let taken: Arc<Vec<AtomicUsize>> = Arc::new(keys.iter().map(|_| AtomicUsize::new(0)).collect());
    let completed = Arc::new(AtomicUsize::new(0));
    let mut tasks = JoinSet::new();
    let start = Arc::new(Barrier::new(8));
    let until = tokio::time::Instant::now() + MULTI_KEY_RUN;
    for task in 0..8 {
        let locker = lockers[task % lockers.len()].clone();
        let (in_use, taken, start) = (Arc::clone(&in_use), Arc::clone(&taken), Arc::clone(&start));
        let completed = Arc::clone(&completed);
        tasks.spawn(async move {
            start.wait().await;
            while tokio::time::Instant::now() < until {
                let first = fastrand::usize(..keys.len());
                let second = (first + 1 + fastrand::usize(..keys.len() - 1)) % keys.len();
                let both = locker
                    .acquire_all(&[keys[first], keys[second]], LONG, PATIENCE)
                    .await
                    .expect("no deadlock: both keys within the patience");
                for index in [first, second] {
                    assert!(
                        !in_use[index].swap(true, Ordering::SeqCst),
                        "{} held twice",
                        keys[index]
                    );
                    assert!(both.fencing_token(keys[index]).is_some());
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
                for index in [first, second] {
                    in_use[index].store(false, Ordering::SeqCst);
                    taken[index].fetch_add(1, Ordering::SeqCst);
                }
                both.release().await.expect("released while held");
                completed.fetch_add(1, Ordering::SeqCst);
            }
        });
    }
    while let Some(task) = tasks.join_next().await {
        task.expect("multi-key task");
    }
    let total: usize = taken.iter().map(|count| count.load(Ordering::SeqCst)).sum();
    let completed = completed.load(Ordering::SeqCst);
    assert_eq!(total, 2 * completed, "every pair counted both its keys");
    assert!(
        completed >= 8,
        "only {completed} pairs in {MULTI_KEY_RUN:?}"
    );
    assert_eq!(db.plain.row_count().await, 0);
}

/// Acquisitions of every primitive cancelled at random points leave no row behind once
/// their background clean-ups ran.
pub async fn cancelled_primitives_leave_no_rows<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let locker = lockers(&db, 1).await.remove(0);
    // Something to wait for: every primitive's wait is cut short by its timeout.
    let permit = locker
        .semaphore("s", 1)
        .try_acquire(LONG)
        .await
        .unwrap()
        .unwrap();
    let mut cut = 0;
    for round in 0..40u64 {
        let after = Duration::from_micros(fastrand::u64(0..4_000));
        let locker = locker.clone();
        let attempt = async move {
            match round % 5 {
                0 => drop(locker.semaphore("s", 1).acquire(LONG, PATIENCE).await),
                1 => drop(locker.semaphore("t", 2).try_acquire(LONG).await),
                2 => drop(locker.rw_lock("rw").write(LONG, PATIENCE).await),
                3 => drop(locker.try_acquire_all(&["m:1", "m:2"], LONG).await),
                _ => drop(locker.election("e").campaign("me", LONG).await),
            }
        };
        if tokio::time::timeout(after, attempt).await.is_err() {
            cut += 1;
        }
    }
    assert!(cut > 0, "some attempts were cut mid-way");
    permit.release().await.unwrap();
    wait_until(
        "every row of a cancelled or dropped acquisition is gone",
        PATIENCE,
        async || db.plain.row_count().await == 0,
    )
    .await;
}

/// PostgreSQL: a semaphore's waiter and a waiting writer of another Locker, whose pauses
/// between attempts are 30 s and more (longer than the test waits), get in because the
/// release elsewhere wakes them through their Locker's listener (its count says so).
/// Elsewhere waiters poll, as the other cases show.
pub async fn primitives_hear_releases_elsewhere<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    if !db.hears_releases().await {
        return;
    }
    let sleepy = Locker::builder(DB::connect(&db.location, POOL).await)
        .table(db.table.clone())
        .auto_renew(false)
        .retry(RetryPolicy {
            initial: Duration::from_secs(30),
            max: Duration::from_secs(60),
        })
        .build()
        .expect("valid options");
    // The listener is up before the waiter starts: one that comes up while the waiter
    // sleeps wakes every waiter to look (releases may have gone unheard), and that look
    // could land just after the release below and take the permit without a wake-up
    // (seen once in CI: 2 attempts, 0 wake-ups).
    super::wakeups::start_listener(&db, &sleepy, "wake-warm-up").await;

    let held = db
        .locker
        .semaphore("wake", 1)
        .try_acquire(LONG)
        .await
        .unwrap()
        .unwrap();
    let before = sleepy.stats().wakeups;
    let semaphore = sleepy.semaphore("wake", 1);
    let waiter = tokio::spawn(async move { semaphore.acquire(LONG, PATIENCE).await });
    wait_until("the held permit's row is marked", PATIENCE, async || {
        db.plain.marked(held.key()).await && sleepy.listening()
    })
    .await;
    held.release().await.unwrap();
    let permit = waiter
        .await
        .unwrap()
        .expect("woken by the release elsewhere");
    assert!(sleepy.stats().wakeups > before, "{:?}", sleepy.stats());
    permit.release().await.unwrap();

    let read = db
        .locker
        .rw_lock("wake-rw")
        .try_read(LONG)
        .await
        .unwrap()
        .unwrap();
    let before = sleepy.stats().wakeups;
    let lock = sleepy.rw_lock("wake-rw");
    let writer = tokio::spawn(async move { lock.write(LONG, PATIENCE).await });
    wait_until("the reader's row is marked", PATIENCE, async || {
        db.plain.marked(read.key()).await
    })
    .await;
    read.release().await.unwrap();
    let write = writer
        .await
        .unwrap()
        .expect("woken by the reader's release elsewhere");
    assert!(sleepy.stats().wakeups > before, "{:?}", sleepy.stats());
    write.release().await.unwrap();
}
