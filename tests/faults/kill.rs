//! Scenario 1: a holder process is SIGKILLed while it holds and renews a lock. A rival
//! gets the lock once the lease the database last granted has run out, and not before.

use std::time::Duration;

use tokio::time::Instant;

use crate::db::FaultDb;
use crate::holder::{HolderProc, Spec};
use crate::report::{ms, secs};
use crate::{Ctx, HOLDER_START, Res, take_over};

pub const NAME: &str = "1 holder SIGKILLed";

/// Long enough that a takeover before its end cannot hide in scheduling noise.
const LEASE: Duration = Duration::from_secs(3);
/// Renewals watched (with the rival refused at each) before the kill: the holder then
/// holds well past its first lease, so it is the watchdog that kept the lock.
const RENEWALS_BEFORE_KILL: usize = 3;
/// The takeover must come within this much after the database expiry.
const TAKEOVER_SLACK: Duration = Duration::from_secs(1);
/// The kill follows a renewal after this much at most (line read, then a signal).
const KILL_LAG: Duration = Duration::from_millis(500);

pub async fn run<DB: FaultDb>(ctx: &mut Ctx<DB>) -> Res<String> {
    let spec = Spec::new(&ctx.url, "fault:kill", LEASE);
    let t = kill_and_take_over(ctx, &spec).await?;
    Ok(format!(
        "lease {}; taken over {} after SIGKILL ({} after DB expiry); token {} -> {}",
        secs(LEASE),
        secs(t.after_kill),
        ms(t.after_expiry_us),
        t.old_token,
        t.new_token
    ))
}

/// What [`kill_and_take_over`] measured.
pub struct Takeover {
    /// From the SIGKILL to the rival's winning `try_acquire`.
    pub after_kill: Duration,
    /// The rival's win minus the expiry of the holder's last renewal (database clock).
    pub after_expiry_us: i64,
    pub old_token: i64,
    pub new_token: i64,
    /// The holder's wall clock minus the suite's when it started (µs).
    pub clock_offset_us: i64,
}

/// Starts a renewing holder process, checks that it excludes the suite's own client
/// across several renewals, SIGKILLs it right after a renewal and measures when the
/// suite's client takes the lock over.
pub async fn kill_and_take_over<DB: FaultDb>(ctx: &Ctx<DB>, spec: &Spec) -> Res<Takeover> {
    let rival = &ctx.locker;
    let key = spec.key.as_str();
    let mut holder = HolderProc::spawn(spec)?;
    let clock = holder.expect("CLOCK", HOLDER_START).await?;
    let clock_offset_us = clock.int(0)? - clock.wall;
    let acquired = holder.expect("ACQUIRED", HOLDER_START).await?;
    let token = acquired.int(0)?;
    let owner = acquired.field(1)?.to_owned();

    for renewal in 1..=RENEWALS_BEFORE_KILL {
        holder.next_renewal(spec.lease).await?;
        ensure!(
            rival.try_acquire(key, spec.lease).await?.is_none(),
            "the rival got the lock while the holder renews it (renewal {renewal})"
        );
        let row = rival.holder(key).await?.ok_or("the holder's row is gone")?;
        ensure!(
            row.owner == owner && row.fencing_token == token && !row.expired,
            "the row is not the holder's live lease: {row:?}"
        );
    }

    // Right after a renewal, so almost the whole lease is left at the kill.
    holder.next_renewal(spec.lease).await?;
    holder.kill();
    let killed = Instant::now();
    let expiry = holder.expiry;
    holder.wait_exit(Duration::from_secs(5)).await?;

    let until = killed + spec.lease + TAKEOVER_SLACK * 2;
    let (guard, taken, taken_wall) = take_over(rival, key, spec.lease, until).await?;
    let after_kill = taken - killed;
    let after_expiry_us = taken_wall - expiry;
    let new_token = guard.fencing_token();
    guard.release().await?;

    // The database decides with its own clock, which is this machine's: the win was
    // seen after the statement ran, so never before the expiry (2 ms for rounding).
    ensure!(
        after_expiry_us >= -2_000,
        "taken over {} BEFORE the lease the database granted ran out",
        ms(after_expiry_us)
    );
    ensure!(
        after_kill + KILL_LAG >= spec.lease,
        "taken over only {} after the kill, lease {}",
        secs(after_kill),
        secs(spec.lease)
    );
    ensure!(
        after_expiry_us <= TAKEOVER_SLACK.as_micros() as i64,
        "taken over {} after the expiry (slack {})",
        ms(after_expiry_us),
        secs(TAKEOVER_SLACK)
    );
    ensure!(
        new_token > token,
        "fencing token went from {token} to {new_token}"
    );
    Ok(Takeover {
        after_kill,
        after_expiry_us,
        old_token: token,
        new_token,
        clock_offset_us,
    })
}
