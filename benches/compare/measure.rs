//! Latency samples, percentiles, medians across rounds, and the timed loads that every
//! section is built from.
//!
//! Figures on a shared 2-core machine swing between minutes, so nothing here is compared
//! with a figure from another time: contenders take turns within one run (A B A B ...),
//! each round rotates who goes first, and the report gives medians across rounds and, for
//! ratios, the median of the per-round ratios (each one from neighbouring time slots).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::time::Instant;

/// A fresh owner value, made as dblock makes its own (32 hex digits of a v4 UUID); its
/// first 8 digits also keep a run's keys apart from another run's.
pub fn new_owner() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// Errors from any client (sqlx, redis, dblock) as the bench reports them.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Latencies of one run, in nanoseconds.
#[derive(Debug, Default, Clone)]
pub struct Samples {
    nanos: Vec<u64>,
    sorted: bool,
}

impl Samples {
    pub fn push(&mut self, d: Duration) {
        self.nanos
            .push(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        self.sorted = false;
    }

    pub fn append(&mut self, mut other: Samples) {
        self.nanos.append(&mut other.nanos);
        self.sorted = false;
    }

    /// Nearest-rank percentile (`p` in 0..=100); zero when there are no samples.
    pub fn percentile(&mut self, p: f64) -> Duration {
        if self.nanos.is_empty() {
            return Duration::ZERO;
        }
        if !self.sorted {
            self.nanos.sort_unstable();
            self.sorted = true;
        }
        let rank = ((p / 100.0) * self.nanos.len() as f64).ceil() as usize;
        Duration::from_nanos(self.nanos[rank.clamp(1, self.nanos.len()) - 1])
    }

    /// The share (0..=1) of samples longer than `limit`; zero when there are none.
    pub fn share_above(&self, limit: Duration) -> f64 {
        if self.nanos.is_empty() {
            return 0.0;
        }
        let limit = u64::try_from(limit.as_nanos()).unwrap_or(u64::MAX);
        self.nanos.iter().filter(|&&n| n > limit).count() as f64 / self.nanos.len() as f64
    }

    /// The samples as nanoseconds, in the order pushed (or sorted, once a percentile was
    /// read).
    pub fn nanos(&self) -> &[u64] {
        &self.nanos
    }

    pub fn max(&self) -> Duration {
        Duration::from_nanos(self.nanos.iter().copied().max().unwrap_or(0))
    }
}

/// The median of some per-round figures (mean of the middle two for an even count).
pub fn median(values: impl IntoIterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

/// The smallest and largest of some per-round figures.
pub fn spread(values: impl IntoIterator<Item = f64>) -> (f64, f64) {
    values
        .into_iter()
        .filter(|x| x.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
            (lo.min(x), hi.max(x))
        })
}

/// The order in which `n` contenders run in round `round`: rotated each round, so every
/// contender goes first (and last) equally often over `n` rounds.
pub fn turn_order(n: usize, round: usize) -> impl Iterator<Item = usize> {
    (0..n).map(move |i| (i + round) % n)
}

/// Something that takes and gives back a lock on a fresh key, as one unit of work.
pub trait Contender: Send + Sync {
    /// Its name in the report.
    fn name(&self) -> &str;

    /// Acquire `key`, then release it. `Ok(false)` when the acquisition lost (it should
    /// not, on distinct keys). `task` picks per-task state such as a Redis connection.
    fn cycle<'a>(&'a self, task: usize, key: &'a str) -> BoxFuture<'a, Result<bool, BoxError>>;
}

/// What a timed load did.
#[derive(Debug, Default, Clone)]
pub struct Load {
    /// Completed units of work.
    pub ops: u64,
    /// Acquisitions that lost (no error).
    pub lost: u64,
    /// Errors returned to the caller.
    pub errors: u64,
    pub first_error: Option<String>,
    pub elapsed: Duration,
    /// CPU time the whole bench process used meanwhile (all threads).
    pub cpu: Duration,
    /// Context switches of the bench's threads meanwhile (voluntary + nonvoluntary, see
    /// [`process_cpu`]): each is one wake-up of a thread back onto a CPU.
    pub wakeups: u64,
    pub latencies: Samples,
}

impl Load {
    pub fn per_sec(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64()
    }

