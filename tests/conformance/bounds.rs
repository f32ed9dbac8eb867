//! Every call bounded in time (issue 42, points 3, 5 and 6): a Locker whose connections
//! are black-holed (the proxy reads and drops every byte, sockets stay open) answers each
//! call within its documented bound; an abandoned attempt queued behind a row lock never
//! commits after its deadline; `PoolTimeout` says whether connections did not answer or
//! were all in use. The black-hole cases need a network: on SQLite they are skipped, said
//! so on stderr.

use std::future::Future;
use std::time::Duration;

use dblock::{Error, Locker, PoolTimeoutCause, WAIT_SLACK};
use sqlx::pool::PoolOptions;
use tokio::time::{Instant, sleep, timeout};

use crate::common::proxy::{Proxy, upstream_of, via_proxy};
use crate::common::{TestBackend, TestDb, wait_until};

/// Far above any bound under test: a pool that waited this long proved nothing.
const POOL_PATIENCE: Duration = Duration::from_secs(300);
/// What a call may take past its bound on a busy machine.
const SLACK: Duration = Duration::from_secs(5);
/// How long `acquire` spends after its wait reading who held the key (acquire.rs).
const HOLDER_READ: Duration = Duration::from_millis(500);

/// `true` (and says why on stderr) when the backend has no network to black-hole.
fn no_network<DB: TestBackend>(case: &str) -> bool {
    let skip = DB::LABEL == "sqlite";
    if skip {
        eprintln!("{case}: skipped on SQLite: no network between dblock and the database");
    }
    skip
}

/// A locker on `db`'s table through `proxy`, on a pool that would wait `POOL_PATIENCE`
/// for a connection by itself; one connection opened (idle) before it is returned.
async fn proxied_locker<DB: TestBackend>(
    db: &TestDb<DB>,
    proxy: &Proxy,
    statement_timeout: Duration,
    max_connections: u32,
) -> Locker<DB> {
    let url = via_proxy(&DB::url(&db.location), proxy.addr());
    let pool = PoolOptions::<DB>::new()
        .max_connections(max_connections)
        .acquire_timeout(POOL_PATIENCE)
        .connect(&url)
        .await
        .expect("connect through the proxy");
    Locker::builder(pool)
        .table(&db.table)
        .statement_timeout(statement_timeout)
        .build()
        .expect("valid options")
}

/// Runs `call`, checks that it answered within `bound` + [`SLACK`], prints what it took.
async fn within<T: std::fmt::Debug>(
    name: &str,
    bound: Duration,
    call: impl Future<Output = T>,
) -> T {
    let started = Instant::now();
    let answer = timeout(bound + SLACK, call).await;
    let took = started.elapsed();
    eprintln!("{name:<28} bound {bound:>8.3?}  took {took:>8.3?}  answer {answer:?}");
    answer.unwrap_or_else(|_| panic!("{name}: no answer within its bound {bound:?} + {SLACK:?}"))
}

pub async fn every_call_returns_within_its_bound_under_a_black_hole<DB: TestBackend>() {
    if no_network::<DB>("every_call_returns_within_its_bound_under_a_black_hole") {
        return;
    }
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let proxy = Proxy::start(upstream_of(&DB::url(&db.location))).await;
    let statement_timeout = Duration::from_secs(2);
    let locker = proxied_locker(&db, &proxy, statement_timeout, 4).await;
    let lease = Duration::from_secs(3);
    let to_release = locker.try_acquire("bh-release", lease).await.unwrap();
    let to_extend = locker.try_acquire("bh-extend", lease).await.unwrap();
    let fenced = locker.try_acquire("bh-fenced", lease).await.unwrap();
    let (to_release, to_extend, fenced) = (
        to_release.expect("a free key"),
        to_extend.expect("a free key"),
        fenced.expect("a free key"),
    );
    // Begun before the black hole: the fence check is what goes unanswered.
    let mut tx = locker.pool().begin().await.expect("begin");

    proxy.set_drop(true);
    let outcome = within("try_acquire", lease, locker.try_acquire("bh-try", lease)).await;
    assert!(outcome.is_err(), "nothing answered, yet: {outcome:?}");

    let wait = Duration::from_secs(2);
    let outcome = within(
        "acquire(wait 2 s)",
        wait + WAIT_SLACK + HOLDER_READ,
        locker.acquire("bh-wait", Duration::from_secs(30), wait),
    )
    .await;
    assert!(
        matches!(outcome, Err(Error::Timeout { .. })),
        "a wait that ran out is a Timeout: {outcome:?}"
    );

    let outcome = within("release", lease, to_release.release()).await;
    assert!(outcome.is_err(), "nothing answered, yet: {outcome:?}");
    let outcome = within("extend", lease, to_extend.extend(lease)).await;
    assert!(outcome.is_err(), "nothing answered, yet: {outcome:?}");
    let outcome = within("list", statement_timeout, locker.list("bh-", 10)).await;
    assert!(outcome.is_err(), "nothing answered, yet: {outcome:?}");
    let outcome = within("holder", statement_timeout, locker.holder("bh-fenced")).await;
    assert!(outcome.is_err(), "nothing answered, yet: {outcome:?}");
    let outcome = within(
        "assert_held",
        statement_timeout,
        fenced.assert_held(&mut tx),
    )
    .await;
    assert!(outcome.is_err(), "nothing answered, yet: {outcome:?}");

    drop(tx);
    drop(fenced);
    proxy.set_drop(false);
    locker.shutdown().await;
}

