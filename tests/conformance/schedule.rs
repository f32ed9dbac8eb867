//! Schedules (`Locker::schedule`): four nodes whose timers fire 0-300 ms late run each
//! period exactly once, decided by the database clock; overruns and missed periods are
//! counted; bad input is refused before anything is written.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dblock::{Error, Locker, Schedule, ScheduleStats, Turn};
use tokio::time::{sleep, sleep_until, timeout};

use crate::common::{TestBackend, TestDb};

const NODES: usize = 4;
const PERIOD: Duration = Duration::from_secs(1);
/// Periods each node takes part in, after its first wake-up.
const PERIODS: i64 = 6;

/// Four nodes, each a Locker on its own pool, drive the same one-second schedule with
/// `run_once`, each waking a random 0-300 ms after every period's start (a late timer).
/// Every period any node woke in ran exactly once (the work records its period number),
/// unless a node's acquisition of it arrived after its end (`Turn::Late`: on a busy
/// machine every node's first wake-up can land at a period's very end), each node's `runs + skips + missed` covers the periods it spanned, the runs of all
/// nodes add up to the periods, and the schedule left its two rows and no more.
pub async fn schedule_runs_each_period_exactly_once<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let runs: Arc<Mutex<BTreeMap<i64, u32>>> = Arc::default();
    let late: Arc<Mutex<BTreeSet<i64>>> = Arc::default();
    let mut tasks = Vec::new();
    for _ in 0..NODES {
        let locker = Locker::builder(db.another_pool().await)
            .table(&db.table)
            .build()
            .unwrap();
        let schedule = locker.schedule("every-second", PERIOD);
        let (runs, late) = (Arc::clone(&runs), Arc::clone(&late));
        tasks.push(tokio::spawn(async move {
            let spanned = drive(&schedule, &runs, &late).await;
            (spanned, schedule.stats())
        }));
    }
    let (mut woken, mut spanned) = (Vec::new(), 0);
    let mut total = ScheduleStats::default();
    for task in tasks {
        let budget = PERIOD * (PERIODS as u32 + 10);
        let ((first, last), stats) = timeout(budget, task).await.unwrap().unwrap();
        assert_eq!(
            stats.runs + stats.skips + stats.missed,
            (last - first + 1) as u64,
            "a node's periods {first}..={last} are each run, skipped or missed: {stats:?}"
        );
        // No assertion on overruns: a first wake-up just before a period's end, on a
        // busy machine, can make even a 50 ms run end in the next period.
        woken.extend(first..=last);
        spanned += (last - first + 1) as u64;
        total.runs += stats.runs;
        total.skips += stats.skips;
        total.missed += stats.missed;
    }
    woken.sort();
    woken.dedup();
    let runs = runs.lock().unwrap().clone();
    let late = late.lock().unwrap().clone();
    // A period no node ran must be one some node was late for (it ended while that
    // node's acquisition was on its way); none ran twice.
    let expected: BTreeMap<i64, u32> = woken
        .iter()
        .filter(|&p| runs.contains_key(p) || !late.contains(p))
        .map(|&p| (p, 1))
        .collect();
    assert_eq!(runs, expected, "runs per period (late for {late:?})");
    assert!(!runs.is_empty(), "some period ran (late for {late:?})");
    assert_eq!(total.runs, expected.len() as u64, "the nodes' runs add up");
    assert_eq!(
        total.runs + total.skips + total.missed,
        spanned,
        "every node handled every period it spanned once"
    );
    let rows: Vec<String> = db
        .locker
        .list("every-second", 100)
        .await
        .unwrap()
        .into_iter()
        .map(|info| info.key)
        .collect();
    assert_eq!(
        rows,
        ["every-second@0", "every-second@1"],
        "two rows, reused"
    );
}

/// One node: wakes at once, then 0-300 ms after each period's start, for `PERIODS` more
/// periods; each run records its period and takes 50 ms, each late turn its period. The first and last period it
/// woke in.
async fn drive<DB: TestBackend>(
    schedule: &Schedule<DB>,
    runs: &Mutex<BTreeMap<i64, u32>>,
    late: &Mutex<BTreeSet<i64>>,
) -> (i64, i64) {
    let work = async |period: dblock::Period| {
        *runs.lock().unwrap().entry(period.number).or_default() += 1;
        // The job's own work (holding the lock is the point).
        sleep(Duration::from_millis(50)).await;
        Ok::<_, Error>(())
    };
    let note_late = |tick: &dblock::Tick<()>| {
        if matches!(tick.turn, Turn::Late) {
            late.lock().unwrap().insert(tick.period);
        }
    };
    let first = schedule.run_once(work).await.unwrap();
    note_late(&first);
    let (mut last, mut next) = (first.period, first.next_period_at);
    while last < first.period + PERIODS {
        sleep_until(next + Duration::from_millis(fastrand::u64(0..=300))).await;
        let tick = schedule.run_once(work).await.unwrap();
        note_late(&tick);
        if !matches!(tick.turn, Turn::AlreadyHandled) {
            last = tick.period;
        }
        next = tick.next_period_at;
    }
    (first.period, last)
}

