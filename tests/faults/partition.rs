//! Group 12 (issue 42): a holder partitioned from its database by a black hole (the proxy
//! swallows every byte both ways and closes no socket: a dead switch, a partitioned zone, a
//! paused VM, as the client sees it).
//!
//! 12a-12d, the margin: many trials, each a holder Locker whose pool and lease engine
//! connection both go through a proxy of its own, holding a key with renewal on, black-holed
//! at a random phase of its renewal cycle. In every trial the holder must learn of the loss
//! (`lost()` returns, or `with_lock` drops its work) strictly before the row's expiry by the
//! database clock, and no rival (a direct pool, trying from just before that expiry) may be
//! granted the key before the holder learned. The trials run 15 at a time so that 50 of
//! them fit in a scenario on a busy two-core machine (25 at once, whose rivals' polls
//! crowd the holders' own wake-ups at the moment that counts, left one trial only 35 ms
//! of a 130 ms margin while the machine also compiled); each row reports the margins'
//! (expiry - learned) minimum and median. The late answers of 12e-12h are in
//! partition_late.rs.
//!
//! The engine's connection goes through the proxy because the engine opens it from the
//! pool (its idle connection, or its connect options: `table::open_lane`), and the pool's
//! URL is the proxy's. The trials check it as well: were it outside the proxy, renewals
//! would go on through the black hole and the holder would never learn.

use std::time::Duration;

use dblock::{DEFAULT_RENEW_INTERVAL, Error, Locker, LostReason};
use futures::StreamExt;
use sqlx::pool::PoolOptions;
use tokio::sync::oneshot;
use tokio::time::{Instant, sleep, timeout};

use crate::db::FaultDb;
use crate::holder::wall_micros;
use crate::proxy::{Proxy, upstream_of, via_proxy};
use crate::report::{Report, ms};
use crate::{Ctx, NotApplicable, Res, Selection, partition_late, renewed, scenario};

/// The group, for rows that stand for all its cases.
pub const NAME: &str = "12 partition";

const MARGIN_NAMES: [&str; 4] = [
    "12a partition margin, 3 s leases, lost()",
    "12b partition margin, 3 s leases, with_lock",
    "12c partition margin, 10 s leases, lost()",
    "12d partition margin, 10 s leases, with_lock",
];

/// Trials per scenario: four scenarios make 200 a backend.
const TRIALS: usize = 50;
/// Trials running at once (each with its own proxy and up to three connections).
const AT_ONCE: usize = 15;
/// How long after its lease a black-holed holder may take to learn before the trial counts
/// as hung (not a timing assertion: the invariants below are).
const LEARN_LIMIT: Duration = Duration::from_secs(5);
/// How long any one step may take before it counts as hung.
const STEP: Duration = Duration::from_secs(20);
/// Set to a number to replay a run's phases (each row prints its seed).
const SEED_ENV: &str = "DBLOCK_PARTITION_SEED";

/// How the holder learns of the loss.
#[derive(Debug, Clone, Copy)]
enum Learn {
    /// A task awaiting `guard.lost()`.
    Lost,
    /// `with_lock`, whose work is dropped (a drop guard in the work stamps the instant).
    WithLock,
}

pub async fn run_all<DB: FaultDb>(ctx: &mut Ctx<DB>, report: &Report, selection: &Selection<'_>) {
    if !ctx.networked() {
        scenario(ctx, report, selection, NAME, async |_: &mut Ctx<DB>| {
            Err(NotApplicable("embedded: no network to partition").into())
        })
        .await;
        return;
    }
    let cases = [
        (Duration::from_secs(3), Learn::Lost),
        (Duration::from_secs(3), Learn::WithLock),
        (Duration::from_secs(10), Learn::Lost),
        (Duration::from_secs(10), Learn::WithLock),
    ];
    for (name, (lease, learn)) in MARGIN_NAMES.into_iter().zip(cases) {
        scenario(ctx, report, selection, name, async |ctx: &mut Ctx<DB>| {
            margin_trials(ctx, lease, learn).await
        })
        .await;
    }
    partition_late::run_all(ctx, report, selection).await;
}

/// One trial's instants, in µs since the epoch. The database's clock and this process's
/// wall clock are the same clock here: the private servers run on this machine, and both
/// PostgreSQL's `clock_timestamp()` and MariaDB's `UTC_TIMESTAMP(6)` read the system clock
/// that `SystemTime::now()` reads.
#[derive(Debug)]
struct Trial {
    /// When the holder learned of the loss.
    learned: i64,
    /// The holder's row's last `expire_time` (database clock).
    expiry: i64,
    /// The rival's row's `acquired_at` (database clock).
    granted: i64,
    reason: LostReason,
}