pub async fn an_abandoned_attempt_never_commits_after_its_deadline<DB: TestBackend>() {
    if no_network::<DB>("an_abandoned_attempt_never_commits_after_its_deadline") {
        return;
    }
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let key = "abandoned-behind-a-row-lock";
    // A lease that runs out while its fenced transaction keeps the row locked: the
    // abandoned attempt below queues behind that lock, and would take the expired row
    // the moment the lock goes.
    let short = Duration::from_millis(500);
    let holder = db.locker.try_acquire(key, short).await.unwrap().unwrap();
    let mut tx = db.pool.begin().await.expect("begin");
    holder
        .assert_held(&mut tx)
        .await
        .expect("held, and its row locked");
    // Kept from sitting idle until the test lets it go: on PostgreSQL `assert_held` bounds
    // its transaction's idle time by the lease's remaining time, and the server would end
    // it (freeing the row) long before the attempt's deadline.
    let (let_go, stop) = tokio::sync::oneshot::channel::<()>();
    let pinger = tokio::spawn(async move {
        let mut stop = stop;
        loop {
            sqlx::Connection::ping(&mut *tx)
                .await
                .expect("ping the fence");
            tokio::select! {
                _ = &mut stop => return drop(tx),
                _ = sleep(Duration::from_millis(20)) => {}
            }
        }
    });
    wait_until(
        "the holder's lease ran out",
        Duration::from_secs(10),
        async || db.plain.is_expired(key).await,
    )
    .await;

    let prefix = format!(
        "abandoned-{}:",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let abandoning = Locker::builder(db.another_pool().await)
        .table(&db.table)
        .owner_prefix(&prefix)
        .build()
        .expect("valid options");
    let lease = Duration::from_secs(2);
    let sent = Instant::now();
    let attempt = {
        let abandoning = abandoning.clone();
        tokio::spawn(async move { abandoning.try_acquire(key, lease).await.map(drop) })
    };
    wait_until(
        "the attempt was sent",
        Duration::from_secs(10),
        async || abandoning.stats().attempts >= 1,
    )
    .await;
    // The caller goes away; its statement stays queued behind the row lock.
    attempt.abort();
    assert!(attempt.await.is_err_and(|err| err.is_cancelled()));

    // The lock goes only after the attempt's deadline (sent + lease) has passed.
    tokio::time::sleep_until(sent + lease + Duration::from_millis(500)).await;
    let_go.send(()).ok();
    pinger.await.expect("the fence's pinger");
    drop(holder);

    // Absence can only be watched for: a late commit comes within milliseconds of the
    // lock going; two seconds is far more.
    let watch_until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < watch_until {
        let row = db.locker.holder(key).await.expect("read the row");
        if let Some(row) = row {
            assert!(
                !row.owner.starts_with(&prefix),
                "the abandoned attempt committed after its deadline: {row:?}"
            );
        }
        sleep(Duration::from_millis(50)).await;
    }
    abandoning.shutdown().await;
}

pub async fn pool_timeouts_say_whether_connections_answered<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    // All in use: both connections of a pool of two held by the caller.
    let pool = PoolOptions::<DB>::new()
        .max_connections(2)
        .acquire_timeout(POOL_PATIENCE)
        .connect(&DB::url(&db.location))
        .await
        .expect("connect");
    let locker = Locker::builder(pool.clone())
        .table(&db.table)
        .statement_timeout(Duration::from_millis(500))
        .build()
        .expect("valid options");
    let held = (pool.acquire().await.unwrap(), pool.acquire().await.unwrap());
    let busy = within(
        "holder, pool in use",
        Duration::from_millis(500),
        locker.holder("k"),
    )
    .await;
    match busy {
        Err(
            ref err @ Error::PoolTimeout {
                cause: PoolTimeoutCause::AllInUse,
                open_connections: 2,
                ..
            },
        ) => assert!(err.to_string().contains("raise max_connections"), "{err}"),
        other => panic!("expected PoolTimeout(AllInUse), got {other:?}"),
    }
    drop(held);

    if no_network::<DB>("pool_timeouts_say_whether_connections_answered (unanswered)") {
        return;
    }
    // Unanswered: the pool's idle connection is black-holed; its ping gets no reply.
    let proxy = Proxy::start(upstream_of(&DB::url(&db.location))).await;
    let locker = proxied_locker(&db, &proxy, Duration::from_millis(500), 2).await;
    proxy.set_drop(true);
    let silent = within(
        "holder, black hole",
        Duration::from_millis(500),
        locker.holder("k"),
    )
    .await;
    match silent {
        Err(
            ref err @ Error::PoolTimeout {
                cause: PoolTimeoutCause::Unanswered,
                ..
            },
        ) => assert!(
            err.to_string().contains("did not answer")
                && !err.to_string().contains("raise max_connections"),
            "{err}"
        ),
        other => panic!("expected PoolTimeout(Unanswered), got {other:?}"),
    }
    proxy.set_drop(false);
}
