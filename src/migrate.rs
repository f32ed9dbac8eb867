//! The refinery adapter over a sqlx pool: refinery keeps the history table, checksums and
//! ordering; this file only runs statements and reads the history back.

use refinery::{Migration, Runner};
use refinery_core::traits::r#async::{AsyncMigrate, AsyncQuery, AsyncTransaction};
use sqlx::Pool;
use sqlx::pool::PoolConnection;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::config::{Durability, unqualified};
use crate::dialect::Backend;
use crate::error::{Error, Result};

/// One pooled connection seen through refinery's async traits.
struct Adapter<'c, DB: Backend> {
    conn: &'c mut PoolConnection<DB>,
}

impl<DB: Backend> AsyncTransaction for Adapter<'_, DB> {
    type Error = sqlx::Error;

    async fn execute<'a, T: Iterator<Item = &'a str> + Send + 'a>(
        &'a mut self,
        queries: T,
    ) -> Result<usize, Self::Error> {
        {
            // One simple query: PostgreSQL runs it as one implicit transaction, so a
            // migration and its history row commit together.
            let statements: Vec<&str> = queries
                .map(|q| q.trim().trim_end_matches(';'))
                .filter(|q| !q.is_empty())
                .collect();
            DB::run_script(&mut **self.conn, &statements.join(";\n")).await?;
            Ok(statements.len())
        }
    }
}

impl<DB: Backend> AsyncQuery<Vec<Migration>> for Adapter<'_, DB> {
    async fn query<'a>(&'a mut self, query: &'a str) -> Result<Vec<Migration>, Self::Error> {
        {
            let rows = DB::history(&mut **self.conn, query).await?;
            rows.into_iter()
                .map(|(version, name, applied_on, checksum)| {
                    let decode =
                        |e: Box<dyn std::error::Error + Send + Sync>| sqlx::Error::Decode(e);
                    let applied_on = OffsetDateTime::parse(&applied_on, &Rfc3339)
                        .map_err(|e| decode(e.into()))?;
                    let checksum = checksum.parse::<u64>().map_err(|e| decode(e.into()))?;
                    let version = i32::try_from(version).map_err(|e| decode(e.into()))?;
                    Ok(Migration::applied(version, name, applied_on, checksum))
                })
                .collect()
        }
    }
}

impl<DB: Backend> AsyncMigrate for Adapter<'_, DB> {}

/// One migration script as [`migrate`](crate::Locker::migrate) runs it, for a team that
/// applies schema changes with its own tool
/// ([`Locker::migration_sql`](crate::Locker::migration_sql)).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dblock::Error> {
/// let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// let locker = dblock::Locker::new(pool);
/// let scripts = locker.migration_sql();
/// assert_eq!(scripts[0].name, "V1__distributed_lock.sql");
/// assert!(scripts[0].sql.contains("CREATE TABLE IF NOT EXISTS distributed_lock"));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MigrationScript {
    /// The file name refinery records in `<table>_history` (`V1__distributed_lock.sql`).
    pub name: String,
    /// The SQL, the table name filled in: several statements, run as one script (on
    /// MySQL/MariaDB a trigger's body holds semicolons of its own).
    pub sql: String,
}

/// The scripts for `table`, in order. A relaxed table's create its tables `UNLOGGED` and
/// add the dialect's relaxed-only steps; the durable scripts are the same text as they
/// always were (refinery checksums it). `{name}` is the table without its schema (index
/// names, which PostgreSQL refuses qualified): for an unqualified table it is `{table}`,
/// so those scripts, and their checksums, are what they were before schemas.
pub(crate) fn scripts<DB: Backend>(table: &str, durability: Durability) -> Vec<MigrationScript> {
    let (unlogged, extra): (&str, &[(&str, &str)]) = match durability {
        Durability::Relaxed => ("UNLOGGED ", DB::RELAXED_MIGRATIONS),
        _ => ("", &[]),
    };
    let mut scripts: Vec<MigrationScript> = DB::MIGRATIONS
        .iter()
        .chain(extra)
        .map(|(name, template)| MigrationScript {
            name: (*name).to_owned(),
            sql: template
                .replace("{table}", table)
                .replace("{name}", unqualified(table))
                .replace("{unlogged}", unlogged),
        })
        .collect();
    // In version order, as the history lists them: a relaxed-only step (PostgreSQL's V4)
    // comes before the later steps that every table takes (V5).
    scripts.sort_by_key(|script| version_of(&script.name));
    scripts
}

/// The version in a migration's file name (`V5__write_in_one.sql`: 5).
fn version_of(name: &str) -> u32 {
    let digits = name.trim_start_matches('V');
    let end = digits.find('_').unwrap_or(digits.len());
    digits[..end].parse().unwrap_or(u32::MAX)
}

