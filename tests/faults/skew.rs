//! Scenario 5: a client whose clock is an hour ahead, and one an hour behind (libfaketime),
//! excludes and is excluded exactly like a client with the right time, because only the
//! database clock decides when a lease ends.

use std::time::Duration;

use tokio::time::Instant;

use crate::db::FaultDb;
use crate::holder::{HolderProc, Spec, libfaketime};
use crate::kill::kill_and_take_over;
use crate::report::{Report, ms, secs};
use crate::{Ctx, HOLDER_START, NotApplicable, Res, Selection, Skipped, required, scenario};

pub const NAME: &str = "5 client clock skew";

/// The cases, in the order they run.
pub const NAMES: [&str; 4] = [
    "5a client clock 1 h ahead",
    "5b client clock 1 h behind",
    "5c job minimum hold, clock 1 h ahead",
    "5d job minimum hold, clock 1 h behind",
];

/// Why the cases cannot run here.
pub const NO_FAKETIME: &str = "libfaketime is not installed (apt-get install faketime)";

const LEASE: Duration = Duration::from_secs(2);
/// How late after the database expiry a waiting client may get the lock (its backoff
/// sleeps up to 500 ms between attempts).
const TAKEOVER_SLACK: Duration = Duration::from_secs(1);

pub async fn run_all<DB: FaultDb>(ctx: &mut Ctx<DB>, report: &Report, selection: &Selection<'_>) {
    for (name, offset, seconds) in [(NAMES[0], "+1h", 3600), (NAMES[1], "-1h", -3600)] {
        scenario(ctx, report, selection, name, async |ctx: &mut Ctx<DB>| {
            skewed(ctx, offset, seconds).await
        })
        .await;
    }
    for (name, offset) in [(NAMES[2], "+1h"), (NAMES[3], "-1h")] {
        scenario(ctx, report, selection, name, async |ctx: &mut Ctx<DB>| {
            skewed_job(ctx, offset).await
        })
        .await;
    }
}

/// A job's `lock_at_least_for` that a skewed client sets.
const MIN_HOLD: Duration = Duration::from_millis(2000);

