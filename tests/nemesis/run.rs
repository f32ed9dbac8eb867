//! One run on one server: set up the tables, start the workers, let the nemesis loose
//! for the run's duration, stop everything, read the history back and judge it.

use std::collections::{BTreeMap, HashMap};
use std::panic::AssertUnwindSafe;
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use dblock::Locker;
use futures::FutureExt;
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use sqlx::Pool;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep_until, timeout};

use crate::Res;
use crate::check::{Findings, check};
use crate::db::{Counter, Entry, Kind, Names, NemesisDb, Sessions};
use crate::tally::Tally;
use crate::worker::{ROLE_ENV, owner_prefix};

/// Worker processes per server.
pub const WORKERS: i32 = 8;
/// The nemesis acts every 150-600 ms.
const ACTION_EVERY_MS: std::ops::RangeInclusive<u64> = 150..=600;
/// A paused worker stays stopped 0.1-2.5 s.
const PAUSE_MS: std::ops::RangeInclusive<u64> = 100..=2500;
/// How long the workers may take to stop once told (each finishes its round).
const DRAIN: Duration = Duration::from_secs(60);
/// The longest a nemesis action's statement may take (it can wait behind a paused
/// worker's transaction, at most a pause long).
const ACTION_LIMIT: Duration = Duration::from_secs(60);

/// What the nemesis does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Action {
    /// SIGSTOP a worker, SIGCONT it 0.1-2.5 s later.
    Pause,
    /// SIGKILL a worker and start it again (a new incarnation).
    Kill,
    /// `force_release` of the guarded and the unfenced key.
    ForceRelease,
    /// `reap_expired`.
    Reap,
    /// End a worker's database sessions (and on PostgreSQL sometimes this run's release
    /// listeners).
    KillSessions,
}

impl Action {
    const ALL: [Action; 5] = [
        Action::Pause,
        Action::Kill,
        Action::ForceRelease,
        Action::Reap,
        Action::KillSessions,
    ];

    /// Drawn from a shuffled bag, so every kind comes within the first few actions and
    /// in these proportions after.
    const BAG: [Action; 8] = [
        Action::Pause,
        Action::Pause,
        Action::Kill,
        Action::ForceRelease,
        Action::ForceRelease,
        Action::Reap,
        Action::KillSessions,
        Action::KillSessions,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Action::Pause => "pause",
            Action::Kill => "kill+restart",
            Action::ForceRelease => "force_release",
            Action::Reap => "reap_expired",
            Action::KillSessions => "session kill",
        }
    }
}

/// What the nemesis did: actions that took effect, and what they touched.
#[derive(Debug, Default)]
pub struct Deeds {
    pub done: BTreeMap<Action, u64>,
    /// Actions whose statement failed (the main process's own session is never killed,
    /// so these should not happen).
    pub errors: Vec<String>,
    pub paused_for: Duration,
    /// Pauses that stopped the guarded key's holder.
    pub holders_paused: u64,
    /// Rows `force_release` deleted: guarded key, unfenced key.
    pub forced: (u64, u64),
    pub reaped: u64,
    pub sessions_killed: u64,
    /// Session kills that found no session to end (the worker had just restarted).
    pub sessions_missed: u64,
    /// Every action with its start on this machine's clock, to set beside the history.
    pub log: Vec<(DateTime<Utc>, String)>,
}

impl Deeds {
    fn note(&mut self, at: DateTime<Utc>, what: String) {
        self.log.push((at, what));
    }
}