/// Whether `table`'s history holds `migrations`, each with its checksum, and nothing
/// else but later steps of a newer dblock: then there is nothing to do, and refinery is not
/// run at all. It would only read the same
/// history (under the migration lock) and say so at INFO level through `log`, at every
/// start of every replica of the application. Anything else (no history yet, a step
/// pending, a checksum or a durability that differs, an error reading it) takes the full
/// run, where refinery applies, verifies and reports.
async fn up_to_date<DB: Backend>(
    conn: &mut PoolConnection<DB>,
    table: &str,
    migrations: &[Migration],
) -> bool {
    let query = format!(
        "SELECT version, name, applied_on, checksum FROM {table}_history ORDER BY version ASC"
    );
    let Ok(history) = DB::history(&mut **conn, &query).await else {
        return false;
    };
    let applied: Vec<(i64, Option<u64>)> = history
        .iter()
        .map(|(version, _, _, checksum)| (*version, checksum.parse::<u64>().ok()))
        .collect();
    let ours: Vec<(i64, Option<u64>)> = migrations
        .iter()
        .map(|m| (i64::from(m.version()), Some(m.checksum())))
        .collect();
    // Steps after all of ours were applied by a newer dblock on the same table (a rolling
    // upgrade: old and new replicas start side by side). Steps only add, so this version
    // locks on that table as it is; refinery would refuse the run (a version missing from
    // its list) and fail this replica's start.
    applied.starts_with(&ours)
}

/// Applies the pending migrations for `table`, serialized across processes by the
/// dialect's migration lock; returns how many were applied.
pub(crate) async fn run<DB: Backend>(
    pool: &Pool<DB>,
    table: &str,
    durability: Durability,
) -> Result<usize> {
    let migrations = scripts::<DB>(table, durability)
        .iter()
        .map(|script| Migration::unapplied(&script.name, &script.sql))
        .collect::<Result<Vec<_>, _>>()?;
    let mut runner = Runner::new(&migrations);
    runner.set_migration_table_name(format!("{table}_history"));

    let mut conn = pool.acquire().await?;
    // The run holds a lock (MySQL: a session-scoped GET_LOCK) or an open transaction
    // (PostgreSQL, SQLite): if this future is dropped half-way, the connection must not
    // go back to the pool still holding either; closed, it lets both go.
    conn.close_on_drop();
    if up_to_date(&mut conn, table, &migrations).await {
        return Ok(0);
    }
    DB::lock_migrations(&mut *conn, table).await?;
    // A table made with the other durability is refused before refinery sees its history
    // (where a relaxed table has a step the durable scripts lack).
    let mismatch = match DB::durability_mismatch(&mut *conn, table, durability).await {
        Ok(mismatch) => mismatch,
        Err(err) => {
            DB::unlock_migrations(&mut *conn, table, false).await?;
            return Err(err.into());
        }
    };
    if let Some(why) = mismatch {
        DB::unlock_migrations(&mut *conn, table, false).await?;
        return Err(Error::InvalidConfig(why));
    }
    let outcome = runner.run_async(&mut Adapter { conn: &mut conn }).await;
    DB::unlock_migrations(&mut *conn, table, outcome.is_ok()).await?;
    let report = outcome?;
    let applied = report.applied_migrations().len();
    tracing::info!(
        backend = <DB as sqlx::Database>::NAME,
        table,
        applied,
        "dblock migrations applied"
    );
    Ok(applied)
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::thread::ThreadId;

    use crate::config::Durability;

    /// refinery's `log` records, by the thread they were logged on: a test's runtime is
    /// its own thread (current-thread flavour), so other tests' migrations do not count.
    static RECORDS: Mutex<Vec<(ThreadId, String)>> = Mutex::new(Vec::new());

    struct Counting;

    impl log::Log for Counting {
        fn enabled(&self, _: &log::Metadata<'_>) -> bool {
            true
        }
        fn log(&self, record: &log::Record<'_>) {
            if record.target().starts_with("refinery") {
                let line = format!("{} {}", record.level(), record.args());
                RECORDS
                    .lock()
                    .unwrap()
                    .push((std::thread::current().id(), line));
            }
        }
        fn flush(&self) {}
    }

    fn logged_here() -> Vec<String> {
        let me = std::thread::current().id();
        let records = RECORDS.lock().unwrap();
        records
            .iter()
            .filter(|(at, _)| *at == me)
            .map(|(_, line)| line.clone())
            .collect()
    }

    /// The first migrate() applies the scripts through refinery (which logs them); every
    /// later one, on an up-to-date table, returns 0 without running refinery: nothing is
    /// logged at every start of an application.
    #[tokio::test(flavor = "current_thread")]
    async fn an_up_to_date_table_migrates_silently() {
        let _ = log::set_logger(&Counting);
        log::set_max_level(log::LevelFilter::Trace);
        // A file: a run closes its connection, and an in-memory database would go with it.
        let path = std::env::temp_dir().join(format!("dblock-{}.db", uuid::Uuid::new_v4()));
        let url = format!("sqlite://{}?mode=rwc", path.display());
        let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
        let migrate = || super::run(&pool, "distributed_lock", Durability::Durable);
        assert!(migrate().await.unwrap() > 0);
        let first = logged_here();
        assert!(
            first.iter().any(|line| line.contains("applying migration")),
            "refinery logged {first:?}"
        );
        assert_eq!(migrate().await.unwrap(), 0);
        assert_eq!(logged_here(), first, "an up-to-date table logged again");
        pool.close().await;
        std::fs::remove_file(&path).ok();
    }
}