async fn margin_trials<DB: FaultDb>(
    ctx: &mut Ctx<DB>,
    lease: Duration,
    learn: Learn,
) -> Res<String> {
    // Locker::new's rule: renewed every DEFAULT_RENEW_INTERVAL or a third of the lease.
    let interval = DEFAULT_RENEW_INTERVAL.min(lease / 3);
    let seed = match std::env::var(SEED_ENV) {
        Ok(seed) => seed.parse()?,
        Err(_) => wall_micros().unsigned_abs(),
    };
    let mut random = SplitMix(seed);
    let label = format!("{}s-{learn:?}", lease.as_secs());
    let runs = (0..TRIALS).map(|i| {
        let phase = interval.mul_f64(random.unit());
        let (url, rival) = (ctx.url.clone(), ctx.locker.clone());
        let key = format!("fault:partition:{label}:{i}");
        // Spawned, so each holder's loss reaches its own task as it would an application's.
        tokio::spawn(trial(url, rival, key, lease, learn, phase))
    });
    let outcomes: Vec<_> = futures::stream::iter(runs)
        .buffer_unordered(AT_ONCE)
        .collect()
        .await;
    let mut trials = Vec::with_capacity(TRIALS);
    for outcome in outcomes {
        trials.push(outcome??);
    }
    judge(&trials, seed)
}

/// Checks the two invariants in every trial and sums the figures up.
fn judge(trials: &[Trial], seed: u64) -> Res<String> {
    let mut margins: Vec<i64> = trials.iter().map(|t| t.expiry - t.learned).collect();
    margins.sort_unstable();
    let mut leads: Vec<i64> = trials.iter().map(|t| t.granted - t.learned).collect();
    leads.sort_unstable();
    let unreachable = trials
        .iter()
        .filter(|t| t.reason == LostReason::Unreachable)
        .count();
    let figures = format!(
        "{} trials ({AT_ONCE} at once, seed {seed}): margin (expiry - learned) min {}, \
         median {}; rival grants from {} after learning; {unreachable} Unreachable, {} Expired",
        trials.len(),
        ms(margins[0]),
        ms(margins[margins.len() / 2]),
        ms(leads[0]),
        trials.len() - unreachable
    );
    let late = margins.iter().filter(|m| **m <= 0).count();
    let early = leads.iter().filter(|l| **l <= 0).count();
    ensure!(
        late == 0 && early == 0,
        "{late} of {} trials learned at or after the row's expiry, {early} rivals were granted \
         at or before the holder learned; {figures}",
        trials.len()
    );
    Ok(figures)
}

/// One holder, black-holed `phase` after a renewal landed, and one rival.
async fn trial<DB: FaultDb>(
    url: String,
    rival: Locker<DB>,
    key: String,
    lease: Duration,
    learn: Learn,
    phase: Duration,
) -> Res<Trial> {
    let proxy = Proxy::start(upstream_of(&url)).await;
    let pool = PoolOptions::<DB>::new()
        .max_connections(2)
        .connect(&via_proxy(&url, proxy.addr()))
        .await?;
    let locker = Locker::new(pool);
    let outcome = match learn {
        Learn::Lost => watch_lost(&proxy, &locker, &rival, &key, lease, phase).await,
        Learn::WithLock => work_dropped(&proxy, &locker, &rival, &key, lease, phase).await,
    };
    // Whatever happened, the statements stuck in the black hole fail at once, and the
    // holder's background work ends with its Locker.
    proxy.cut();
    timeout(STEP, locker.shutdown()).await.ok();
    outcome
}

/// The holder watches `lost()`.
async fn watch_lost<DB: FaultDb>(
    proxy: &Proxy,
    locker: &Locker<DB>,
    rival: &Locker<DB>,
    key: &str,
    lease: Duration,
    phase: Duration,
) -> Res<Trial> {
    let guard = locker.try_acquire(key, lease).await?.ok_or("key held")?;
    renewed(&guard, lease).await?;
    sleep(phase).await;
    proxy.set_drop(true);
    let rivalry = tokio::spawn(rival_grant(
        rival.clone(),
        key.to_owned(),
        guard.owner().to_owned(),
        lease,
    ));
    let reason = timeout(lease + LEARN_LIMIT, guard.lost()).await;
    let learned = wall_micros();
    proxy.cut();
    let reason = reason.map_err(|_| format!("{key}: lost() did not return in the black hole"))?;
    let (expiry, granted) = rivalry.await??;
    Ok(Trial {
        learned,
        expiry,
        granted,
        reason,
    })
}