/// A run that ends after its period's end counts one overrun, and the node then wakes
/// at once for the current period; a period slept through counts as missed. Bad names,
/// periods and offsets are refused before any statement.
pub async fn schedule_counts_overruns_and_missed_periods<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    // Long enough that a busy machine's delays fit in its quarters.
    const PERIOD: Duration = Duration::from_secs(2);
    let schedule = db.locker.schedule("overrunning", PERIOD);
    let quick = async |_: dblock::Period| Ok::<_, Error>(());
    let first = schedule.run_once(quick).await.unwrap();
    assert!(matches!(first.turn, Turn::Ran { overran: false, .. }));

    // Halfway through the next period, a run of three quarters of a period: it ends a
    // quarter period after the end, and a quarter before its lease (one period) would.
    sleep_until(first.next_period_at + PERIOD / 2).await;
    let slow = async |_: dblock::Period| {
        // Outlasting the period is the point.
        sleep(PERIOD * 3 / 4).await;
        Ok::<_, Error>("done")
    };
    let overran = schedule.run_once(slow).await.unwrap();
    assert_eq!(overran.period, first.period + 1);
    assert!(
        matches!(
            overran.turn,
            Turn::Ran {
                output: "done",
                overran: true
            }
        ),
        "{overran:?}"
    );
    let caught_up = schedule.run_once(quick).await.unwrap();
    assert_eq!(
        caught_up.period,
        first.period + 2,
        "woke in the next period"
    );
    assert!(matches!(caught_up.turn, Turn::Ran { overran: false, .. }));

    // Sleep through one whole period.
    sleep_until(caught_up.next_period_at + PERIOD + PERIOD / 4).await;
    let after_gap = schedule.run_once(quick).await.unwrap();
    assert_eq!(after_gap.period, first.period + 4);
    let stats = schedule.stats();
    let expected = (4, 0, 1, 1);
    assert_eq!(
        (stats.runs, stats.skips, stats.overruns, stats.missed),
        expected,
        "runs, skips, overruns, missed: {stats:?}"
    );

    let attempts = db.locker.stats().attempts;
    let refused = [
        db.locker.schedule("", PERIOD).run_once(quick).await,
        db.locker
            .schedule("too-short", Duration::from_millis(99))
            .run_once(quick)
            .await,
        db.locker
            .schedule("offset", PERIOD)
            .offset(PERIOD)
            .run_once(quick)
            .await,
    ];
    assert!(
        matches!(
            &refused,
            [
                Err(Error::InvalidKey { .. }),
                Err(Error::InvalidDuration { what: "period", .. }),
                Err(Error::InvalidDuration { what: "offset", .. }),
            ]
        ),
        "{refused:?}"
    );
    assert_eq!(db.locker.stats().attempts, attempts, "nothing sent");
}

/// `start_within`: a node that wakes well after its period's start skips it
/// (`StartMissed`, counted as missed, nothing taken) while a schedule without the window
/// catches up and runs it; one that wakes early in its period runs it. The periods are
/// placed with `offset` from the wall clock, which is the database's here (the test
/// servers run on this machine), seconds away from every boundary.
pub async fn a_schedule_can_skip_a_period_whose_start_it_missed<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    const LONG_PERIOD: Duration = Duration::from_secs(20);
    // The offset that makes the current period start `ago` before now.
    let started = |ago: Duration| {
        let now = chrono::Utc::now().timestamp_micros() - ago.as_micros() as i64;
        Duration::from_micros(now.rem_euclid(LONG_PERIOD.as_micros() as i64) as u64)
    };
    let late = started(Duration::from_secs(10));
    let strict = db
        .locker
        .schedule("report-strict", LONG_PERIOD)
        .offset(late)
        .start_within(Duration::from_secs(2));
    let tick = strict.run_once(async |_| Ok::<_, Error>(())).await.unwrap();
    assert!(matches!(tick.turn, Turn::StartMissed), "{:?}", tick.turn);
    assert_eq!((strict.stats().runs, strict.stats().missed), (0, 1));
    assert!(db.locker.holder("report-strict@0").await.unwrap().is_none());
    assert!(db.locker.holder("report-strict@1").await.unwrap().is_none());

    let catching_up = db
        .locker
        .schedule("report-default", LONG_PERIOD)
        .offset(late);
    let tick = catching_up
        .run_once(async |_| Ok::<_, Error>(()))
        .await
        .unwrap();
    assert!(matches!(tick.turn, Turn::Ran { .. }), "{:?}", tick.turn);

    let on_time = db
        .locker
        .schedule("report-on-time", LONG_PERIOD)
        .offset(started(Duration::from_millis(500)))
        .start_within(Duration::from_secs(8));
    let tick = on_time
        .run_once(async |_| Ok::<_, Error>(()))
        .await
        .unwrap();
    assert!(matches!(tick.turn, Turn::Ran { .. }), "{:?}", tick.turn);

    // A window longer than the period is refused before anything is written.
    let wide = db
        .locker
        .schedule("report-wide", LONG_PERIOD)
        .start_within(LONG_PERIOD * 2);
    let refused = wide.run_once(async |_| Ok::<_, Error>(())).await;
    assert!(
        matches!(refused, Err(Error::InvalidDuration { .. })),
        "{refused:?}"
    );
}