/// A scheduled job run by a client whose clock is off by an hour keeps the key exactly
/// `lock_at_least_for` after its acquisition by the database clock: an unskewed node
/// skips right after it, and runs once that time is over (not an hour early or late).
async fn skewed_job<DB: FaultDb>(ctx: &mut Ctx<DB>, offset: &'static str) -> Res<String> {
    can_skew(ctx)?;
    let key = format!("fault:job{offset}");
    let mut spec = Spec::new(&ctx.url, &key, Duration::from_secs(30));
    spec.skew = Some(offset);
    spec.job_min_hold = Some(MIN_HOLD);
    let mut job = HolderProc::spawn(&spec)?;
    let clock = job.expect("CLOCK", HOLDER_START).await?;
    let skew_s = (clock.int(0)? - clock.wall) / 1_000_000;
    ensure!(
        (skew_s.abs() - 3600).abs() < 60,
        "the job's clock was {skew_s:+} s off the suite's, expected {offset}: faketime did not apply"
    );
    let acquired = job.expect("ACQUIRED", HOLDER_START).await?;
    let released = job.expect("RELEASED", HOLDER_START).await?;
    ensure!(
        released.text == "RELEASED ok",
        "the skewed job: {}",
        released.text
    );
    // Checked at once, before the process is waited for: the minimum is short.
    let kept = ctx
        .locker
        .holder(&key)
        .await?
        .ok_or("the job's row went at once")?;
    let kept_for = (kept.expires_at - kept.acquired_at)
        .num_microseconds()
        .unwrap_or(0);
    ensure!(
        kept_for == MIN_HOLD.as_micros() as i64,
        "the row is kept {} after its acquisition, expected {}",
        ms(kept_for),
        ms(MIN_HOLD.as_micros() as i64)
    );
    let skipped = ctx
        .locker
        .job(&key)
        .run(async |_| Ok::<_, dblock::Error>(()))
        .await?;
    ensure!(
        skipped.is_none(),
        "an unskewed node ran the job during the skewed one's minimum"
    );
    job.wait_exit(HOLDER_START).await?;
    // The unskewed node runs it as soon as the minimum is over by the database clock.
    let deadline = acquired.at + MIN_HOLD + TAKEOVER_SLACK;
    let ran_at = loop {
        let ran = ctx
            .locker
            .job(&key)
            .run(async |_| Ok::<_, dblock::Error>(()))
            .await?;
        if ran.is_some() {
            break Instant::now();
        }
        ensure!(
            Instant::now() < deadline,
            "the key was still kept {} after the skewed job's acquisition",
            secs(MIN_HOLD + TAKEOVER_SLACK)
        );
        // Polling the key is what this checks (a node's next timer); 20 ms steps.
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    Ok(format!(
        "client clock {skew_s:+} s: kept {} by the database clock; an unskewed node \
         skipped, then ran it {} after the skewed acquisition",
        ms(kept_for),
        ms((ran_at - acquired.at).as_micros() as i64)
    ))
}

async fn skewed<DB: FaultDb>(ctx: &mut Ctx<DB>, offset: &'static str, seconds: i64) -> Res<String> {
    can_skew(ctx)?;
    let key = format!("fault:skew{offset}");

    // As the holder: it keeps the lock against an unskewed rival while it renews, and
    // loses it when its lease ends by the database clock.
    let mut spec = Spec::new(&ctx.url, &key, LEASE);
    spec.skew = Some(offset);
    let held = kill_and_take_over(ctx, &spec).await?;
    let off_by = held.clock_offset_us - seconds * 1_000_000;
    ensure!(
        off_by.abs() < 60_000_000,
        "the holder's clock was {} off the suite's, expected {offset}: faketime did not apply",
        secs(Duration::from_micros(held.clock_offset_us.unsigned_abs()))
    );

    // As the waiter: it gets the lock only when the unskewed holder's lease has ended by
    // the database clock (not an hour early, not an hour late).
    let guard = ctx
        .locker
        .auto_renew(false)
        .try_acquire(&key, LEASE)
        .await?
        .ok_or("key held")?;
    let expiry = guard.expires_at().timestamp_micros();
    let mut waiter_spec = spec.clone();
    waiter_spec.wait = LEASE * 4;
    let started = Instant::now();
    let mut waiter = HolderProc::spawn(&waiter_spec)?;
    let acquired = waiter
        .expect("ACQUIRED", HOLDER_START + LEASE)
        .await
        .map_err(|e| format!("the skewed waiter: {e}"))?;
    let after_expiry = acquired.wall - expiry;
    ensure!(
        after_expiry >= -2_000,
        "the skewed waiter got the lock {} before the lease ended",
        ms(-after_expiry)
    );
    ensure!(
        after_expiry <= TAKEOVER_SLACK.as_micros() as i64,
        "the skewed waiter got the lock {} after the lease ended",
        ms(after_expiry)
    );
    // The expiry it was told is in database time: a lease from now, not an hour away.
    let told = acquired.int(2)? - acquired.wall;
    ensure!(
        (told - LEASE.as_micros() as i64).abs() < 1_000_000,
        "the skewed waiter's lease ends {} from now, expected about {}",
        ms(told),
        secs(LEASE)
    );
    let released = guard.release().await;
    ensure!(
        matches!(released, Err(dblock::Error::NotHeld { .. })),
        "the expired holder's release returned {released:?}"
    );
    waiter.send("release").await?;
    let line = waiter.expect("RELEASED", HOLDER_START).await?;
    ensure!(
        line.text == "RELEASED ok",
        "the skewed waiter's release: {}",
        line.text
    );
    waiter.wait_exit(HOLDER_START).await?;
    Ok(format!(
        "client clock {:+.1} s: as holder taken over {} after SIGKILL ({} after DB expiry); \
         as waiter got it {} after DB expiry ({} after start)",
        held.clock_offset_us as f64 / 1e6,
        secs(held.after_kill),
        ms(held.after_expiry_us),
        ms(after_expiry),
        secs(started.elapsed())
    ))
}

/// Whether a skewed client can be run against this backend: a server of its own (an
/// embedded database shares the client's clock) and libfaketime.
fn can_skew<DB: FaultDb>(ctx: &Ctx<DB>) -> Res<()> {
    if !ctx.networked() {
        return Err(NotApplicable(
            "embedded: the database clock is each client's own clock, so a skewed client skews it",
        )
        .into());
    }
    if libfaketime().is_none() {
        let reason = NO_FAKETIME.to_owned();
        if required("faketime") {
            return Err(reason.into());
        }
        return Err(Skipped(reason).into());
    }
    Ok(())
}
