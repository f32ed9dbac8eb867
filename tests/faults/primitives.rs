//! Scenarios 9a-9d: the coordination primitives' holders in processes of their own.
//! 9a: a semaphore permit's holder is SIGKILLed; its permit comes back when its lease ends
//! (database clock), not before, and the other permit stays held.
//! 9b: the leader of four candidates is SIGKILLed; another leads once the lease has run
//! out, in a greater term, and its fenced write is applied.
//! 9c: the leader is SIGSTOPped past its lease; another leads; the old leader, thawed,
//! hears `lost()` and its fenced write is refused.
//! 9d: the leader resigns; the waiting candidate of another process leads at once (on
//! PostgreSQL woken by the release's notification, which its wake-up count shows).

use std::time::Duration;

use tokio::time::Instant;

use crate::db::FaultDb;
use crate::holder::{HolderProc, Line, Spec};
use crate::report::{Report, ms, secs};
use crate::{Ctx, HOLDER_START, Res, Selection, eventually, scenario};

pub const PERMIT_KILLED: &str = "9a permit holder SIGKILLed";
pub const LEADER_KILLED: &str = "9b leader SIGKILLed";
pub const LEADER_PAUSED: &str = "9c leader SIGSTOPped";
pub const LEADER_RESIGNS: &str = "9d leader resigns";

/// Long enough that a takeover before its end cannot hide in scheduling noise.
const LEASE: Duration = Duration::from_secs(3);
/// The holders' renewal interval (a third of the lease: `Locker::new`'s default rule).
const INTERVAL: Duration = Duration::from_secs(1);
/// How long candidates campaign.
const CAMPAIGN: Duration = Duration::from_secs(60);
/// A new leader must lead within this much after the old lease's end (database clock).
const TAKEOVER_SLACK: Duration = Duration::from_secs(1);

/// The four scenarios, in order.
pub async fn run_all<DB: FaultDb>(ctx: &mut Ctx<DB>, report: &Report, selection: &Selection<'_>) {
    scenario(ctx, report, selection, PERMIT_KILLED, permit_killed).await;
    scenario(ctx, report, selection, LEADER_KILLED, leader_killed).await;
    scenario(ctx, report, selection, LEADER_PAUSED, leader_paused).await;
    scenario(ctx, report, selection, LEADER_RESIGNS, leader_resigns).await;
}

fn micros(duration: Duration) -> i64 {
    i64::try_from(duration.as_micros()).expect("fits")
}

pub async fn permit_killed<DB: FaultDb>(ctx: &mut Ctx<DB>) -> Res<String> {
    let spec = Spec::new(&ctx.url, "semaphore/2/fault-permits", LEASE);
    let mut killed = HolderProc::spawn(&spec)?;
    let acquired = killed.expect("ACQUIRED", HOLDER_START).await?;
    let killed_owner = acquired.field(1)?.to_owned();
    let mut other = HolderProc::spawn(&spec)?;
    other.expect("ACQUIRED", HOLDER_START).await?;
    let semaphore = ctx.locker.semaphore("fault-permits", 2);
    killed.next_renewal(LEASE).await?;
    ensure!(
        semaphore.try_acquire(LEASE).await?.is_none(),
        "a third holder of two permits"
    );

    killed.next_renewal(LEASE).await?;
    killed.kill();
    let kill_at = Instant::now();
    killed.wait_exit(Duration::from_secs(5)).await?;
    // Nothing renews it any more: this is the lease the database granted last.
    let row = semaphore
        .holders()
        .await?
        .into_iter()
        .find(|row| row.owner == killed_owner)
        .ok_or("the killed holder's permit row is gone")?;

    let permit = semaphore.acquire(LEASE, LEASE * 3).await?;
    let after_kill = kill_at.elapsed();
    let taken = ctx
        .locker
        .holder(permit.key())
        .await?
        .ok_or("the new permit's row")?;
    ensure!(
        permit.key() == row.key,
        "the permit taken is {} while {} was the dead holder's",
        permit.key(),
        row.key
    );
    let after_expiry_us = (taken.acquired_at - row.expires_at)
        .num_microseconds()
        .unwrap_or(i64::MAX);
    ensure!(
        after_expiry_us >= 0,
        "the permit came back {} BEFORE the dead holder's lease ended",
        ms(after_expiry_us)
    );
    // A waiting permit-taker polls (no row of its own to be woken by): its pause is at
    // most the retry policy's longest, 500 ms by default.
    let slack = TAKEOVER_SLACK + Duration::from_millis(500);
    ensure!(
        after_expiry_us <= micros(slack),
        "the permit came back {} after the lease ended (slack {})",
        ms(after_expiry_us),
        secs(slack)
    );
    ensure!(
        semaphore.try_acquire(LEASE).await?.is_none(),
        "the other holder's permit was free while it renews it"
    );
    permit.release().await?;
    other.send("release").await?;
    other.expect("RELEASED ok", LEASE).await?;
    Ok(format!(
        "lease {}; permit back {} after SIGKILL, {} after the DB expiry",
        secs(LEASE),
        secs(after_kill),
        ms(after_expiry_us)
    ))
}

