//! Lock holders in processes of their own, so a test can SIGKILL, SIGSTOP or clock-skew
//! them. The holder is this very test binary, started again with [`ROLE_ENV`] set: no
//! extra binary, feature or build step, and `cargo test` builds it like any test.
//!
//! The holder prints one line per event on stdout and takes commands on stdin:
//!
//! | stdout | meaning |
//! |---|---|
//! | `CLOCK <µs>` | its own wall clock at start (to prove a skew took effect) |
//! | `ACQUIRED <token> <owner> <expires µs> <wake-ups>` | it holds the lock (expiry by the database clock; releases elsewhere its listener heard) |
//! | `BUSY` / `TIMEOUT` | `try_acquire` lost / `acquire` waited in vain |
//! | `LISTENING` | a candidate's Locker hears releases elsewhere (PostgreSQL) |
//! | `RENEWED <expires µs>` | its watchdog moved the expiry |
//! | `LOST <reason>` | `lost()` fired |
//! | `WRITE applied` / `WRITE refused` | answer to `write <value>`: the fenced write |
//! | `RELEASED ok` / `RELEASED NotHeld` / `RELEASED error ..` | answer to `release`; then it exits |
//! | `ERROR <message>` | anything else went wrong; it exits with status 1 |
//!
//! End of stdin (the test went away) ends the process without a release.

use std::collections::VecDeque;
use std::process::{ExitCode, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dblock::{Error, LockGuard, Locker, MySql, Postgres, RetryPolicy, Sqlite};
use sqlx::pool::PoolOptions;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;
use tokio::time::{Instant, timeout};

use crate::Res;
use crate::db::FaultDb;
use crate::server::signal;
use nix::sys::signal::Signal;

/// Set in a holder's environment: run as a holder, not as the suite.
pub const ROLE_ENV: &str = "DBLOCK_FAULTS_ROLE";

/// Microseconds since the epoch on this process's wall clock.
pub fn wall_micros() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970");
    i64::try_from(since.as_micros()).expect("fits")
}

/// What a holder process should do.
#[derive(Debug, Clone)]
pub struct Spec {
    pub url: String,
    pub key: String,
    pub lease: Duration,
    /// Watchdog renewal on or off.
    pub renew: bool,
    /// Zero: one `try_acquire`; otherwise `acquire` waiting this long.
    pub wait: Duration,
    /// A libfaketime offset such as `+1h` for the process's clock.
    pub skew: Option<&'static str>,
    /// Run as a scheduled job instead: `job(key).lock_at_most_for(lease)
    /// .lock_at_least_for(this)`, whose work only prints `ACQUIRED`; then `RELEASED ok`
    /// (or `BUSY`) and exit.
    pub job_min_hold: Option<Duration>,
    /// Run partition_late.rs's frozen-after-sending holder instead, in this mode
    /// (`try` or `with`): it says `READY`, acquires on `go` and prints `RESULT ..`.
    pub late: Option<&'static str>,
}

impl Spec {
    pub fn new(url: &str, key: &str, lease: Duration) -> Spec {
        Spec {
            url: url.to_owned(),
            key: key.to_owned(),
            lease,
            renew: true,
            wait: Duration::ZERO,
            skew: None,
            job_min_hold: None,
            late: None,
        }
    }
}

/// Where Debian's libfaketime package put the (thread-safe) library, if it is installed.
pub fn libfaketime() -> Option<std::path::PathBuf> {
    let mut candidates = vec![std::path::PathBuf::from("/usr/lib/faketime")];
    if let Ok(dirs) = std::fs::read_dir("/usr/lib") {
        candidates.extend(dirs.flatten().map(|d| d.path().join("faketime")));
    }
    candidates
        .into_iter()
        .map(|dir| dir.join("libfaketimeMT.so.1"))
        .find(|lib| lib.is_file())
}

/// A line the holder printed, stamped when the suite read it.
#[derive(Debug, Clone)]
pub struct Line {
    pub at: Instant,
    /// The suite's (unskewed) wall clock when the line was read, in µs.
    pub wall: i64,
    pub text: String,
}

impl Line {
    /// The `n`th space-separated word after the tag.
    pub fn field(&self, n: usize) -> Res<&str> {
        self.text
            .split(' ')
            .nth(n + 1)
            .ok_or_else(|| format!("no field {n} in {:?}", self.text).into())
    }

