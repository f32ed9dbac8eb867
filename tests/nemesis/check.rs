//! The checker: judges one counter's committed history, read back from the database.
//!
//! The history is in commit order: each write's sequence number is its counter row's
//! write count (`n = n + 1`), taken under that row's lock inside the writing transaction,
//! so a later number is a later commit. A hold is one acquisition, named by its fencing
//! token (tokens of a key are unique); all of a hold's writes carry its token.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use crate::db::{Counter, Entry};

/// How many example lines of each finding the report keeps.
const EXAMPLES: usize = 4;

/// What the checker found in one history.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Findings {
    /// Committed writes.
    pub writes: usize,
    /// Distinct holds (fencing tokens) among them; 0 for the lock-less control.
    pub holds: usize,
    /// Writes whose value read is not the previous write's value written (the first
    /// write's previous value is 0): an increment that was lost, or one that read a
    /// value nobody committed.
    pub lost_updates: usize,
    /// Writes that did not write the value read plus one (the writer's own arithmetic).
    pub bad_increments: usize,
    /// Sequence numbers that are not exactly 1..=N.
    pub seq_gaps: usize,
    /// Writes whose fencing token is below the previous write's.
    pub token_inversions: usize,
    /// Holds whose writes begin before an earlier-starting hold's last write: two holds
    /// interleaved in the commit order.
    pub overlaps: usize,
    /// Tokens written by more than one worker process: one acquisition, two holders.
    pub shared_tokens: usize,
    /// The counter row disagrees with the history: (value, writes counted) against N.
    pub counter_mismatch: Option<(i64, i64)>,
    /// A few lines naming the first violations, for the report.
    pub examples: Vec<String>,
    /// The database time of the earliest write found in a violation (a counter mismatch
    /// alone has none).
    pub first_at: Option<DateTime<Utc>>,
}

impl Findings {
    /// Violations of what a correctly locked and fenced history must show.
    pub fn violations(&self) -> usize {
        self.lost_updates
            + self.bad_increments
            + self.seq_gaps
            + self.token_inversions
            + self.overlaps
            + self.shared_tokens
            + usize::from(self.counter_mismatch.is_some())
    }

    fn example(&mut self, line: String) {
        if self.examples.len() < EXAMPLES {
            self.examples.push(line);
        }
    }

    fn at(&mut self, e: &Entry) {
        self.first_at = Some(self.first_at.map_or(e.at, |at| at.min(e.at)));
    }
}

fn who(e: &Entry) -> String {
    format!(
        "seq {} by worker {}/{} token {} at {}",
        e.seq,
        e.worker,
        e.incarnation,
        e.token,
        e.at.format("%H:%M:%S%.6f")
    )
}

/// Judges one history (its entries in sequence order, all of one kind) against its
/// counter row. With `locked`, the writes were made under holds, and the hold checks
/// (tokens, overlaps) apply.
pub fn check(entries: &[Entry], counter: Counter, locked: bool) -> Findings {
    let mut f = Findings {
        writes: entries.len(),
        ..Findings::default()
    };
    let mut previous: Option<&Entry> = None;
    for (i, e) in entries.iter().enumerate() {
        let expected_seq = i64::try_from(i).expect("fits") + 1;
        if e.seq != expected_seq {
            f.seq_gaps += 1;
            f.at(e);
            f.example(format!(
                "sequence gap: {} where {expected_seq} was due",
                who(e)
            ));
        }
        if e.written != e.read + 1 {
            f.bad_increments += 1;
            f.at(e);
            f.example(format!(
                "bad increment: {} read {} and wrote {}",
                who(e),
                e.read,
                e.written
            ));
        }
        let before = previous.map_or(0, |p| p.written);
        if e.read != before {
            f.lost_updates += 1;
            f.at(e);
            let after = previous.map_or("the start".to_owned(), who);
            f.example(format!(
                "lost update: {} read {}, but {after} had written {before}",
                who(e),
                e.read
            ));
        }
        if locked && let Some(p) = previous.filter(|p| e.token < p.token) {
            f.token_inversions += 1;
            f.at(e);
            f.example(format!("token inversion: {} follows {}", who(e), who(p)));
        }
        previous = Some(e);
    }
    let n = i64::try_from(entries.len()).expect("fits");
    if counter.value != n || counter.writes != n {
        f.counter_mismatch = Some((counter.value, counter.writes));
        f.example(format!(
            "counter is {} after {} counted writes, the history has {n}",
            counter.value, counter.writes
        ));
    }
    if locked {
        check_holds(entries, &mut f);
    }
    f
}

