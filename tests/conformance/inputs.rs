//! Every bad input gets its typed error before anything is written.

use std::time::Duration;

use dblock::{Error, Locker, LostReason, MAX_LEASE, MAX_WAIT, MIN_LEASE};

use super::{LONG, PATIENCE};
use crate::common::{TestBackend, TestDb, wait_until};

const WAIT: Duration = Duration::from_secs(1);

/// The error names the key (cut to a readable length, with its whole length in bytes).
fn is_invalid_key(result: &dblock::Result<impl std::fmt::Debug>, key: &str) -> bool {
    matches!(result, Err(Error::InvalidKey { key: k, key_bytes, .. })
        if *key_bytes == key.len() && key.starts_with(k.trim_end_matches('…')) && k.len() <= 67)
}

fn is_invalid_duration(result: &dblock::Result<impl std::fmt::Debug>, what: &str) -> bool {
    matches!(result, Err(Error::InvalidDuration { what: w, .. }) if *w == what)
}

pub async fn bad_inputs_are_rejected_before_writing<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let locker = &db.locker;
    let mut ran = false;

    let long_key = "k".repeat(129);
    // 33 four-byte characters: 33 characters but 132 bytes.
    let long_in_bytes = "🔒".repeat(33);
    for key in ["", long_key.as_str(), long_in_bytes.as_str(), "a\0b", "\0"] {
        assert!(
            is_invalid_key(&locker.try_acquire(key, LONG).await, key),
            "{key:?}"
        );
        assert!(is_invalid_key(&locker.acquire(key, LONG, WAIT).await, key));
        let with = locker
            .with_lock(key, LONG, WAIT, async |_| {
                ran = true;
                Ok::<_, Error>(())
            })
            .await;
        assert!(is_invalid_key(&with, key), "{key:?}");
        assert!(is_invalid_key(&locker.holder(key).await, key), "{key:?}");
    }

    let below_min = MIN_LEASE - Duration::from_nanos(1);
    let above_max = MAX_LEASE + Duration::from_nanos(1);
    for lease in [Duration::ZERO, below_min, above_max, MAX_LEASE * 2] {
        let tried = locker.try_acquire("k", lease).await;
        assert!(is_invalid_duration(&tried, "lease"), "{lease:?}: {tried:?}");
        let waited = locker.acquire("k", lease, WAIT).await;
        assert!(
            is_invalid_duration(&waited, "lease"),
            "{lease:?}: {waited:?}"
        );
        let with = locker
            .with_lock("k", lease, WAIT, async |_| {
                ran = true;
                Ok::<_, Error>(())
            })
            .await;
        assert!(is_invalid_duration(&with, "lease"), "{lease:?}: {with:?}");
    }

    for wait in [MAX_WAIT + Duration::from_nanos(1), MAX_WAIT * 2] {
        let waited = locker.acquire("k", LONG, wait).await;
        assert!(is_invalid_duration(&waited, "wait"), "{wait:?}: {waited:?}");
        let with = locker
            .with_lock("k", LONG, wait, async |_| {
                ran = true;
                Ok::<_, Error>(())
            })
            .await;
        assert!(is_invalid_duration(&with, "wait"), "{wait:?}: {with:?}");
    }

    let too_long = "a".repeat(41);
    for name in [
        "a;drop table x",
        "1abc",
        too_long.as_str(),
        "",
        "a-b",
        "t x",
        "é",
        "x\"y",
    ] {
        let built = Locker::builder(db.pool.clone()).table(name).build();
        assert!(
            matches!(&built, Err(Error::InvalidTableName { name: n, .. }) if n == name),
            "{name:?}: {built:?}"
        );
    }

    // Qualified names: malformed ones everywhere, and on MySQL/MariaDB and SQLite any
    // (a MySQL database is named in the URL; SQLite's attached databases are out of
    // scope); a well-formed one is a PostgreSQL schema's table. Only `build` runs: a
    // refused name never reaches the database.
    let too_long_qualified = format!("{}.{}", "s".repeat(16), "t".repeat(40));
    let qualified_takes = DB::LABEL == "postgres";
    for (name, well_formed) in [
        ("locks.distributed_lock", true),
        ("a.b.c", false),
        (".t", false),
        ("s.", false),
        ("order.t", false),
        ("s.user", false),
        ("pg_catalog.t", false),
        ("s-x.t", false),
        (too_long_qualified.as_str(), false),
    ] {
        let built = Locker::builder(db.pool.clone()).table(name).build();
        if well_formed && qualified_takes {
            assert_eq!(built.expect(name).table(), name);
            continue;
        }
        let Err(Error::InvalidTableName { name: n, reason }) = &built else {
            panic!("{name:?}: {built:?}");
        };
        assert_eq!(n, name);
        if !qualified_takes {
            assert!(reason.contains("schema-qualified"), "{name:?}: {reason}");
        }
    }

    assert!(!ran, "no closure runs for a rejected input");
    assert_eq!(db.plain.row_count().await, 0, "nothing was written");

    // The limits themselves are accepted.
    let at_limits = [
        ("k".repeat(128), LONG, Duration::ZERO),
        ("🔒".repeat(32), MAX_LEASE, MAX_WAIT),
        ("min".to_owned(), MIN_LEASE, WAIT),
    ];
    for (key, lease, wait) in &at_limits {
        let guard = match locker.acquire(key, *lease, *wait).await {
            Ok(guard) => guard,
            // A 1 ms lease is accepted as input, but its answer may well come after its
            // local deadline: then no guard is made of it.
            Err(Error::LockLost {
                reason: LostReason::Expired,
                ..
            }) if *lease == MIN_LEASE => continue,
            Err(err) => panic!("{key}: {err}"),
        };
        assert_eq!(guard.key(), key);
        guard.release().await.ok(); // MIN_LEASE may already have run out: NotHeld is fine.
    }
    let name_at_limit = "a".repeat(40);
    assert!(
        Locker::builder(db.pool.clone())
            .table(name_at_limit)
            .build()
            .is_ok()
    );

    // A guard's extend checks its lease too, and changes nothing when it refuses.
    let guard = locker.try_acquire("k", LONG).await.unwrap().unwrap();
    let expiry = guard.expires_at();
    for lease in [Duration::ZERO, above_max] {
        assert!(is_invalid_duration(&guard.extend(lease).await, "lease"));
    }
    assert_eq!(guard.expires_at(), expiry);
    guard.release().await.unwrap();
    // The 1 ms lease's row, when its answer came too late for a guard, is released in
    // the background: gone soon, not necessarily yet (seen under load).
    let empty = async || db.plain.row_count().await == 0;
    wait_until("every row of the accepted inputs released", PATIENCE, empty).await;
}
