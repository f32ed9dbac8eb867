//! The closure-taking helpers accept capturing closures inside `tokio::spawn` (whose
//! future must be `Send`, as an axum handler's must), in the forms people write: an async
//! closure borrowing what it captures, an `async move` closure owning it, and a plain
//! closure returning an `async move` block. This file not compiling is the failure (a
//! service's handler hit "implementation of `Send` is not general enough" with
//! `Versioned::update` when it took an `AsyncFnMut`); running it checks the calls did
//! their work. SQLite, in a file of its own: no server needed.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use dblock::sqlx::{Sqlite, SqlitePool};
use dblock::{
    AnyGuard, AnyLeadership, AnyLocker, Decision, Error, LockGuard, Locker, Outcome, RowLockMode,
    RowLocker, Versioned,
};

const LEASE: Duration = Duration::from_secs(30);
const WAIT: Duration = Duration::from_secs(10);

async fn pool() -> (SqlitePool, std::path::PathBuf) {
    let path =
        std::env::temp_dir().join(format!("dblock-send-{}.db", uuid::Uuid::new_v4().simple()));
    let url = format!("sqlite://{}?mode=rwc", path.display());
    let pool = SqlitePool::connect(&url).await.unwrap();
    sqlx::query("CREATE TABLE stock (id INTEGER PRIMARY KEY, units INTEGER, version INTEGER)")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO stock VALUES (1, 100, 0)")
        .execute(&pool)
        .await
        .unwrap();
    (pool, path)
}

fn remove(path: &std::path::Path) {
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}

