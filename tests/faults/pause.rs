//! Scenario 2: a holder process is frozen with SIGSTOP past its lease (a long GC pause, a
//! stalled VM). A rival takes over; when the holder thaws, its `lost()` fires, its release
//! reports NotHeld, and its write fenced by the stale token is refused by the resource,
//! while the new holder's write goes through.

use std::time::Duration;

use tokio::time::Instant;

use crate::db::FaultDb;
use crate::holder::{HolderProc, Spec};
use crate::report::{ms, secs};
use crate::{Ctx, HOLDER_START, Res, take_over};

pub const NAME: &str = "2 holder SIGSTOPped past its lease";

const LEASE: Duration = Duration::from_secs(2);
/// How soon after SIGCONT the thawed holder must notice: its watchdog's timer is already
/// overdue, so this is scheduling time only.
const NOTICE: Duration = Duration::from_secs(2);

pub async fn run<DB: FaultDb>(ctx: &mut Ctx<DB>) -> Res<String> {
    let key = "fault:pause";
    DB::reset_resource(&ctx.pool).await?;
    let mut holder = HolderProc::spawn(&Spec::new(&ctx.url, key, LEASE))?;
    let acquired = holder.expect("ACQUIRED", HOLDER_START).await?;
    let old_token = acquired.int(0)?;

    // While it holds the lock, the holder's fenced write goes through.
    holder.send("write holder-before-pause").await?;
    let write = holder.expect("WRITE", LEASE).await?;
    ensure!(
        write.text == "WRITE applied",
        "the live holder's fenced write: {}",
        write.text
    );
    holder.pause_between_renewals(LEASE, LEASE / 3).await?;
    let paused = Instant::now();
    // Whatever renewal was in flight, the database's expiry is no earlier than this.
    let last_expiry = holder.expiry;
    let until = paused + LEASE * 3;
    let (rival, taken, taken_wall) = take_over(&ctx.locker, key, LEASE * 5, until).await?;
    ensure!(
        taken_wall >= last_expiry - 2_000,
        "the rival took over {} before the frozen holder's lease ended",
        ms(taken_wall - last_expiry)
    );
    ensure!(
        rival.fencing_token() > old_token,
        "token went from {old_token} to {}",
        rival.fencing_token()
    );
    ensure!(
        DB::fenced_write(&ctx.pool, "rival", rival.fencing_token()).await?,
        "the new holder's fenced write was refused"
    );

    holder.resume();
    let resumed = Instant::now();
    let lost = holder.expect("LOST", NOTICE).await?;
    let noticed = lost.at - resumed;
    let reason = lost.field(0)?.to_owned();
    ensure!(
        reason == "Expired" || reason == "TakenOver",
        "lost() fired with {reason}"
    );

    holder.send("write holder-after-pause").await?;
    let write = holder.expect("WRITE", NOTICE).await?;
    ensure!(
        write.text == "WRITE refused",
        "the stale holder's fenced write (token {old_token} < {}): {}",
        rival.fencing_token(),
        write.text
    );
    holder.send("release").await?;
    let released = holder.expect("RELEASED", NOTICE).await?;
    ensure!(
        released.text == "RELEASED NotHeld",
        "the stale holder's release: {}",
        released.text
    );
    holder.wait_exit(NOTICE).await?;

    let (value, last_token) = DB::resource(&ctx.pool).await?;
    ensure!(
        value == "rival" && last_token == rival.fencing_token(),
        "resource is ({value}, {last_token}), expected (rival, {})",
        rival.fencing_token()
    );
    let row = ctx
        .locker
        .holder(key)
        .await?
        .ok_or("the rival's row is gone")?;
    ensure!(
        row.owner == rival.owner() && !row.expired,
        "after the thaw the row is {row:?}, not the rival's"
    );
    let new_token = rival.fencing_token();
    rival.release().await?;
    Ok(format!(
        "lease {}; taken over {} after SIGSTOP; lost({reason}) {} after SIGCONT; \
         stale write (token {old_token}) refused, rival's (token {new_token}) applied; \
         release NotHeld",
        secs(LEASE),
        secs(taken - paused),
        secs(noticed),
    ))
}
