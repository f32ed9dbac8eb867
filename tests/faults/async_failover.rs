//! Scenario 8c: an asynchronous standby misses an acquisition (its WAL stream held in
//! the proxy), then the primary dies and the standby is promoted. What dblock can and
//! cannot promise then, shown as it is: the new primary has no row, a rival acquires,
//! the old holder learns at its next renewal, before its lease would end (`TakenOver`
//! where the rival's row is, `Deleted` where there is none), and `assert_held` refuses its write on the new
//! primary. Fencing tokens go backwards: the new primary continues the sequence from the
//! last value the standby saw logged (PostgreSQL logs a sequence 32 values ahead), so a
//! resource that only compares tokens accepts the stale holder's write. Moving the
//! sequence on after the failover (`setval`) restores their order.

use std::time::Duration;

use dblock::{Error, Locker, LostReason, Postgres};
use sqlx::PgPool;
use tokio::time::{Instant, timeout};

use crate::db::FaultDb;
use crate::failover::{DRAWS, LEASE, direct, draw};
use crate::proxy::Direction;
use crate::replica::{Mode, Pair};
use crate::report::secs;
use crate::{Res, renewed};

/// How far the sequence is moved after the failover (the README's remedy).
const SEQUENCE_JUMP: i64 = 1_000_000;
/// The holder's lease: long enough that the reconnection and renewal after the failover
/// fit in it on a busy machine (with the 3 s lease of the other scenarios, the 1.3-2 s
/// left when the virtual IP moved were not enough under two CPU burners and a disk-heavy
/// neighbour). What the holder learns is judged by the reason: `TakenOver` / `Deleted`
/// can only come from a renewal on the new primary, an ended lease says `Expired` or
/// `Unreachable`; how soon is reported.
const HOLD: Duration = Duration::from_secs(9);

/// The sequence's state as a server sees it: the last value written to its WAL.
async fn logged_token(pool: &PgPool) -> Res<i64> {
    Ok(
        sqlx::query_scalar("SELECT last_value FROM distributed_lock_fencing_seq")
            .fetch_one(pool)
            .await?,
    )
}

pub async fn run() -> Res<String> {
    // One key a rival takes on the new primary before the holder gets there, one nobody.
    let (taken_key, free_key) = ("fault:failover:async-taken", "fault:failover:async-free");
    let mut pair = Pair::start(Mode::Async).await?;
    let locker = pair.locker().await?;
    <Postgres as FaultDb>::reset_resource(locker.pool()).await?;
    let before = draw(&locker, 3).await?;
    pair.caught_up().await?;
    let standby = pair.standby_pool().await?;
    let ahead_before = logged_token(&standby).await? - before;

    // The WAL stream stops reaching the standby; the primary goes on alone.
    pair.link.hold(Direction::Down, true);
    let drawn = draw(&locker, DRAWS).await?;
    let taken = locker
        .try_acquire(taken_key, HOLD)
        .await?
        .ok_or("key held")?;
    let free = locker
        .try_acquire(free_key, HOLD)
        .await?
        .ok_or("key held")?;
    renewed(&taken, HOLD).await?;
    let highest = drawn.max(taken.fencing_token()).max(free.fencing_token());
    let watcher = Locker::new(standby.clone());
    for key in [taken_key, free_key] {
        ensure!(
            watcher.holder(key).await?.is_none(),
            "the standby has the row of {key:?}: the hold missed"
        );
    }
    let standby_logged = logged_token(&standby).await?;
    standby.close().await;

    // The held WAL goes with the connection; then the primary dies and the standby takes
    // over (the virtual IP not moved yet).
    pair.link.cut();
    pair.kill_primary().await?;
    pair.promote().await?;
    let rival = direct(&pair).await?;
    for key in [taken_key, free_key] {
        ensure!(
            rival.holder(key).await?.is_none(),
            "the new primary has a row for {key:?}"
        );
    }
    let next = rival
        .try_acquire(taken_key, LEASE)
        .await?
        .ok_or("the rival was refused on the new primary")?;
    ensure!(
        next.fencing_token() == standby_logged + 1,
        "the new primary's first token is {}, expected {} (the standby's logged value + 1)",
        next.fencing_token(),
        standby_logged + 1
    );
    ensure!(
        next.fencing_token() <= taken.fencing_token(),
        "the new token {} is above the lost {}: tokens did not go back",
        next.fencing_token(),
        taken.fencing_token()
    );

    // The holder's next renewal meets the new primary's rows: the rival's (with a lower
    // token: TakenOver, as for any other owner's row) and none (Deleted).
    pair.move_vip();
    let moved = Instant::now();
    let bound = HOLD;
    let taken_reason = timeout(bound, taken.lost())
        .await
        .map_err(|_| format!("the holder did not learn within {}", secs(bound)))?;
    let free_reason = timeout(bound, free.lost())
        .await
        .map_err(|_| format!("the holder did not learn within {}", secs(bound)))?;
    let learned = moved.elapsed();
    ensure!(
        taken_reason == LostReason::TakenOver && free_reason == LostReason::Deleted,
        "lost({taken_reason:?}) for the key the rival took (expected TakenOver), \
         lost({free_reason:?}) for the free one (expected Deleted)"
    );

    // The stale holder's write on the new primary: assert_held refuses it; a resource
    // that only compares tokens accepts it, since its token is higher than the rival's.
    let mut tx = locker.pool().begin().await?;
    let fenced = taken.assert_held(&mut tx).await;
    drop(tx);
    ensure!(
        matches!(fenced, Err(Error::NotHeld { .. })),
        "assert_held on the new primary returned {fenced:?}, expected NotHeld"
    );
    let pool = locker.pool();
    let rival_write = <Postgres as FaultDb>::fenced_write(pool, "rival", next.fencing_token());
    let stale_write = <Postgres as FaultDb>::fenced_write(pool, "stale", taken.fencing_token());
    ensure!(
        rival_write.await? && stale_write.await?,
        "a token-compare write was refused: tokens did not go back after all?"
    );
    let (first, back) = (
        next.fencing_token(),
        taken.fencing_token() - next.fencing_token(),
    );
    next.release().await?;

    // The remedy the README gives: after promoting an asynchronous standby, move the
    // sequence past anything the old primary can have drawn.
    sqlx::query(
        "SELECT setval('distributed_lock_fencing_seq', last_value + $1) \
           FROM distributed_lock_fencing_seq",
    )
    .bind(SEQUENCE_JUMP)
    .execute(rival.pool())
    .await?;
    let after = rival
        .try_acquire(free_key, LEASE)
        .await?
        .ok_or("free key held")?;
    let jumped = after.fencing_token();
    after.release().await?;
    ensure!(
        jumped > highest,
        "after setval the token is {jumped}, not above the old primary's {highest}"
    );
    Ok(format!(
        "before the hold the standby's sequence was logged {ahead_before} past the last \
         token; held, the primary drew up to {highest} ({} past the standby's {standby_logged}); \
         the new primary's first token {first}, {back} below the lost lock's; holder \
         lost(TakenOver) and lost(Deleted) {} after the VIP moved; assert_held refused, \
         a token-compare write accepted; after setval(+{SEQUENCE_JUMP}) token {jumped}",
        highest - standby_logged,
        secs(learned)
    ))
}
