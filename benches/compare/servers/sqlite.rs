//! SQLite: one database file in a directory of its own, which the worker processes of
//! the cells that run on SQLite (3.2, 7.2, 7.3) open each with a pool of its own, as
//! processes of an application sharing the file would; and the statements the bench
//! sends there.

use std::path::{Path, PathBuf};

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode};
use sqlx::{AssertSqlSafe, Sqlite, SqlitePool};

use super::{LockDb, Server, pool_settings};
use crate::measure::new_owner;

/// The directory of the bench's database file, removed (with the file) when dropped.
pub struct Scratch {
    dir: PathBuf,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A fresh database file in a new directory under `under`, and the directory.
pub async fn open(under: &Path) -> Result<(Server<Sqlite>, Scratch), sqlx::Error> {
    let dir = under.join(format!("dblock-bench-{}", &new_owner()[..8]));
    std::fs::create_dir_all(&dir)?;
    let scratch = Scratch { dir };
    let file = scratch.dir.join("locks.sqlite3");
    let url = format!("sqlite://{}", file.display());
    // Only the parent creates the file: a worker that finds none fails rather than
    // working on a file of its own.
    let pool = pool_settings::<Sqlite>()
        .connect_with(options(&url)?.create_if_missing(true))
        .await?;
    let version: String = sqlx::query_scalar("SELECT sqlite_version()")
        .fetch_one(&pool)
        .await?;
    let server = Server {
        pool,
        label: format!("SQLite {version}"),
        url,
    };
    Ok((server, scratch))
}

/// Words for the report: how the file is opened.
pub const SETUP_TEXT: &str = "one database file in WAL mode (readers do not block the \
    writer), sqlx's default busy timeout (5 s), a pool of 8 per process";

/// WAL, as an application sharing a file between processes would open it (the journal
/// mode is the file's: the first connection sets it for all).
fn options(url: &str) -> Result<SqliteConnectOptions, sqlx::Error> {
    Ok(url
        .parse::<SqliteConnectOptions>()?
        .journal_mode(SqliteJournalMode::Wal))
}

impl LockDb for Sqlite {
    async fn drop_lock_table(pool: &SqlitePool, table: &str) -> Result<(), sqlx::Error> {
        // The fencing triggers and the indexes go with their tables.
        let sql = format!(
            "DROP TABLE IF EXISTS {table}; DROP TABLE IF EXISTS {table}_fencing; \
             DROP TABLE IF EXISTS {table}_ticket; DROP TABLE IF EXISTS {table}_history"
        );
        sqlx::raw_sql(AssertSqlSafe(sql)).execute(pool).await?;
        Ok(())
    }

    async fn dedicated_pool(url: &str, max_connections: u32) -> Result<SqlitePool, sqlx::Error> {
        pool_settings::<Sqlite>()
            .max_connections(max_connections)
            .connect_with(options(url)?)
            .await
    }
}