    pub fn int(&self, n: usize) -> Res<i64> {
        Ok(self.field(n)?.parse()?)
    }
}

/// The suite's handle on a holder process; the process is killed when this is dropped.
pub struct HolderProc {
    child: Child,
    pid: i32,
    stdin: ChildStdin,
    lines: mpsc::UnboundedReceiver<Line>,
    /// Lines read but not yet asked for (`RENEWED` lines are not kept).
    pending: VecDeque<Line>,
    /// The expiry from the last `ACQUIRED` or `RENEWED` line, µs on the database clock.
    pub expiry: i64,
    /// `RENEWED` lines read so far.
    pub renewals: usize,
}

impl HolderProc {
    pub fn spawn(spec: &Spec) -> Res<HolderProc> {
        let mut cmd = Command::new(std::env::current_exe()?);
        if let Some(offset) = spec.skew {
            // libfaketime preloaded into the holder itself, not through the `faketime`
            // wrapper, so the pid the suite signals is the holder's. Only the wall clock
            // moves: a monotonic clock shifted back an hour would go below zero on a
            // machine that booted less than an hour ago.
            let library = libfaketime().ok_or("libfaketime is not installed")?;
            cmd.env("LD_PRELOAD", library)
                .env("FAKETIME", offset)
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        cmd.env(ROLE_ENV, "holder")
            .arg(&spec.url)
            .arg(&spec.key)
            .arg(spec.lease.as_millis().to_string())
            .arg(match (spec.late, spec.job_min_hold, spec.renew) {
                (Some(mode), _, _) => format!("late-{mode}"),
                (None, Some(min_hold), _) => format!("job{}", min_hold.as_millis()),
                (None, None, true) => "renew".to_owned(),
                (None, None, false) => "no-renew".to_owned(),
            })
            .arg(spec.wait.as_millis().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        let mut child = cmd.spawn()?;
        let pid = child.id().ok_or("holder exited at once")? as i32;
        let stdin = child.stdin.take().ok_or("holder stdin")?;
        let stdout = child.stdout.take().ok_or("holder stdout")?;
        let (send, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(text)) = reader.next_line().await {
                let line = Line {
                    at: Instant::now(),
                    wall: wall_micros(),
                    text,
                };
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(HolderProc {
            child,
            pid,
            stdin,
            lines,
            pending: VecDeque::new(),
            expiry: 0,
            renewals: 0,
        })
    }

    /// Reads one line from the process, if one comes within `until`.
    async fn read(&mut self, until: Instant) -> Res<Option<Line>> {
        let Ok(line) = tokio::time::timeout_at(until, self.lines.recv()).await else {
            return Ok(None);
        };
        let line = line.ok_or("the holder process closed its stdout")?;
        if line.text.starts_with("ERROR") {
            return Err(format!("holder: {}", line.text).into());
        }
        if line.text.starts_with("RENEWED") {
            self.expiry = line.int(0)?;
            self.renewals += 1;
        }
        if line.text.starts_with("ACQUIRED") {
            self.expiry = line.int(2)?;
        }
        Ok(Some(line))
    }

    /// The first line starting with `tag` (read before or within `within`).
    pub async fn expect(&mut self, tag: &str, within: Duration) -> Res<Line> {
        if let Some(i) = self.pending.iter().position(|l| l.text.starts_with(tag)) {
            return Ok(self.pending.remove(i).expect("position is in range"));
        }
        let until = Instant::now() + within;
        loop {
            match self.read(until).await? {
                None => {
                    return Err(format!(
                        "no {tag} line from the holder within {within:?} (unread: {:?})",
                        self.pending.iter().map(|l| &l.text).collect::<Vec<_>>()
                    )
                    .into());
                }
                Some(line) if line.text.starts_with(tag) => return Ok(line),
                Some(line) if line.text.starts_with("RENEWED") => {}
                Some(line) => self.pending.push_back(line),
            }
        }
    }

    /// Waits for a renewal printed after this call.
    pub async fn next_renewal(&mut self, within: Duration) -> Res<Line> {
        // Lines already waiting in the pipe are older than this call.
        while let Ok(line) = self.lines.try_recv() {
            if line.text.starts_with("RENEWED") {
                self.expiry = line.int(0)?;
                self.renewals += 1;
            } else {
                self.pending.push_back(line);
            }
        }
        self.expect("RENEWED", within).await
    }

    pub async fn send(&mut self, command: &str) -> Res<()> {
        self.stdin
            .write_all(format!("{command}\n").as_bytes())
            .await?;
        self.stdin.flush().await?;
        Ok(())
    }

    pub fn kill(&self) {
        signal(self.pid, Signal::SIGKILL);
    }

    /// SIGSTOPs the holder between two of its renewals, never in the middle of one:
    /// right after a `RENEWED` line whose renewal is fresh (its expiry less `lease`,
    /// within a third of the renewal `interval` of now; the suite, its holders and its
    /// servers share this machine's clock). A process frozen in the middle of a write
    /// keeps SQLite's write lock, which lives in the process, and no other process can
    /// write until it thaws; a holder in a GC pause between statements holds nothing.
    /// On a busy machine the suite may read a line late, when the next renewal has begun.
    pub async fn pause_between_renewals(&mut self, lease: Duration, interval: Duration) -> Res<()> {
        let fresh = i64::try_from((interval / 3).as_micros())?;
        let lease = i64::try_from(lease.as_micros())?;
        for _ in 0..20 {
            let renewed_at = self
                .next_renewal(Duration::from_micros(lease as u64))
                .await?
                .int(0)?
                - lease;
            if wall_micros() - renewed_at < fresh {
                signal(self.pid, Signal::SIGSTOP);
                return Ok(());
            }
        }
        Err("no renewal of the holder was read soon enough to pause it between two".into())
    }

    /// SIGSTOPs the holder wherever it is.
    pub fn stop(&self) {
        signal(self.pid, Signal::SIGSTOP);
    }

    pub fn resume(&self) {
        signal(self.pid, Signal::SIGCONT);
    }

    /// Waits for the process to end (after `release`, or a kill).
    pub async fn wait_exit(&mut self, within: Duration) -> Res<std::process::ExitStatus> {
        Ok(timeout(within, self.child.wait())
            .await
            .map_err(|_| "the holder process did not exit")??)
    }
}

// ---- the holder process itself ------------------------------------------------------

/// Entry point of a holder process: `<url> <key> <lease ms> renew|no-renew|job<ms>|late-<mode> <wait ms>`.
pub fn child_main() -> ExitCode {
    crate::standalone::child_main(async |args: Vec<String>| -> Res<()> {
        let url = args.first().ok_or("no URL")?;
        match url.split(':').next() {
            Some("postgres") => hold::<Postgres>(&args).await,
            Some("mysql") => hold::<MySql>(&args).await,
            Some("sqlite") => hold::<Sqlite>(&args).await,
            _ => Err(format!("unknown URL scheme in {url}").into()),
        }
    })
}

async fn hold<DB: FaultDb>(args: &[String]) -> Res<()> {
    let [url, key, lease, renew, wait] = args else {
        return Err(format!("expected 5 arguments, got {args:?}").into());
    };
    let lease = Duration::from_millis(lease.parse()?);
    let wait = Duration::from_millis(wait.parse()?);
    println!("CLOCK {}", wall_micros());
    if let Some(mode) = renew.strip_prefix("late-") {
        return crate::partition_late::child::<DB>(url, key, lease, mode).await;
    }
    let pool = PoolOptions::<DB>::new()
        .max_connections(2)
        .connect(url)
        .await?;
    if let Some(min_hold) = renew.strip_prefix("job") {
        return run_job(&Locker::new(pool), key, lease, min_hold.parse()?).await;
    }
    let locker = if DB::LABEL == "postgres" && key.ends_with(crate::primitives::WOKEN_ELECTION) {
        // 9d asserts that the release's notification woke the candidate. Polls at most
        // 500 ms apart (the default) can land between the release's commit and the
        // notification's arrival, which a busy CI machine widens (seen: wake-ups 0): with
        // a minute's cap, only the notification (or the lease's end) wakes this one.
        let sleepy = RetryPolicy {
            initial: Duration::from_millis(10),
            max: Duration::from_secs(60),
        };
        Locker::builder(pool.clone()).retry(sleepy).build()?
    } else {
        Locker::new(pool.clone())
    };
    let locker = locker.auto_renew(renew == "renew");
    if key.starts_with("election/") {
        // Says when releases elsewhere can be heard (PostgreSQL's listener is up), so a
        // scenario does not release before the candidate listens; silent elsewhere.
        let watched = locker.clone();
        tokio::spawn(async move {
            let until = tokio::time::Instant::now() + wait;
            while tokio::time::Instant::now() < until {
                if watched.listening() {
                    println!("LISTENING");
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
    }
    let Some(guard) = take(&locker, key, lease, wait).await? else {
        return Ok(());
    };
    println!(
        "ACQUIRED {} {} {} {}",
        guard.fencing_token(),
        guard.owner(),
        guard.expires_at().timestamp_micros(),
        locker.stats().wakeups
    );

    let mut commands = BufReader::new(tokio::io::stdin()).lines();
    let mut expiry = guard.expires_at();
    // The library reports renewals only through expires_at(); 5 ms polling is plenty
    // next to renewal intervals of a second.
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    let mut lost = false;
    loop {
        tokio::select! {
            reason = guard.lost(), if !lost => {
                println!("LOST {reason:?}");
                lost = true;
            }
            _ = tick.tick() => {
                if guard.expires_at() != expiry {
                    expiry = guard.expires_at();
                    println!("RENEWED {}", expiry.timestamp_micros());
                }
            }
            command = commands.next_line() => match command?.as_deref() {
                None => return Ok(()),
                Some("release") => {
                    match guard.release().await {
                        Ok(()) => println!("RELEASED ok"),
                        Err(Error::NotHeld { .. }) => println!("RELEASED NotHeld"),
                        Err(err) => println!("RELEASED error {err}"),
                    }
                    return Ok(());
                }
                Some(command) => {
                    let value = command
                        .strip_prefix("write ")
                        .ok_or_else(|| format!("unknown command {command:?}"))?;
                    let applied = DB::fenced_write(&pool, value, guard.fencing_token()).await?;
                    println!("WRITE {}", if applied { "applied" } else { "refused" });
                }
            }
        }
    }
}

/// Takes what `key` names: `semaphore/<permits>/<name>` a permit, `election/<identity>/<name>`
/// the lead (campaigning up to `wait`), anything else the mutex on `key`; one attempt when
/// `wait` is zero. `None` after printing `BUSY` or `TIMEOUT`.
async fn take<DB: FaultDb>(
    locker: &Locker<DB>,
    key: &str,
    lease: Duration,
    wait: Duration,
) -> Res<Option<LockGuard<DB>>> {
    let outcome = match key.split('/').collect::<Vec<_>>()[..] {
        ["semaphore", permits, name] => {
            let semaphore = locker.semaphore(name, permits.parse()?);
            if wait.is_zero() {
                semaphore
                    .try_acquire(lease)
                    .await
                    .map(|p| p.map(|p| p.into_guard()))
            } else {
                semaphore
                    .acquire(lease, wait)
                    .await
                    .map(|p| Some(p.into_guard()))
            }
        }
        ["election", identity, name] => {
            let election = locker.election(name);
            match tokio::time::timeout(wait, election.campaign(identity, lease)).await {
                Ok(lead) => lead.map(|lead| Some(lead.into_guard())),
                Err(_) => Err(Error::Timeout {
                    key: key.to_owned(),
                    waited: wait,
                    attempts: 0,
                    held_by: None,
                    held_until: None,
                    held_here: false,
                }),
            }
        }
        _ if wait.is_zero() => locker.try_acquire(key, lease).await,
        _ => locker.acquire(key, lease, wait).await.map(Some),
    };
    match outcome {
        Ok(Some(guard)) => Ok(Some(guard)),
        Ok(None) => {
            println!("BUSY");
            Ok(None)
        }
        Err(Error::Timeout { .. }) => {
            println!("TIMEOUT");
            Ok(None)
        }
        Err(err) => Err(err.into()),
    }
}

/// The holder as a scheduled job: one run whose work only reports the acquisition.
async fn run_job<DB: FaultDb>(
    locker: &Locker<DB>,
    key: &str,
    lease: Duration,
    min_hold_ms: u64,
) -> Res<()> {
    let ran = locker
        .job(key)
        .lock_at_most_for(lease)
        .lock_at_least_for(Duration::from_millis(min_hold_ms))
        .run(async |guard| {
            println!(
                "ACQUIRED {} {} {}",
                guard.fencing_token(),
                guard.owner(),
                guard.expires_at().timestamp_micros()
            );
            Ok::<_, Error>(())
        })
        .await?;
    println!("{}", if ran.is_some() { "RELEASED ok" } else { "BUSY" });
    Ok(())
}
