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

const LEASE: Duration = Duration::from_secs(2);
/// How late after the database expiry a waiting client may get the lock (its backoff
/// sleeps up to 500 ms between attempts).
const TAKEOVER_SLACK: Duration = Duration::from_secs(1);

pub async fn run_all<DB: FaultDb>(ctx: &mut Ctx<DB>, report: &Report, selection: &Selection<'_>) {
    for (name, offset, seconds) in [
        ("5a client clock 1 h ahead", "+1h", 3600),
        ("5b client clock 1 h behind", "-1h", -3600),
    ] {
        scenario(ctx, report, selection, name, async |ctx: &mut Ctx<DB>| {
            skewed(ctx, offset, seconds).await
        })
        .await;
    }
}

async fn skewed<DB: FaultDb>(ctx: &mut Ctx<DB>, offset: &'static str, seconds: i64) -> Res<String> {
    if !ctx.networked() {
        return Err(NotApplicable(
            "embedded: the database clock is each client's own clock, so a skewed client skews it",
        )
        .into());
    }
    if libfaketime().is_none() {
        let reason = "libfaketime is not installed (apt-get install faketime)".to_owned();
        if required("faketime") {
            return Err(reason.into());
        }
        return Err(Skipped(reason).into());
    }
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