async fn units(pool: &SqlitePool) -> i64 {
    sqlx::query_scalar("SELECT units FROM stock WHERE id = 1")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versioned_update_in_spawned_tasks() {
    let (pool, path) = pool().await;
    let versioned: Versioned<Sqlite> = Versioned::builder(pool.clone(), "stock", "units")
        .build()
        .unwrap();
    let calls = std::sync::Arc::new(AtomicU32::new(0));

    // An async closure borrowing its captures (a quantity, a name, a counter).
    let (v, qty, name, counter) = (versioned.clone(), 3_i64, String::from("a"), calls.clone());
    let borrowing = tokio::spawn(async move {
        v.update(&1_i64, async |stock: i64| {
            counter.fetch_add(1, Ordering::SeqCst);
            if stock >= qty && !name.is_empty() {
                Decision::Write(stock - qty)
            } else {
                Decision::Refuse(format!("{name}: only {stock}"))
            }
        })
        .await
    });
    // An `async move` closure owning its captures.
    let (v, qty, name) = (versioned.clone(), 2_i64, String::from("b"));
    let owning = tokio::spawn(async move {
        v.update(&1_i64, async move |stock: i64| {
            if stock >= qty {
                Decision::Write(stock - qty)
            } else {
                Decision::Refuse(name.clone())
            }
        })
        .await
    });
    // A closure returning an `async move` block.
    let (v, qty, name) = (versioned.clone(), 1_i64, String::from("c"));
    let returning = tokio::spawn(async move {
        v.update(&1_i64, |stock: i64| {
            let name = name.clone();
            async move {
                if stock >= qty {
                    Decision::Write(stock - qty)
                } else {
                    Decision::Refuse(name)
                }
            }
        })
        .await
    });
    for task in [borrowing, owning, returning] {
        let outcome: Result<Outcome<i64, String>, Error> = task.await.unwrap();
        assert!(
            matches!(outcome, Ok(Outcome::Written { .. })),
            "{outcome:?}"
        );
    }
    assert_eq!(units(&pool).await, 100 - 3 - 2 - 1);
    assert!(calls.load(Ordering::SeqCst) >= 1);
    pool.close().await;
    remove(&path);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_helpers_in_spawned_tasks() {
    let (pool, path) = pool().await;
    let locker = Locker::new(pool.clone());
    locker.migrate().await.unwrap();
    let rows = RowLocker::new(pool.clone(), "stock", "id").unwrap();
    let runs = std::sync::Arc::new(AtomicU32::new(0));

    let (l, name, counter) = (locker.clone(), String::from("with_lock"), runs.clone());
    let with_lock = tokio::spawn(async move {
        l.with_lock("k1", LEASE, WAIT, async |guard: &LockGuard<Sqlite>| {
            counter.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>(format!("{name} {}", guard.key()))
        })
        .await
    });
    let (l, name) = (locker.clone(), String::from("try_with_lock"));
    let try_with_lock = tokio::spawn(async move {
        l.try_with_lock("k2", LEASE, async move |_guard: &LockGuard<Sqlite>| {
            Ok::<_, Error>(name)
        })
        .await
    });
    let (l, name) = (locker.clone(), String::from("job"));
    let job = tokio::spawn(async move {
        l.job("k3")
            .run(|_guard: &LockGuard<Sqlite>| async move { Ok::<_, Error>(name) })
            .await
    });
    let (r, qty, counter) = (rows.clone(), 5_i64, runs.clone());
    let row_lock = tokio::spawn(async move {
        r.lock(&[1_i64], RowLockMode::Wait, async |tx, locked| {
            counter.fetch_add(1, Ordering::SeqCst);
            sqlx::query("UPDATE stock SET units = units - ? WHERE id = ?")
                .bind(qty)
                .bind(locked[0])
                .execute(&mut **tx)
                .await
                .map_err(Error::from)?;
            Ok::<_, Error>(locked.len())
        })
        .await
    });
    assert_eq!(with_lock.await.unwrap().unwrap(), "with_lock k1");
    assert_eq!(
        try_with_lock.await.unwrap().unwrap().as_deref(),
        Some("try_with_lock")
    );
    assert_eq!(job.await.unwrap().unwrap().as_deref(), Some("job"));
    assert_eq!(row_lock.await.unwrap().unwrap(), 1);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(units(&pool).await, 95);
    locker.shutdown().await;
    pool.close().await;
    remove(&path);
}

/// `Election::run` in spawned tasks: a borrowing async closure (called once per term, so
/// it is cloned for each) and an `async move` one, each capturing a name and a counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_run_in_spawned_tasks() {
    let (pool, path) = pool().await;
    let locker = Locker::new(pool.clone());
    locker.migrate().await.unwrap();
    let terms = std::sync::Arc::new(AtomicU32::new(0));

    let (l, name, counter) = (locker.clone(), String::from("relay"), terms.clone());
    let borrowing = tokio::spawn(async move {
        l.election("e1")
            .run("node-1", LEASE, async |leading| {
                counter.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Error>(format!("{name} {}", leading.term() > 0))
            })
            .await
    });
    let (l, name, counter) = (locker.clone(), String::from("sweeper"), terms.clone());
    let owning = tokio::spawn(async move {
        l.election("e2")
            .run("node-2", LEASE, async move |_leading| {
                counter.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Error>(name)
            })
            .await
    });
    assert_eq!(borrowing.await.unwrap().unwrap(), "relay true");
    assert_eq!(owning.await.unwrap().unwrap(), "sweeper");
    assert_eq!(terms.load(Ordering::SeqCst), 2);
    locker.shutdown().await;
    pool.close().await;
    remove(&path);
}

/// `AnyLocker`'s `with_lock`, `try_with_lock` and `job(..).run` in spawned tasks, their
/// work taking the `&AnyGuard`: borrowing, `async move`, and returning an `async move`
/// block.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_locker_helpers_in_spawned_tasks() {
    let (pool, path) = pool().await;
    pool.close().await;
    let locker = AnyLocker::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    locker.migrate().await.unwrap();
    let runs = std::sync::Arc::new(AtomicU32::new(0));

    let (l, name, counter) = (locker.clone(), String::from("with_lock"), runs.clone());
    let with_lock = tokio::spawn(async move {
        l.with_lock("k1", LEASE, WAIT, async |guard: &AnyGuard| {
            counter.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>(format!("{name} {}", guard.key()))
        })
        .await
    });
    let (l, name) = (locker.clone(), String::from("try_with_lock"));
    let try_with_lock = tokio::spawn(async move {
        l.try_with_lock("k2", LEASE, async move |_guard: &AnyGuard| {
            Ok::<_, Error>(name)
        })
        .await
    });
    let (l, name) = (locker.clone(), String::from("job"));
    let job = tokio::spawn(async move {
        l.job("k3")
            .run(|_guard: &AnyGuard| async move { Ok::<_, Error>(name) })
            .await
    });
    assert_eq!(with_lock.await.unwrap().unwrap(), "with_lock k1");
    assert_eq!(
        try_with_lock.await.unwrap().unwrap().as_deref(),
        Some("try_with_lock")
    );
    assert_eq!(job.await.unwrap().unwrap().as_deref(), Some("job"));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    locker.shutdown().await;
    remove(&path);
}