/// Everything one run found.
pub struct Outcome {
    pub backend: &'static str,
    pub table: String,
    pub ran: Duration,
    pub tally: Tally,
    pub deeds: Deeds,
    pub findings: BTreeMap<Kind, Findings>,
    pub counters: BTreeMap<Kind, Counter>,
    /// Committed writes per worker (all its incarnations), per kind.
    pub per_worker: BTreeMap<Kind, Vec<usize>>,
    pub acked_missing: Vec<String>,
    pub restarts: u64,
    /// What makes the run fail; empty: it passed.
    pub problems: Vec<String>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn signal(pid: i32, sig: Signal) {
    // A stale pid only yields ESRCH; the pids here are children not yet waited for, so
    // they cannot have been handed to another process.
    let _ = nix::sys::signal::kill(Pid::from_raw(pid), sig);
}

fn random_ms(range: std::ops::RangeInclusive<u64>) -> Duration {
    Duration::from_millis(fastrand::u64(range))
}

/// Which of `procs` holds the guarded key now, by the owner prefix in its row (a live
/// lease only: an expired row's holder is no longer interesting to stop).
async fn holder_of<DB: NemesisDb>(locker: &Locker<DB>, procs: &[Proc]) -> Option<usize> {
    let holder = timeout(Duration::from_secs(5), locker.holder(Kind::Guarded.key()))
        .await
        .ok()?
        .ok()??;
    if holder.expired {
        return None;
    }
    procs.iter().position(|p| {
        holder
            .owner
            .starts_with(&owner_prefix(p.worker, p.incarnation))
    })
}

/// One worker process, as the nemesis sees it.
struct Proc {
    worker: i32,
    incarnation: i32,
    child: Child,
    pid: i32,
    /// Closed to tell the worker to stop.
    stdin: Option<ChildStdin>,
    /// While SIGSTOPped: when to SIGCONT it.
    paused_until: Option<Instant>,
}

/// The run's fixed parts.
struct Setup {
    url: String,
    names: Names,
    /// The `application_name` prefix of this run's sessions.
    app: String,
    tally: Arc<Mutex<Tally>>,
}

impl Setup {
    fn app_of(&self, worker: i32) -> String {
        format!("{}-w{worker}", self.app)
    }

    /// Starts worker `worker`'s incarnation `incarnation` and counts its lines.
    fn spawn(&self, worker: i32, incarnation: i32) -> Res<Proc> {
        let exe = std::env::current_exe()?;
        // Through `setpriv --pdeathsig KILL` (which execs in place, same pid) where it
        // exists: if the test itself dies, a worker it left SIGSTOPped goes too.
        let mut cmd = if std::path::Path::new("/usr/bin/setpriv").exists() {
            let mut cmd = Command::new("/usr/bin/setpriv");
            cmd.args(["--pdeathsig", "KILL", "--"]).arg(exe);
            cmd
        } else {
            Command::new(exe)
        };
        cmd.env(ROLE_ENV, "worker")
            .arg(&self.url)
            .arg(&self.names.lock)
            .arg(worker.to_string())
            .arg(incarnation.to_string())
            .arg(self.app_of(worker))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        let mut child = cmd.spawn()?;
        let pid = i32::try_from(child.id().ok_or("the worker exited at once")?)?;
        let stdin = child.stdin.take().ok_or("worker stdin")?;
        let stdout = child.stdout.take().ok_or("worker stdout")?;
        let tally = Arc::clone(&self.tally);
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                lock(&tally).record(worker, incarnation, &line);
            }
        });
        Ok(Proc {
            worker,
            incarnation,
            child,
            pid,
            stdin: Some(stdin),
            paused_until: None,
        })
    }
}