/// Starts the first candidate and waits until it leads; then `more` candidates, waiting.
async fn candidates<DB: FaultDb>(
    ctx: &Ctx<DB>,
    election: &str,
    more: usize,
) -> Res<(HolderProc, Line, Vec<HolderProc>)> {
    DB::reset_resource(&ctx.pool).await?;
    let mut spec = Spec::new(&ctx.url, &format!("election/node-0/{election}"), LEASE);
    spec.wait = CAMPAIGN;
    let mut leader = HolderProc::spawn(&spec)?;
    let led = leader.expect("ACQUIRED", HOLDER_START).await?;
    let mut waiting = Vec::new();
    for number in 1..=more {
        spec.key = format!("election/node-{number}/{election}");
        waiting.push(HolderProc::spawn(&spec)?);
    }
    for candidate in &mut waiting {
        candidate.expect("CLOCK", HOLDER_START).await?;
    }
    Ok((leader, led, waiting))
}

/// The first of `waiting` to lead, within `within`: its index and `ACQUIRED` line.
async fn next_leader(waiting: &mut [HolderProc], within: Duration) -> Res<(usize, Line)> {
    let until = Instant::now() + within;
    loop {
        for (index, candidate) in waiting.iter_mut().enumerate() {
            if let Ok(line) = candidate
                .expect("ACQUIRED", Duration::from_millis(10))
                .await
            {
                return Ok((index, line));
            }
        }
        ensure!(Instant::now() < until, "no candidate led within {within:?}");
    }
}

pub async fn leader_killed<DB: FaultDb>(ctx: &mut Ctx<DB>) -> Res<String> {
    let (mut leader, led, mut waiting) = candidates(ctx, "fault-killed", 3).await?;
    let term = led.int(0)?;
    let election = ctx.locker.election("fault-killed");
    for _ in 0..2 {
        leader.next_renewal(LEASE).await?;
        let now = election.leader().await?.ok_or("nobody leads")?;
        ensure!(
            now.identity == "node-0" && now.term == term,
            "the leader is {now:?} while node-0 leads in term {term}"
        );
    }
    leader.send("write node-0").await?;
    leader.expect("WRITE applied", LEASE).await?;
    leader.next_renewal(LEASE).await?;
    leader.kill();
    let kill_at = Instant::now();
    let expiry = leader.expiry;
    leader.wait_exit(Duration::from_secs(5)).await?;

    let (index, next) = next_leader(&mut waiting, LEASE * 3).await?;
    let after_kill = kill_at.elapsed();
    let next_term = next.int(0)?;
    let led_at = next.int(2)? - micros(LEASE);
    let after_expiry_us = led_at - expiry;
    ensure!(next_term > term, "the term went from {term} to {next_term}");
    ensure!(
        after_expiry_us >= -2_000,
        "a new leader {} BEFORE the dead leader's lease ended",
        ms(after_expiry_us)
    );
    ensure!(
        after_expiry_us <= micros(INTERVAL + TAKEOVER_SLACK),
        "a new leader only {} after the lease ended",
        ms(after_expiry_us)
    );
    let new_leader = &mut waiting[index];
    new_leader.send("write next").await?;
    let written = new_leader.expect("WRITE applied", LEASE).await?;
    let first_write = written.at - kill_at;
    let target = LEASE + INTERVAL + Duration::from_millis(100);
    new_leader.send("release").await?;
    new_leader.expect("RELEASED ok", LEASE).await?;
    Ok(format!(
        "lease {}; next leader {} after SIGKILL, {} after the DB expiry; term {term} -> {next_term}; \
         its first fenced write {} after SIGKILL (target <= lease + interval + 100 ms = {}: {})",
        secs(LEASE),
        secs(after_kill),
        ms(after_expiry_us),
        secs(first_write),
        secs(target),
        if first_write <= target {
            "met"
        } else {
            "missed"
        }
    ))
}

