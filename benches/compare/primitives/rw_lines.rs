//! Cell 7.4's lines under its table: issue 45's targets for the read-write lock, and the
//! ceilings that bound them, each from the same interleaved rounds as the figures it is
//! read against.

use crate::report::{ratio, verdict};

/// Issue 45's targets: dblock's writes against the peer's, with 1 task and with 8...
const WRITE_VS_PEER: [f64; 2] = [0.4, 0.25];
/// ... each write within 1.2x of dblock's mutex cycle (at least 1 / 1.2 of its rate)...
const WRITE_VS_MUTEX: f64 = 1.0 / 1.2;
/// ... and reads no worse than 0.6x the peer's.
const READ_VS_PEER: f64 = 0.6;

/// dblock's fresh-lock write at this share of its statements' rate or more counts as
/// close to them: rounds on the shared 2-core machine swing about that much.
const CLOSE: f64 = 0.9;

/// The contenders, in the order of their loads.
pub const MUTEX: usize = 0;
pub const ONE_KEY: usize = 1;
pub const WRITE: usize = 2;
pub const FRESH_WRITE: usize = 3;
pub const HAND_WRITE: usize = 4;
pub const PEER_WRITE: usize = 5;
pub const READ: usize = 6;
pub const PEER_READ: usize = 7;

/// A median of per-round ratios and their spread (lowest, highest).
type Ratio = (f64, (f64, f64));

/// The lines for `tasks` tasks (the `t`-th count of the cell); `vs(a, b)`: contender
/// `a`'s rate against `b`'s.
pub fn lines(tasks: usize, t: usize, vs: impl Fn(usize, usize) -> Ratio) -> Vec<String> {
    let mut out = vec![
        target(
            &format!("writes of one shared lock / peer writes, {tasks} task(s)"),
            vs(WRITE, PEER_WRITE),
            WRITE_VS_PEER[t],
        ),
        target(
            &format!("writes of one shared lock / dblock's mutex cycle, {tasks} task(s)"),
            vs(WRITE, MUTEX),
            WRITE_VS_MUTEX,
        ),
        target(
            &format!("writes of a fresh lock each cycle / dblock's mutex cycle, {tasks} task(s)"),
            vs(FRESH_WRITE, MUTEX),
            WRITE_VS_MUTEX,
        ),
        statements(tasks, vs(HAND_WRITE, MUTEX), vs(FRESH_WRITE, HAND_WRITE)),
    ];
    if tasks > 1 {
        let (one_key, of_one_key) = (vs(ONE_KEY, MUTEX), vs(WRITE, ONE_KEY));
        out.push(format!(
            "- Ceiling for the shared-lock write, {tasks} tasks: a mutex on one key (an \
             exclusive lock every task contends for, as every write of one lock is) reaches \
             {} of the mutex cycle; the shared-lock write is {} of that mutex",
            shown(one_key),
            shown(of_one_key)
        ));
    }
    // With several tasks the peer's write contends for its one key, while the mutex
    // cycle's keys are fresh: the mutex on one key is said beside it, contended alike.
    let contended = if tasks > 1 {
        format!(
            " (the mutex on one key, contended as the peer's write is: {})",
            shown(vs(ONE_KEY, PEER_WRITE))
        )
    } else {
        String::new()
    };
    out.push(format!(
        "- Ceiling for the peer targets, {tasks} task(s): dblock's mutex cycle reaches {} of \
         the peer's write{contended}: any lock that commits a row, against one that writes \
         nothing and commits nothing",
        shown(vs(MUTEX, PEER_WRITE))
    ));
    out.push(target(
        &format!("reads / peer reads, {tasks} task(s)"),
        vs(READ, PEER_READ),
        READ_VS_PEER,
    ));
    out
}

/// The ceiling of dblock's statements: `hand` is their rate by hand against the mutex
/// cycle's, `fresh` dblock's fresh-lock write against them.
fn statements(tasks: usize, hand: Ratio, fresh: Ratio) -> String {
    let reach = if hand.0 >= WRITE_VS_MUTEX {
        format!("the {WRITE_VS_MUTEX:.2}x target is within their reach")
    } else {
        format!("they alone stay below the {WRITE_VS_MUTEX:.2}x target")
    };
    let dblock = if fresh.0 >= CLOSE && hand.0 < WRITE_VS_MUTEX {
        "close to them: the gap to the target is the statements'"
    } else if fresh.0 >= CLOSE {
        "close to them: dblock adds little to its statements"
    } else {
        "the rest is dblock's own work (guard, lease engine, metrics)"
    };
    format!(
        "- Ceiling, {tasks} task(s): dblock's own statements by hand reach {} of the mutex \
         cycle: a write that records its two rows and looks for readers in one function \
         call cannot be faster than its statements, and {reach}; dblock's fresh-lock write \
         is {} of them, {dblock}",
        shown(hand),
        shown(fresh)
    )
}

/// A target line: `what` is `ratio` (median of per-round ratios), at least `target`.
fn target(what: &str, (median, spread): Ratio, target: f64) -> String {
    format!(
        "- Target: {what} >= {target:.2}x -> {} ({})",
        verdict(median >= target),
        ratio(median, spread)
    )
}

fn shown((median, spread): Ratio) -> String {
    ratio(median, spread)
}