/// Runs the nemesis on one server for `duration`; the tables are dropped at the end
/// (kept with `DBLOCK_NEMESIS_KEEP` set), also when the run failed or panicked.
pub async fn run<DB: NemesisDb>(url: &str, duration: Duration) -> Res<Outcome> {
    let names = Names::random();
    let app = format!("dblock-{}", names.lock.replace('_', "-"));
    // Room for force_release and reap statements that wait behind a paused worker's
    // transaction while the nemesis goes on.
    let pool = DB::connect(url, &format!("{app}-main"), 8, false).await?;
    let locker = Locker::builder(pool.clone()).table(&names.lock).build()?;
    let setup = Setup {
        url: url.to_owned(),
        names,
        app,
        tally: Arc::default(),
    };
    let outcome = AssertUnwindSafe(async {
        locker.migrate().await?;
        DB::create(&pool, &setup.names).await?;
        go(&setup, &pool, &locker, duration).await
    })
    .catch_unwind()
    .await;
    if std::env::var_os("DBLOCK_NEMESIS_KEEP").is_some() {
        eprintln!(
            "nemesis: {}: tables kept (DBLOCK_NEMESIS_KEEP): {}, {}, {}",
            DB::LABEL,
            setup.names.lock,
            setup.names.counter,
            setup.names.history
        );
    } else if let Err(err) = DB::drop_all(&pool, &setup.names).await {
        eprintln!(
            "nemesis: {}: dropping the tables of {} failed: {err}",
            DB::LABEL,
            setup.names.lock
        );
    }
    locker.shutdown().await;
    pool.close().await;
    match outcome {
        Ok(outcome) => outcome,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

async fn go<DB: NemesisDb>(
    setup: &Setup,
    pool: &Pool<DB>,
    locker: &Locker<DB>,
    duration: Duration,
) -> Res<Outcome> {
    let mut procs = Vec::new();
    for worker in 1..=WORKERS {
        procs.push(setup.spawn(worker, 1)?);
    }
    let deeds = Arc::new(Mutex::new(Deeds::default()));
    let mut problems = Vec::new();
    let mut restarts = 0;
    let mut actions = JoinSet::new();
    let mut bag = Vec::new();
    let started = Instant::now();
    let deadline = started + duration;
    let mut next_action = started + random_ms(ACTION_EVERY_MS);
    loop {
        let next_resume = procs.iter().filter_map(|p| p.paused_until).min();
        let wake = next_resume.map_or(next_action, |r| r.min(next_action));
        sleep_until(wake.min(deadline)).await;
        let now = Instant::now();
        for p in procs.iter_mut() {
            if p.paused_until.is_some_and(|until| until <= now) {
                signal(p.pid, Signal::SIGCONT);
                p.paused_until = None;
            }
        }
        // A worker that ended by itself is a finding; it is started again so the run
        // goes on.
        for p in procs.iter_mut() {
            if let Ok(Some(status)) = p.child.try_wait() {
                problems.push(format!(
                    "worker {}/{} exited by itself ({status})",
                    p.worker, p.incarnation
                ));
                *p = setup.spawn(p.worker, p.incarnation + 1)?;
                restarts += 1;
            }
        }
        while actions.try_join_next().is_some() {}
        if now >= deadline {
            break;
        }
        if now < next_action {
            continue;
        }
        next_action = now + random_ms(ACTION_EVERY_MS);
        if bag.is_empty() {
            bag = Action::BAG.to_vec();
            fastrand::shuffle(&mut bag);
        }
        let action = bag.pop().expect("refilled");
        let victim = fastrand::usize(..procs.len());
        match action {
            Action::Pause => {
                let running: Vec<usize> = (0..procs.len())
                    .filter(|&i| procs[i].paused_until.is_none())
                    .collect();
                // Half the pauses go to the holder of the guarded key (a random worker
                // holds it one time in eight): those are the ones that test the fence.
                let holder = if fastrand::bool() {
                    holder_of(locker, &procs).await
                } else {
                    None
                };
                let Some(i) = holder
                    .filter(|i| running.contains(i))
                    .or_else(|| fastrand::choice(&running).copied())
                else {
                    continue;
                };
                let of_holder = if holder == Some(i) {
                    ", the guarded key's holder,"
                } else {
                    ""
                };
                let pause = random_ms(PAUSE_MS);
                signal(procs[i].pid, Signal::SIGSTOP);
                procs[i].paused_until = Some(now + pause);
                let mut deeds = lock(&deeds);
                *deeds.done.entry(action).or_default() += 1;
                deeds.paused_for += pause;
                deeds.holders_paused += u64::from(holder == Some(i));
                let p = &procs[i];
                deeds.note(
                    Utc::now(),
                    format!(
                        "pause worker {}/{}{of_holder} for {:.2} s",
                        p.worker,
                        p.incarnation,
                        pause.as_secs_f64()
                    ),
                );
            }
            Action::Kill => {
                let p = &mut procs[victim];
                lock(&deeds).note(
                    Utc::now(),
                    format!("SIGKILL worker {}/{}", p.worker, p.incarnation),
                );
                signal(p.pid, Signal::SIGKILL);
                timeout(Duration::from_secs(30), p.child.wait())
                    .await
                    .map_err(|_| format!("worker {} outlived SIGKILL", p.worker))??;
                *p = setup.spawn(p.worker, p.incarnation + 1)?;
                restarts += 1;
                *lock(&deeds).done.entry(action).or_default() += 1;
            }
            Action::ForceRelease => {
                let (locker, deeds) = (locker.clone(), Arc::clone(&deeds));
                actions.spawn(async move {
                    let at = Utc::now();
                    let forced = async {
                        let guarded = locker.force_release(Kind::Guarded.key()).await?;
                        let unfenced = locker.force_release(Kind::Unfenced.key()).await?;
                        Ok::<_, dblock::Error>((guarded, unfenced))
                    };
                    let forced = timeout(ACTION_LIMIT, forced).await;
                    let mut deeds = lock(&deeds);
                    match forced {
                        Ok(Ok((guarded, unfenced))) => {
                            *deeds.done.entry(action).or_default() += 1;
                            deeds.forced.0 += u64::from(guarded);
                            deeds.forced.1 += u64::from(unfenced);
                            deeds.note(
                                at,
                                format!(
                                    "force_release: guarded row deleted {guarded}, unfenced \
                                     {unfenced}"
                                ),
                            );
                        }
                        Ok(Err(err)) => deeds.errors.push(format!("force_release: {err}")),
                        Err(_) => deeds.errors.push("force_release: hung".to_owned()),
                    }
                });
            }
            Action::Reap => {
                let (locker, deeds) = (locker.clone(), Arc::clone(&deeds));
                actions.spawn(async move {
                    let at = Utc::now();
                    let reaped = timeout(ACTION_LIMIT, locker.reap_expired()).await;
                    let mut deeds = lock(&deeds);
                    match reaped {
                        Ok(Ok(rows)) => {
                            *deeds.done.entry(action).or_default() += 1;
                            deeds.reaped += rows;
                            deeds.note(at, format!("reap_expired: {rows} row(s)"));
                        }
                        Ok(Err(err)) => deeds.errors.push(format!("reap_expired: {err}")),
                        Err(_) => deeds.errors.push("reap_expired: hung".to_owned()),
                    }
                });
            }
            Action::KillSessions => {
                let p = &procs[victim];
                let which = Sessions {
                    app: setup.app_of(p.worker),
                    listeners: fastrand::u8(0..4) == 0,
                    ids: lock(&setup.tally)
                        .connections
                        .get(&(p.worker, p.incarnation))
                        .cloned()
                        .unwrap_or_default(),
                };
                let whose = format!("worker {}/{}", p.worker, p.incarnation);
                let (pool, names, deeds) = (pool.clone(), setup.names.clone(), Arc::clone(&deeds));
                actions.spawn(async move {
                    let at = Utc::now();
                    let killed = timeout(ACTION_LIMIT, DB::kill_sessions(&pool, &names, &which));
                    let killed = killed.await;
                    let mut deeds = lock(&deeds);
                    match killed {
                        Ok(Ok(0)) => deeds.sessions_missed += 1,
                        Ok(Ok(n)) => {
                            *deeds.done.entry(action).or_default() += 1;
                            deeds.sessions_killed += n;
                            let listeners = if which.listeners {
                                " and listeners"
                            } else {
                                ""
                            };
                            deeds.note(at, format!("killed {n} session(s) of {whose}{listeners}"));
                        }
                        Ok(Err(err)) => deeds.errors.push(format!("session kill: {err}")),
                        Err(_) => deeds.errors.push("session kill: hung".to_owned()),
                    }
                });
            }
        }
    }
    let ran = started.elapsed();

    // Stop: every worker running again, the actions in flight finished, then the workers
    // told to stop (stdin closed) and waited for.
    for p in procs.iter_mut() {
        if p.paused_until.take().is_some() {
            signal(p.pid, Signal::SIGCONT);
        }
    }
    while actions.join_next().await.is_some() {}
    for p in procs.iter_mut() {
        p.stdin = None;
    }
    let drain_until = Instant::now() + DRAIN;
    for p in procs.iter_mut() {
        match tokio::time::timeout_at(drain_until, p.child.wait()).await {
            Ok(Ok(status)) if status.success() => {}
            Ok(Ok(status)) => problems.push(format!(
                "worker {}/{} ended with {status} when told to stop",
                p.worker, p.incarnation
            )),
            Ok(Err(err)) => return Err(err.into()),
            Err(_) => {
                problems.push(format!(
                    "worker {}/{} did not stop within {DRAIN:?}",
                    p.worker, p.incarnation
                ));
                signal(p.pid, Signal::SIGKILL);
                p.child.wait().await?;
            }
        }
    }
    // The line readers end with their pipes; give them a moment to count the last lines.
    tokio::time::sleep(Duration::from_millis(200)).await;

    let history = DB::read_history(pool, &setup.names).await?;
    let counters: BTreeMap<Kind, Counter> = DB::counters(pool, &setup.names)
        .await?
        .into_iter()
        .collect();
    let tally = std::mem::take(&mut *lock(&setup.tally));
    let deeds = std::mem::take(&mut *lock(&deeds));
    Ok(judge(
        DB::LABEL,
        &setup.names,
        ran,
        history,
        counters,
        tally,
        deeds,
        restarts,
        problems,
    ))
}

/// The checker over each history, and the run's other conditions.
#[allow(clippy::too_many_arguments)]
fn judge(
    backend: &'static str,
    names: &Names,
    ran: Duration,
    history: Vec<Entry>,
    counters: BTreeMap<Kind, Counter>,
    tally: Tally,
    deeds: Deeds,
    restarts: u64,
    mut problems: Vec<String>,
) -> Outcome {
    let mut findings = BTreeMap::new();
    let mut per_worker = BTreeMap::new();
    for kind in Kind::ALL {
        let entries: Vec<Entry> = history.iter().filter(|e| e.kind == kind).cloned().collect();
        let counter = counters.get(&kind).copied().unwrap_or_default();
        let found = check(&entries, counter, kind != Kind::Control);
        let mut writes = vec![0; usize::try_from(WORKERS).expect("fits")];
        for e in &entries {
            if let Some(n) = usize::try_from(e.worker - 1)
                .ok()
                .and_then(|i| writes.get_mut(i))
            {
                *n += 1;
            }
        }
        per_worker.insert(kind, writes);
        findings.insert(kind, found);
    }

    let guarded = &findings[&Kind::Guarded];
    if guarded.violations() > 0 {
        problems.push(format!(
            "the guarded history has {} violation(s) (examples below)",
            guarded.violations()
        ));
    }
    let control = &findings[&Kind::Control];
    if control.lost_updates == 0 {
        problems.push(format!(
            "the control showed no lost update in {} writes: the run was too weak to prove \
             anything",
            control.writes
        ));
    }
    for kind in [Kind::Guarded, Kind::Control] {
        for (i, n) in per_worker[&kind].iter().enumerate() {
            if *n == 0 {
                problems.push(format!("worker {} committed no {kind} write", i + 1));
            }
        }
    }
    for action in Action::ALL {
        if deeds.done.get(&action).copied().unwrap_or(0) == 0 {
            problems.push(format!("the nemesis never did a {}", action.name()));
        }
    }
    problems.extend(deeds.errors.iter().map(|e| format!("nemesis: {e}")));
    problems.extend(tally.errors.iter().cloned());

    // Every write a worker saw commit is in the history, as the worker made it.
    let by_seq: HashMap<(Kind, i64), &Entry> =
        history.iter().map(|e| ((e.kind, e.seq), e)).collect();
    let mut acked_missing = Vec::new();
    for a in &tally.acked {
        let found = by_seq.get(&(a.kind, a.seq)).copied();
        let right = found.is_some_and(|e| {
            e.token == a.token && e.worker == a.worker && e.incarnation == a.incarnation
        });
        if !right {
            acked_missing.push(format!(
                "{} write seq {} of worker {}/{} (token {}): history has {:?}",
                a.kind, a.seq, a.worker, a.incarnation, a.token, found
            ));
        }
    }
    if !acked_missing.is_empty() {
        problems.push(format!(
            "{} acknowledged write(s) not in the history as made: {}",
            acked_missing.len(),
            acked_missing
                .iter()
                .take(3)
                .cloned()
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }

    Outcome {
        backend,
        table: names.lock.clone(),
        ran,
        tally,
        deeds,
        findings,
        counters,
        per_worker,
        acked_missing,
        restarts,
        problems,
    }
}