/// One hold's span in the commit order and who made its writes.
struct Hold<'a> {
    first: &'a Entry,
    last: i64,
    worker: (i32, i32),
    shared: bool,
}

fn check_holds(entries: &[Entry], f: &mut Findings) {
    // Entries come in sequence order: a hold's first entry is its first write.
    let mut holds: BTreeMap<i64, Hold<'_>> = BTreeMap::new();
    for e in entries {
        let hold = holds.entry(e.token).or_insert(Hold {
            first: e,
            last: e.seq,
            worker: (e.worker, e.incarnation),
            shared: false,
        });
        hold.last = hold.last.max(e.seq);
        if hold.worker != (e.worker, e.incarnation) && !hold.shared {
            hold.shared = true;
            f.shared_tokens += 1;
            f.at(e);
            f.example(format!(
                "shared token: {} is also worker {}/{}'s",
                who(e),
                hold.worker.0,
                hold.worker.1
            ));
        }
    }
    f.holds = holds.len();
    let mut spans: Vec<(i64, i64, i64, &Entry)> = holds
        .iter()
        .map(|(token, h)| (h.first.seq, h.last, *token, h.first))
        .collect();
    spans.sort_unstable_by_key(|&(first, ..)| first);
    // Sweep in order of first write: a hold that starts before the latest end seen so
    // far interleaves with the hold that ends there.
    let mut reach: Option<(i64, i64)> = None;
    for (first, last, token, entry) in spans {
        if let Some((end, other)) = reach
            && first < end
        {
            f.overlaps += 1;
            f.at(entry);
            f.example(format!(
                "overlap: the hold of token {token} wrote at seq {first}..={last}, inside \
                 the hold of token {other} (until seq {end})"
            ));
        }
        if reach.is_none_or(|(end, _)| last > end) {
            reach = Some((last, token));
        }
    }
}

/// The checker run on made-up histories with known faults: it must find each of them,
/// and nothing in a clean one. Returns what went wrong.
pub fn self_check() -> Result<(), String> {
    use crate::db::Kind;
    let at = chrono::DateTime::UNIX_EPOCH;
    // (worker, token, read, written) in commit order.
    let history = |writes: &[(i32, i64, i64, i64)]| -> Vec<Entry> {
        writes
            .iter()
            .enumerate()
            .map(|(i, &(worker, token, read, written))| Entry {
                kind: Kind::Guarded,
                seq: i64::try_from(i).expect("fits") + 1,
                worker,
                incarnation: 1,
                token,
                read,
                written,
                at,
            })
            .collect()
    };
    let run = |writes: &[(i32, i64, i64, i64)], value: i64| {
        let entries = history(writes);
        let n = i64::try_from(entries.len()).expect("fits");
        check(&entries, Counter { value, writes: n }, true)
    };
    let mut problems = Vec::new();
    let mut expect = |name: &str, found: &Findings, what: fn(&Findings) -> usize, want: usize| {
        if what(found) != want {
            problems.push(format!("{name}: expected {want}, found {found:?}"));
        }
    };
    // Three holds, the second with two writes: clean.
    let clean = run(&[(1, 1, 0, 1), (2, 4, 1, 2), (2, 4, 2, 3), (3, 7, 3, 4)], 4);
    expect("clean history", &clean, Findings::violations, 0);
    expect("clean history's holds", &clean, |f| f.holds, 3);
    // Two holders read 1 and both wrote 2.
    let lost = run(&[(1, 1, 0, 1), (2, 2, 1, 2), (3, 3, 1, 2)], 2);
    expect("lost update", &lost, |f| f.lost_updates, 1);
    expect(
        "lost update's counter",
        &lost,
        |f| usize::from(f.counter_mismatch.is_some()),
        1,
    );
    // A stale holder (token 2) writes after its successor (token 3).
    let inverted = run(&[(1, 1, 0, 1), (3, 3, 1, 2), (2, 2, 2, 3)], 3);
    expect("token inversion", &inverted, |f| f.token_inversions, 1);
    expect("token inversion's overlaps", &inverted, |f| f.overlaps, 0);
    // Hold 5 writes, hold 6 writes, hold 5 writes again.
    let overlap = run(&[(1, 5, 0, 1), (2, 6, 1, 2), (1, 5, 2, 3)], 3);
    expect("overlap", &overlap, |f| f.overlaps, 1);
    // Two processes wrote with one token.
    let shared = run(&[(1, 5, 0, 1), (2, 5, 1, 2)], 2);
    expect("shared token", &shared, |f| f.shared_tokens, 1);
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}
