//! Read-write locks: what a write costs, and how a reader is ordered with a write's
//! transaction (the concurrency invariants are in `primitives.rs`).

use dblock::Stats;

use super::{LONG, PATIENCE};
use crate::common::{TestBackend, TestDb, wait_until};

/// The commits a Locker's lock statements cost: each acquisition attempt is one statement
/// or one transaction (whatever its number of keys), each release statement one, each
/// batched release of the engine one. (The test's Locker does not renew.)
fn commits(stats: Stats) -> u64 {
    stats.attempts + stats.releases + stats.release_batches
}

/// An uncontended write costs two commits, as a mutex's cycle: one transaction takes the
/// writer's and the grant's rows, one statement releases both (four before: each row
/// taken and released on its own). A read stays one row: one commit each way.
pub async fn rw_lock_write_costs_two_commits<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let lock = db.locker.rw_lock("ledger");
    // The first statements learn, once, what the server takes (MariaDB's RETURNING,
    // Galera): not part of a write's cost.
    let first = lock.try_write(LONG).await.unwrap().expect("free");
    first.release().await.unwrap();

    for round in 0..4 {
        let before = db.locker.stats();
        let write = if round % 2 == 0 {
            lock.try_write(LONG).await.unwrap().expect("free")
        } else {
            lock.write(LONG, PATIENCE).await.unwrap()
        };
        let taken = db.locker.stats();
        assert_eq!(
            commits(taken) - commits(before),
            1,
            "round {round}: commits to take a write ({before:?} -> {taken:?})"
        );
        assert_eq!(taken.acquired - before.acquired, 1, "round {round}");
        assert_eq!(
            db.plain.row_count().await,
            2,
            "the writer's row and the grant"
        );
        if DB::LABEL == "postgres" {
            // Seen by the database too: both rows were written by one transaction.
            let sql = format!("SELECT COUNT(DISTINCT xmin::text) FROM {}", db.table);
            let writers = DB::fetch_i64(&db.pool, sql, vec![]).await.unwrap();
            assert_eq!(
                writers,
                Some(1),
                "round {round}: transactions that wrote the rows"
            );
        }

        write.release().await.unwrap();
        let after = db.locker.stats();
        assert_eq!(
            commits(after) - commits(taken),
            1,
            "round {round}: commits to release a write ({taken:?} -> {after:?})"
        );
        assert_eq!(after.released - taken.released, 2, "both rows released");
        assert_eq!(db.plain.row_count().await, 0, "round {round}");
    }

    // A read: its own row, one commit to take it, one to release it.
    let before = db.locker.stats();
    let read = lock.try_read(LONG).await.unwrap().expect("free");
    let taken = db.locker.stats();
    assert_eq!(commits(taken) - commits(before), 1);
    assert_eq!(db.plain.row_count().await, 1);
    read.release().await.unwrap();
    assert_eq!(commits(db.locker.stats()) - commits(taken), 1);
    assert_eq!(db.plain.row_count().await, 0);

    // The one statement still checks each row: a grant deleted behind the write's back is
    // reported (the grant's error first), and the writer's row goes all the same.
    let write = lock.try_write(LONG).await.unwrap().expect("free");
    assert_eq!(db.plain.delete("ledger~write-grant").await, 1);
    let released = write.release().await;
    assert!(
        matches!(&released, Err(dblock::Error::NotHeld { key, .. }) if key == "ledger~write-grant"),
        "{released:?}"
    );
    assert_eq!(db.plain.row_count().await, 0);
}

/// A reader whose acquisition overlaps a write's transaction (both rows taken, not yet
/// committed) is ordered after it: its row commits after the write's, its look for the
/// writer's row finds it, and it steps back. Here a plain client plays the write's
/// transaction as dblock's holds it (on PostgreSQL the grant key's advisory lock, as the
/// grant's insert takes it; on MySQL the grant's token counter row, locked by the insert
/// trigger; on SQLite the database's write lock) and inserts the writer's row; the read
/// runs while it is open. A reader not ordered with it commits its row, misses the
/// uncommitted writer's row and holds beside the write once it commits.
pub async fn rw_lock_read_waits_for_a_write_in_flight<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let table = &db.table;
    let (writer, grant) = ("rw~write", "rw~write-grant");
    let mysql_waiting = format!(
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
         WHERE ID <> CONNECTION_ID() AND INFO LIKE 'UPDATE {table}_fencing%'"
    );
    let (begin, hold_grant, waiting) = match DB::LABEL {
        "postgres" => (
            "BEGIN",
            format!("SELECT pg_advisory_xact_lock(hashtextextended('{table}:{grant}', 0))"),
            Some("SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"),
        ),
        "mysql" => (
            "BEGIN",
            format!(
                "UPDATE {table}_fencing SET last_token = last_token \
                 WHERE bucket = CRC32('{grant}') % 16"
            ),
            // The reader's insert, in its trigger's update of that row.
            Some(mysql_waiting.as_str()),
        ),
        // One writer at a time: the write lock is the transaction's from its start.
        _ => ("BEGIN IMMEDIATE", "SELECT 1".to_owned(), None),
    };
    // One connection: the transaction's statements all run on it.
    let session = DB::connect(&db.location, 1).await;
    let insert = format!(
        "INSERT INTO {table} (lock_key, lock_value, expire_time) VALUES ('{writer}', 'plain-writer', {})",
        DB::now_plus(30)
    );
    <DB as TestBackend>::run_script(&session, format!("{begin}; {hold_grant}; {insert}"))
        .await
        .expect("the plain write's transaction");

    let lock = db.locker.rw_lock("rw");
    let read = tokio::spawn(async move { lock.try_read(LONG).await });
    match waiting {
        // Until the reader waits for the transaction (or, unordered, has already answered).
        Some(waiting) => {
            wait_until("the read waits for the write", PATIENCE, async || {
                let waiting = DB::fetch_i64(&db.pool, waiting.to_owned(), vec![]).await;
                read.is_finished() || waiting.unwrap().unwrap_or(0) > 0
            })
            .await
        }
        // SQLite shows no waiter: give the read the time to reach the database.
        None => tokio::time::sleep(std::time::Duration::from_millis(300)).await,
    }
    <DB as TestBackend>::run_script(&session, "COMMIT".to_owned())
        .await
        .expect("commit the plain write");

    let read = read.await.expect("the read's task").expect("try_read");
    assert!(
        read.is_none(),
        "a read was granted beside a write: {:?}",
        read.map(|read| read.key().to_owned())
    );
    let holder = db
        .locker
        .holder(writer)
        .await
        .unwrap()
        .expect("the writer's row");
    assert_eq!(holder.owner, "plain-writer");
    assert_eq!(db.plain.row_count().await, 1, "the reader's row went again");
    session.close().await;
}
