//! Scenario 6b: the database answers, but refuses the lease engine its connection: the
//! engine's connection is cut while the login's connection limit is reached by the
//! application's own pool, whose connections are all in use (so the engine cannot take an
//! idle one). The engine renews
//! on a connection of its own, outside the pool, so the lease cannot be renewed: it is
//! lost at its deadline, and the reason says why (`NoConnection`), not `Unreachable`,
//! which would send an operator looking for a network fault. Once the limit allows it,
//! the engine opens its connection and renews again.

use std::time::Duration;

use dblock::{Locker, LostReason};
use sqlx::pool::PoolOptions;
use tokio::time::{Instant, timeout};

use crate::db::FaultDb;
use crate::report::secs;
use crate::{Ctx, NotApplicable, Res, renewed};

pub const NAME: &str = "6b engine refused a connection";

/// The login the application's pool and the engine share, and how many connections the
/// database allows it.
const USER: &str = "dblock_limited";
const POOL: u32 = 2;
/// Renewed every 667 ms.
const LEASE: Duration = Duration::from_secs(2);

pub async fn run<DB: FaultDb>(ctx: &mut Ctx<DB>) -> Res<String> {
    if !ctx.networked() {
        return Err(NotApplicable("SQLite opens a file: there is no connection limit").into());
    }
    // The pool's connections and the engine's own.
    DB::limit_user(&ctx.pool, USER, POOL + 1).await?;
    let url = with_user(&ctx.url, USER)?;
    let pool = PoolOptions::<DB>::new()
        .max_connections(POOL)
        .connect(&url)
        .await?;
    let locker = Locker::builder(pool.clone())
        .table("limited_lock")
        .build()?;
    locker.migrate().await?;
    let guard = locker
        .try_acquire("fault:refused", LEASE)
        .await?
        .ok_or("the key is free")?;
    // The engine has its connection: it renews.
    renewed(&guard, LEASE).await?;

    // The application holds every connection of its pool, the login's limit drops to
    // them, and the engine's connection is cut (a restart, a firewall): the database
    // refuses the new one the engine opens, and the engine cannot take an idle one.
    let mut busy = [pool.acquire().await?, pool.acquire().await?];
    let mut keep = Vec::new();
    for conn in &mut busy {
        keep.push(DB::session_id(conn).await?);
    }
    DB::limit_user(&ctx.pool, USER, POOL).await?;
    let cut_sessions = DB::kill_sessions_except(&ctx.pool, USER, &keep).await?;
    ensure!(cut_sessions >= 1, "no engine connection to cut");
    let cut = Instant::now();
    let reason = timeout(LEASE * 4, guard.lost())
        .await
        .map_err(|_| "the lease was not reported lost")?;
    let lost_after = cut.elapsed();
    ensure!(
        reason == LostReason::NoConnection,
        "lost({reason:?}): the database answered, it only refused the engine a connection"
    );
    // The application gives its connections back: the lost guard's release needs one.
    drop(busy);
    guard.release().await.ok();

    // The limit raised, the engine gets its connection and renews.
    DB::limit_user(&ctx.pool, USER, POOL + 2).await?;
    let again = locker
        .try_acquire("fault:refused-again", LEASE)
        .await?
        .ok_or("the key is free")?;
    let acquired_again = Instant::now();
    let renewed_at = renewed(&again, LEASE).await?;
    ensure!(
        again.lost_reason().is_none(),
        "lost again: {:?}",
        again.lost_reason()
    );
    again.release().await?;
    locker.shutdown().await;
    pool.close().await;
    DB::limit_user(&ctx.pool, USER, 0).await?;
    Ok(format!(
        "engine's connection cut, login at its limit: lease {} lost({reason:?}) {} after the cut; \
         limit raised: renewed {} after the next acquisition",
        secs(LEASE),
        secs(lost_after),
        secs(renewed_at - acquired_again)
    ))
}

/// The suite's URL with `user` as the login.
fn with_user(url: &str, user: &str) -> Res<String> {
    let mut url = url::Url::parse(url)?;
    url.set_username(user).map_err(|()| "a URL with a login")?;
    Ok(url.to_string())
}
