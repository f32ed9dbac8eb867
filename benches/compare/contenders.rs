//! The contenders of the uncontended cycle besides the hand-written ones: dblock itself,
//! dblock's dialect layer alone (to split its overhead), and Redis; `Dblock` is the
//! mutex of the reaper and primitives sections too.

use dblock::internals::LockTable;
use dblock::{Backend, LockId, Locker};
use futures::future::BoxFuture;
use redis::aio::MultiplexedConnection;
use sqlx::Pool;

use crate::handwritten::LEASE;
use crate::measure::{BoxError, Contender, new_owner};

/// dblock on a relaxed lock table (`Durability::Relaxed`, PostgreSQL's `UNLOGGED`): its
/// name in section 1's comparisons and in cells 3.1 and 3.1b.
pub const RELAXED: &str = "dblock relaxed (UNLOGGED)";

/// dblock as an application uses it: `try_acquire` then `release` on the guard.
pub struct Dblock<DB: Backend> {
    pub name: String,
    pub locker: Locker<DB>,
}

impl<DB: Backend> Contender for Dblock<DB> {
    fn name(&self) -> &str {
        &self.name
    }

    fn cycle<'a>(&'a self, _task: usize, key: &'a str) -> BoxFuture<'a, Result<bool, BoxError>> {
        Box::pin(async move {
            match self.locker.try_acquire(key, LEASE).await? {
                Some(guard) => {
                    guard.release().await?;
                    Ok(true)
                }
                None => Ok(false),
            }
        })
    }
}

/// dblock's lock-table access layer called directly, without `Locker`, guard or lease
/// engine. It is public but hidden (`dblock::internals`); the bench uses it only to tell
/// the cost of dblock's statement layer from the cost of the layer above it.
pub struct DialectOnly<DB: Backend> {
    pub name: String,
    table: LockTable<DB>,
}

impl<DB: Backend> DialectOnly<DB> {
    pub fn new(name: &str, pool: Pool<DB>, table: &str) -> Self {
        DialectOnly {
            name: name.to_owned(),
            table: LockTable::new(pool, table),
        }
    }
}

impl<DB: Backend> Contender for DialectOnly<DB> {
    fn name(&self) -> &str {
        &self.name
    }

    fn cycle<'a>(&'a self, _task: usize, key: &'a str) -> BoxFuture<'a, Result<bool, BoxError>> {
        Box::pin(async move {
            let owner = new_owner();
            let Some(won) = self.table.acquire(key, &owner, LEASE).await? else {
                return Ok(false);
            };
            let id = LockId {
                key,
                owner: &owner,
                fencing_token: won.fencing_token,
            };
            Ok(self.table.release(id).await?)
        })
    }
}

/// The usual Redis lock: `SET key owner NX PX lease`, then a Lua script that deletes the
/// key only if it still holds our owner value.
pub struct RedisLock {
    /// One connection per task, as each database task has a pooled connection of its own
    /// (tasks sharing one multiplexed connection would pipeline, which no pool does).
    conns: Vec<MultiplexedConnection>,
    release: redis::Script,
}

const CHECK_AND_DELETE: &str = r#"
if redis.call("GET", KEYS[1]) == ARGV[1] then
    return redis.call("DEL", KEYS[1])
else
    return 0
end"#;

impl RedisLock {
    pub async fn connect(client: &redis::Client, tasks: usize) -> redis::RedisResult<Self> {
        let mut conns = Vec::with_capacity(tasks);
        for _ in 0..tasks {
            conns.push(client.get_multiplexed_async_connection().await?);
        }
        Ok(RedisLock {
            conns,
            release: redis::Script::new(CHECK_AND_DELETE),
        })
    }
}

impl Contender for RedisLock {
    fn name(&self) -> &str {
        "Redis SET NX PX + Lua delete"
    }

    fn cycle<'a>(&'a self, task: usize, key: &'a str) -> BoxFuture<'a, Result<bool, BoxError>> {
        Box::pin(async move {
            let mut conn = self.conns[task % self.conns.len()].clone();
            let owner = new_owner();
            let lease_ms = u64::try_from(LEASE.as_millis()).unwrap_or(u64::MAX);
            let set: Option<String> = redis::cmd("SET")
                .arg(key)
                .arg(&owner)
                .arg("NX")
                .arg("PX")
                .arg(lease_ms)
                .query_async(&mut conn)
                .await?;
            if set.is_none() {
                return Ok(false);
            }
            let deleted: i64 = self
                .release
                .key(key)
                .arg(&owner)
                .invoke_async(&mut conn)
                .await?;
            Ok(deleted == 1)
        })
    }
}
