//! Scenario 3: the server is stopped (fast, then by a crash) and started again while locks
//! are held. The rows survive, a rival is refused while the leases are live, the guards
//! keep renewing, and fencing tokens keep rising: a new acquisition of a key after a
//! restart gets a token greater than every token that key had before it (tokens are
//! ordered per key; MariaDB draws them from 16 counters, PostgreSQL from one sequence).

use std::time::Duration;

use tokio::time::Instant;

use crate::db::FaultDb;
use crate::report::secs;
use crate::server::Stop;
use crate::{Ctx, NotApplicable, Res};

pub const NAME: &str = "3 server restart with locks held";

/// Long enough to outlast a restart with room to spare.
const LEASE: Duration = Duration::from_secs(30);

pub async fn run<DB: FaultDb>(ctx: &mut Ctx<DB>) -> Res<String> {
    if ctx.server.is_none() {
        return Err(NotApplicable("embedded: no server to restart").into());
    }
    let locker = ctx.locker.clone();
    let held_keys = ["fault:restart:a", "fault:restart:b"];
    // Taken and given back before every restart, taken again after it.
    let cycled = "fault:restart:c";
    let mut highest = 0;
    for _ in 0..3 {
        let guard = locker.try_acquire(cycled, LEASE).await?.ok_or("key held")?;
        highest = highest.max(guard.fencing_token());
        guard.release().await?;
    }
    let mut guards = Vec::new();
    for key in held_keys {
        guards.push(locker.try_acquire(key, LEASE).await?.ok_or("key held")?);
    }

    let mut figures = Vec::new();
    for how in [Stop::Fast, Stop::Crash] {
        let server = ctx.server.as_mut().expect("checked above");
        let down = Instant::now();
        server.stop(how).await?;
        server.restart().await?;
        let downtime = down.elapsed();

        for guard in &guards {
            let row = locker
                .holder(guard.key())
                .await?
                .ok_or_else(|| format!("{:?}: the row did not survive {how:?}", guard.key()))?;
            ensure!(
                row.owner == guard.owner()
                    && row.fencing_token == guard.fencing_token()
                    && !row.expired,
                "{:?} after {how:?}: {row:?}",
                guard.key()
            );
            ensure!(
                locker.try_acquire(guard.key(), LEASE).await?.is_none(),
                "{:?}: a rival got the lock after {how:?}",
                guard.key()
            );
            ensure!(
                guard.lost_reason().is_none(),
                "{:?} reported lost ({:?}) across {how:?}",
                guard.key(),
                guard.lost_reason()
            );
            // The guard is still usable: its row is ours and live.
            guard.extend(LEASE).await?;
        }
        let again = locker.try_acquire(cycled, LEASE).await?.ok_or("key held")?;
        let token = again.fencing_token();
        ensure!(
            token > highest,
            "after {how:?} {cycled:?} was acquired with token {token}, not above {highest}"
        );
        again.release().await?;
        figures.push(format!(
            "{how:?}: down {}, token {highest} -> {token}",
            secs(downtime)
        ));
        highest = token;
    }

    // The keys held across both restarts go back and forth: their tokens rise too.
    for guard in guards {
        let (key, before) = (guard.key().to_owned(), guard.fencing_token());
        guard.release().await?;
        let again = locker
            .try_acquire(&key, LEASE)
            .await?
            .ok_or("released key held")?;
        ensure!(
            again.fencing_token() > before,
            "{key:?} re-acquired with token {} after {before}",
            again.fencing_token()
        );
        again.release().await?;
    }
    Ok(format!(
        "2 leases held and renewable across both, rival refused after each; {cycled:?} {}",
        figures.join("; ")
    ))
}
