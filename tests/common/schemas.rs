//! PostgreSQL schemas made for one test (schema-qualified lock tables), dropped with
//! everything in them when the test ends.

use dblock::Postgres;
use sqlx::PgPool;

use super::TestBackend;

/// Schemas of one test, dropped with everything in them when it ends, also after a failed
/// assertion (on a thread and runtime of their own, as `TestDb` drops its tables).
pub struct Schemas {
    location: String,
    pub names: Vec<String>,
}

impl Schemas {
    /// `n` fresh schema names; only the first `created` are created.
    pub async fn new(pool: &PgPool, location: &str, n: usize, created: usize) -> Self {
        let names: Vec<String> = (0..n)
            .map(|_| format!("s_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]))
            .collect();
        for name in &names[..created] {
            sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {name}")))
                .execute(pool)
                .await
                .unwrap();
        }
        Schemas {
            location: location.to_owned(),
            names,
        }
    }
}

impl Drop for Schemas {
    fn drop(&mut self) {
        let location = self.location.clone();
        let names = self.names.join(", ");
        let cleanup = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for cleanup");
            runtime.block_on(async {
                let pool = Postgres::connect(&location, 1).await;
                let drop = format!("DROP SCHEMA IF EXISTS {names} CASCADE");
                if let Err(err) = sqlx::query(sqlx::AssertSqlSafe(drop)).execute(&pool).await {
                    eprintln!("cleanup of schemas {names} failed: {err}");
                }
                pool.close().await;
            });
        });
        let _ = cleanup.join();
    }
}