    /// Client CPU per completed unit of work.
    pub fn cpu_per_op(&self) -> Duration {
        self.cpu / u32::try_from(self.ops.max(1)).unwrap_or(u32::MAX)
    }

    /// Client thread wake-ups per completed unit of work.
    pub fn wakeups_per_op(&self) -> f64 {
        self.wakeups as f64 / self.ops.max(1) as f64
    }

    /// Adds another timed load of the same contender (one more leg of a round): its
    /// work, time, CPU and wake-ups.
    pub fn merge(&mut self, other: Load) {
        self.elapsed += other.elapsed;
        self.cpu += other.cpu;
        self.wakeups += other.wakeups;
        self.absorb(other);
    }

    fn absorb(&mut self, other: Load) {
        self.ops += other.ops;
        self.lost += other.lost;
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
        self.latencies.append(other.latencies);
    }
}

/// When a load stops: set by a timer or by whoever started it.
#[derive(Clone, Default)]
pub struct Stop(Arc<AtomicBool>);

impl Stop {
    pub fn now(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// A stop that sets itself after `d`.
    pub fn after(d: Duration) -> Stop {
        let stop = Stop::default();
        let timer = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(d).await;
            timer.now();
        });
        stop
    }
}

/// Runs `tasks` loops of `contender.cycle` on distinct keys until `stop`; each key is
/// `{prefix}:{task}:{n}`. Latency is one whole cycle, acquire to release completed.
pub async fn cycles(
    contender: Arc<dyn Contender>,
    tasks: usize,
    prefix: String,
    stop: Stop,
) -> Load {
    let started = Instant::now();
    let before = process_cpu();
    let mut total = Load::default();
    for load in in_tasks(tasks, |task| {
        let contender = Arc::clone(&contender);
        let stop = stop.clone();
        let prefix = prefix.clone();
        async move {
            let mut load = Load::default();
            let mut n = 0u64;
            while !stop.is_set() {
                n += 1;
                let key = format!("{prefix}:{task}:{n}");
                let t = Instant::now();
                match contender.cycle(task, &key).await {
                    Ok(true) => {
                        load.latencies.push(t.elapsed());
                        load.ops += 1;
                    }
                    Ok(false) => load.lost += 1,
                    Err(err) => {
                        load.errors += 1;
                        load.first_error.get_or_insert_with(|| err.to_string());
                        // An outage must not turn into a hot loop of failures.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
            load
        }
    })
    .await
    {
        total.absorb(load);
    }
    total.elapsed = started.elapsed();
    let after = process_cpu();
    total.cpu = after.cpu.saturating_sub(before.cpu);
    total.wakeups = after.wakeups.saturating_sub(before.wakeups);
    total
}

/// Warms every contender up for `warm_up`, then runs `rounds` rounds: each contender runs
/// `round` per round, split into `legs` legs run in the round's order and then in reverse
/// (A B C, C B A, ...), so that a burst of load on the shared machine lands on all of them
/// alike. Per contender, its loads, one per round. `label` starts the progress lines.
pub async fn interleaved(
    contenders: &[Arc<dyn Contender>],
    tasks: usize,
    rounds: usize,
    (round, legs, warm_up): (Duration, u32, Duration),
    label: &str,
) -> Vec<Vec<Load>> {
    // Keys only need to be unique within a run (tables are fresh, Redis keys expire).
    let run = new_owner()[..8].to_owned();
    for (i, c) in contenders.iter().enumerate() {
        let prefix = format!("{run}:w{i}:{tasks}");
        cycles(Arc::clone(c), tasks, prefix, Stop::after(warm_up)).await;
    }
    let mut loads = vec![Vec::new(); contenders.len()];
    for r in 0..rounds {
        eprintln!("{label}, {tasks} task(s), round {}/{rounds}", r + 1);
        let mut per_leg = vec![Load::default(); contenders.len()];
        for leg in 0..legs {
            let mut order: Vec<usize> = turn_order(contenders.len(), r).collect();
            if leg % 2 == 1 {
                order.reverse();
            }
            for i in order {
                let prefix = format!("{run}:{r}:{leg}:{i}:{tasks}");
                let stop = Stop::after(round / legs);
                per_leg[i].merge(cycles(Arc::clone(&contenders[i]), tasks, prefix, stop).await);
            }
        }
        for (i, load) in per_leg.into_iter().enumerate() {
            loads[i].push(load);
        }
    }
    loads
}

/// What the scheduler has counted for all threads of this process so far.
#[derive(Debug, Default, Clone, Copy)]
pub struct ProcessCpu {
    pub cpu: Duration,
    pub wakeups: u64,
}

/// Reads, for every thread of this process, `/proc/self/task/*/schedstat` (time on CPU in
/// nanoseconds; `/proc/self/stat` only counts 10 ms ticks) and `/proc/self/task/*/status`
/// (`voluntary_ctxt_switches` + `nonvoluntary_ctxt_switches`). A voluntary switch is a
/// thread going to sleep (a runtime worker parking, to be woken when I/O or a task is
/// ready); a nonvoluntary one is a thread preempted while runnable. Each is one switch
/// out and, later, one wake-up back in, so their sum is the number of times the process
/// was woken onto a CPU. Threads that exit within a measurement drop out of both readings
/// (tokio's workers live for the whole run; no contender here spawns blocking threads).
/// On a 2-core machine shared with the servers, client CPU and wake-ups per operation are
/// what turns into lost throughput once the cores are busy. Zeros where `/proc` is not
/// available.
pub fn process_cpu() -> ProcessCpu {
    let Ok(threads) = std::fs::read_dir("/proc/self/task") else {
        return ProcessCpu::default();
    };
    let mut total = ProcessCpu::default();
    for thread in threads.flatten() {
        if let Ok(stat) = std::fs::read_to_string(thread.path().join("schedstat")) {
            // "<ns on cpu> <ns waiting for a cpu> <timeslices run>"
            if let Some(Ok(on_cpu)) = stat.split_whitespace().next().map(str::parse::<u64>) {
                total.cpu += Duration::from_nanos(on_cpu);
            }
        }
        if let Ok(status) = std::fs::read_to_string(thread.path().join("status")) {
            for line in status.lines() {
                let switches = line
                    .strip_prefix("voluntary_ctxt_switches:")
                    .or_else(|| line.strip_prefix("nonvoluntary_ctxt_switches:"));
                if let Some(Ok(n)) = switches.map(|v| v.trim().parse::<u64>()) {
                    total.wakeups += n;
                }
            }
        }
    }
    total
}

/// Bytes the bench process has resident now (`/proc/self/statm`), zero where unknown.
pub fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        // 4 KiB pages (x86-64 and aarch64 Linux defaults).
        .map_or(0, |pages| pages * 4096)
}

/// Runs `future` and counts its polls: the first starts it, each later one is one wake-up
/// of the task that runs it (by I/O, a timer, a channel, or the runtime's cooperative
/// budget). Its output and the count.
pub async fn counting_polls<F: Future>(future: F) -> (F::Output, u64) {
    let mut future = std::pin::pin!(future);
    let mut polls = 0u64;
    let output = std::future::poll_fn(|cx| {
        polls += 1;
        future.as_mut().poll(cx)
    })
    .await;
    (output, polls)
}

/// Runs `make(task)` for `tasks` tasks at once on the runtime and collects their results.
pub async fn in_tasks<T, F, Fut>(tasks: usize, make: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(usize) -> Fut,
    Fut: Future<Output = T> + Send + 'static,
{
    let handles: Vec<_> = (0..tasks).map(|task| tokio::spawn(make(task))).collect();
    let mut out = Vec::with_capacity(tasks);
    for handle in handles {
        out.push(handle.await.expect("a bench task panicked"));
    }
    out
}