pub async fn leader_paused<DB: FaultDb>(ctx: &mut Ctx<DB>) -> Res<String> {
    let (mut leader, led, mut waiting) = candidates(ctx, "fault-paused", 1).await?;
    let term = led.int(0)?;
    leader.pause_between_renewals(LEASE, INTERVAL).await?;
    let (_, next) = next_leader(&mut waiting, LEASE * 3).await?;
    let next_term = next.int(0)?;
    ensure!(next_term > term, "the term went from {term} to {next_term}");
    let new_leader = &mut waiting[0];
    new_leader.send("write next").await?;
    new_leader.expect("WRITE applied", LEASE).await?;

    leader.resume();
    let lost = leader.expect("LOST", LEASE * 2).await?;
    leader.send("write stale").await?;
    leader.expect("WRITE refused", LEASE).await?;
    new_leader.send("release").await?;
    new_leader.expect("RELEASED ok", LEASE).await?;
    Ok(format!(
        "lease {}; term {term} -> {next_term}; the thawed leader heard {} and its write was refused",
        secs(LEASE),
        lost.text
    ))
}

/// The election of 9d, whose candidates' Lockers on PostgreSQL sleep long between polls
/// (see the holder), so that a prompt handover there is the notification's doing.
pub const WOKEN_ELECTION: &str = "fault-resigns";

pub async fn leader_resigns<DB: FaultDb>(ctx: &mut Ctx<DB>) -> Res<String> {
    let (mut leader, led, mut waiting) = candidates(ctx, WOKEN_ELECTION, 1).await?;
    let term = led.int(0)?;
    // The candidate has lost an attempt and sleeps (its row mark set) before the release,
    // and on PostgreSQL its listener is up: signals, not a pause, since on a busy machine
    // one renewal interval was not always enough for the candidate to get there.
    if DB::LABEL == "postgres" {
        waiting[0].expect("LISTENING", HOLDER_START).await?;
        let pool = sqlx::PgPool::connect(&ctx.url).await?;
        eventually(
            "the candidate marked the leader's row",
            HOLDER_START,
            async || {
                let marked: i64 = sqlx::query_scalar(
                    "SELECT COUNT(*) FROM distributed_lock WHERE lock_key = $1 AND waiters",
                )
                .bind("fault-resigns~leader")
                .fetch_one(&pool)
                .await?;
                Ok(marked == 1)
            },
        )
        .await?;
        pool.close().await;
    }
    leader.next_renewal(LEASE).await?;
    leader.send("release").await?;
    let released = leader.expect("RELEASED ok", LEASE).await?;
    let (_, next) = next_leader(&mut waiting, LEASE * 2).await?;
    let handover = next.at - released.at;
    let wakeups = next.int(3)?;
    ensure!(next.int(0)? > term, "the term did not rise");
    if DB::LABEL == "postgres" {
        ensure!(
            wakeups >= 1,
            "the candidate was not woken by the release's notification (it polled)"
        );
    }
    let new_leader = &mut waiting[0];
    new_leader.send("release").await?;
    new_leader.expect("RELEASED ok", LEASE).await?;
    Ok(format!(
        "handed over {} after the resignation (lease {}); the candidate's wake-ups: {wakeups}",
        ms(i64::try_from(handover.as_micros())?),
        secs(LEASE)
    ))
}