/// A schedule in spawned tasks: `run` with a plain closure returning an `async move`
/// block (it spawns the loop itself, so its future must be `Send`), and `run_once` with
/// a borrowing async closure, each capturing a name and a counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedule_in_spawned_tasks() {
    let (pool, path) = pool().await;
    let locker = Locker::new(pool.clone());
    locker.migrate().await.unwrap();
    let runs = std::sync::Arc::new(AtomicU32::new(0));
    let period = Duration::from_secs(3600);

    let (sent, mut ran) = tokio::sync::mpsc::unbounded_channel();
    let (name, counter) = (String::from("hourly"), runs.clone());
    let handle = locker
        .schedule("s1", period)
        .run(move |period| {
            let (name, counter, sent) = (name.clone(), counter.clone(), sent.clone());
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                sent.send(format!("{name} {}", period.number > 0)).ok();
                Ok::<_, Error>(())
            }
        })
        .unwrap();
    let (l, name, counter) = (locker.clone(), String::from("once"), runs.clone());
    let once = tokio::spawn(async move {
        let tick = l
            .schedule("s2", period)
            .run_once(async |period| {
                counter.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Error>(format!("{name} {}", period.fencing_token > 0))
            })
            .await?;
        match tick.turn {
            dblock::Turn::Ran { output, .. } => Ok::<_, Error>(output),
            other => panic!("{other:?}"),
        }
    });
    assert_eq!(ran.recv().await.unwrap(), "hourly true");
    assert_eq!(once.await.unwrap().unwrap(), "once true");
    assert_eq!(handle.stop().await.runs, 1);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    locker.shutdown().await;
    pool.close().await;
    remove(&path);
}

/// `AnyLocker`'s closure-taking primitives in spawned tasks: `AnyElection::run` with a
/// borrowing async closure and an `async move` one taking the `&AnyLeadership`,
/// `AnyElection::spawn` and `AnySchedule::run` with plain closures returning `async move`
/// blocks, and `AnySchedule::run_once` with a borrowing async closure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_locker_primitives_in_spawned_tasks() {
    let (pool, path) = pool().await;
    pool.close().await;
    let locker = AnyLocker::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    locker.migrate().await.unwrap();
    let runs = std::sync::Arc::new(AtomicU32::new(0));
    let period = Duration::from_secs(3600);

    let (l, name, counter) = (locker.clone(), String::from("relay"), runs.clone());
    let borrowing = tokio::spawn(async move {
        l.election("e1")
            .run("node-1", LEASE, async |leading: &AnyLeadership| {
                counter.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Error>(format!("{name} {}", leading.term() > 0))
            })
            .await
    });
    let (l, name) = (locker.clone(), String::from("sweeper"));
    let owning = tokio::spawn(async move {
        l.election("e2")
            .run("node-2", LEASE, async move |_leading: &AnyLeadership| {
                Ok::<_, Error>(name)
            })
            .await
    });
    let (sent, mut led) = tokio::sync::mpsc::unbounded_channel();
    let name = String::from("candidate");
    let candidate = locker
        .election("e3")
        .spawn("node-3", LEASE, move |leading| {
            let (name, sent) = (name.clone(), sent.clone());
            async move {
                sent.send(format!("{name} {}", leading.term() > 0)).ok();
                std::future::pending::<()>().await;
                Ok(())
            }
        })
        .unwrap();
    let (sent, mut ran) = tokio::sync::mpsc::unbounded_channel();
    let (name, counter) = (String::from("hourly"), runs.clone());
    let schedule = locker
        .schedule("s1", period)
        .run(move |period| {
            let (name, counter, sent) = (name.clone(), counter.clone(), sent.clone());
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                sent.send(format!("{name} {}", period.number > 0)).ok();
                Ok::<_, Error>(())
            }
        })
        .unwrap();
    let (l, name, counter) = (locker.clone(), String::from("once"), runs.clone());
    let once = tokio::spawn(async move {
        let tick = l
            .schedule("s2", period)
            .run_once(async |period| {
                counter.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Error>(format!("{name} {}", period.fencing_token > 0))
            })
            .await?;
        match tick.turn {
            dblock::Turn::Ran { output, .. } => Ok::<_, Error>(output),
            other => panic!("{other:?}"),
        }
    });
    assert_eq!(borrowing.await.unwrap().unwrap(), "relay true");
    assert_eq!(owning.await.unwrap().unwrap(), "sweeper");
    assert_eq!(led.recv().await.unwrap(), "candidate true");
    assert_eq!(ran.recv().await.unwrap(), "hourly true");
    assert_eq!(once.await.unwrap().unwrap(), "once true");
    assert_eq!(candidate.stop().await.terms, 1);
    assert_eq!(schedule.stop().await.runs, 1);
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    locker.shutdown().await;
    remove(&path);
}