/// The holder works inside `with_lock`; its work is dropped when the lease is lost.
async fn work_dropped<DB: FaultDb>(
    proxy: &Proxy,
    locker: &Locker<DB>,
    rival: &Locker<DB>,
    key: &str,
    lease: Duration,
    phase: Duration,
) -> Res<Trial> {
    let (renewed_send, renewed_recv) = oneshot::channel();
    let (dropped_send, dropped_recv) = oneshot::channel();
    let holder = tokio::spawn({
        let (locker, key) = (locker.clone(), key.to_owned());
        async move {
            locker
                .with_lock(&key, lease, Duration::ZERO, async move |guard| {
                    let _stamp = DropStamp(Some(dropped_send));
                    // The work waits for a renewal (5 ms polls: the library says renewals
                    // only through expires_at) and then forever.
                    let first = guard.expires_at();
                    while guard.expires_at() == first {
                        sleep(Duration::from_millis(5)).await;
                    }
                    renewed_send.send(guard.owner().to_owned()).ok();
                    std::future::pending::<()>().await;
                    Ok::<(), Error>(())
                })
                .await
        }
    });
    let owner = timeout(STEP, renewed_recv)
        .await
        .map_err(|_| format!("{key}: no renewal inside with_lock"))?
        .map_err(|_| format!("{key}: with_lock ended before a renewal"))?;
    sleep(phase).await;
    proxy.set_drop(true);
    let rivalry = tokio::spawn(rival_grant(rival.clone(), key.to_owned(), owner, lease));
    let learned = timeout(lease + LEARN_LIMIT, dropped_recv).await;
    proxy.cut();
    let learned = learned
        .map_err(|_| format!("{key}: the work was not dropped in the black hole"))?
        .map_err(|_| format!("{key}: the work's drop stamp was lost"))?;
    let reason = match timeout(STEP, holder).await? {
        Ok(Err(Error::LockLost { reason, .. })) => reason,
        other => return Err(format!("{key}: with_lock returned {other:?}, not LockLost").into()),
    };
    let (expiry, granted) = rivalry.await??;
    Ok(Trial {
        learned,
        expiry,
        granted,
        reason,
    })
}

/// The rival, on a direct pool: reads the holder's row until its expiry is near (a renewal
/// sent just before the black hole may still land and move it), then tries every 5 ms
/// until it wins. Returns the holder's last expiry and the rival's grant, both from the
/// rows (database clock).
async fn rival_grant<DB: FaultDb>(
    rival: Locker<DB>,
    key: String,
    owner: String,
    lease: Duration,
) -> Res<(i64, i64)> {
    let until = Instant::now() + lease * 2 + LEARN_LIMIT;
    let near = 300_000;
    let expiry = loop {
        let row = rival
            .holder(&key)
            .await?
            .ok_or("the holder's row is gone")?;
        ensure!(
            row.owner == owner,
            "{key}: the row changed hands before the rival tried: {row:?}"
        );
        let expiry = row.expires_at.timestamp_micros();
        let left = expiry - wall_micros();
        if left <= near {
            break expiry;
        }
        sleep(Duration::from_micros(
            (left - near / 2).min(500_000).unsigned_abs(),
        ))
        .await;
    };
    loop {
        if let Some(guard) = rival.try_acquire(&key, lease).await? {
            let row = rival.holder(&key).await?.ok_or("the rival's row is gone")?;
            ensure!(
                row.owner == guard.owner(),
                "{key}: the row is not the rival's: {row:?}"
            );
            guard.release().await?;
            return Ok((expiry, row.acquired_at.timestamp_micros()));
        }
        ensure!(
            Instant::now() < until,
            "{key}: the rival was not granted the key"
        );
        // 10 ms: often enough to be granted within a few ms of the expiry, rarely enough
        // that fifteen rivals do not take the CPU the holders need to learn in time.
        sleep(Duration::from_millis(10)).await;
    }
}

/// Stamps the wall clock into its channel when dropped: when `with_lock` dropped the work.
struct DropStamp(Option<oneshot::Sender<i64>>);

impl Drop for DropStamp {
    fn drop(&mut self) {
        if let Some(send) = self.0.take() {
            send.send(wall_micros()).ok();
        }
    }
}

/// SplitMix64: phases spread evenly and replayable from the printed seed, without a
/// random-number crate.
struct SplitMix(u64);

impl SplitMix {
    /// A number in [0, 1).
    fn unit(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}
