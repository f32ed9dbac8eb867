//! SQLite: every write to some tables counted by triggers of the test's own, for cases
//! that assert what did *not* write (a console that only reads, a waiter that marks once).

use super::{TestBackend, TestDb};
use dblock::Sqlite;

/// Installs triggers that count each INSERT, UPDATE and DELETE on `tables` (of the test's
/// database) in `<table>_writes`, the test's lock table's counter; read it with [`writes`].
pub async fn count_writes(db: &TestDb<Sqlite>, tables: &[String]) {
    let t = &db.table;
    let mut counting = vec![
        format!("CREATE TABLE {t}_writes (n INTEGER NOT NULL)"),
        format!("INSERT INTO {t}_writes (n) VALUES (0)"),
    ];
    for table in tables {
        for event in ["INSERT", "UPDATE", "DELETE"] {
            counting.push(format!(
                "CREATE TRIGGER {table}_{event}_counted AFTER {event} ON {table}
                 BEGIN UPDATE {t}_writes SET n = n + 1; END"
            ));
        }
    }
    for sql in counting {
        Sqlite::exec(&db.pool, sql, vec![]).await.unwrap();
    }
}

/// The writes counted since [`count_writes`].
pub async fn writes(db: &TestDb<Sqlite>) -> i64 {
    let sql = format!("SELECT n FROM {}_writes", db.table);
    Sqlite::fetch_i64(&db.pool, sql, vec![])
        .await
        .unwrap()
        .unwrap()
}
