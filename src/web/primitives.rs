//! `/primitives`: each semaphore's permits in use, each read-write lock's state and each
//! election's leader, read from their rows; `/metrics`: this Locker's counters.

use std::collections::BTreeMap;

use axum::response::Response;
use maud::html;

use super::layout::{self, duration};
use super::{Base, State};
use crate::admin::{LockFilter, LockInfo, MAX_LIST_LIMIT};
use crate::config::GROUP_MARK;
use crate::history::{HistoryFilter, LockEvent};
use crate::recorder::EventKind;

/// Past terms shown per election (the newest), from the last hour of the history.
const TERMS_SHOWN: u32 = 5;

/// Elections whose past terms are read (one history read each), in name order.
const ELECTIONS_WITH_TERMS: usize = 50;

/// What the rows of one primitive say.
#[derive(Debug, Default)]
struct Primitive<'a> {
    /// Semaphore: permits held (live rows) and the count from the keys.
    permits: Option<(usize, u32)>,
    /// Read-write lock: live readers, and the writer's row (`~write`).
    readers: usize,
    writer: Option<&'a LockInfo>,
    /// Election: the leader's row (`~leader`).
    leader: Option<&'a LockInfo>,
}

/// The primitives of every row read (up to [`MAX_LIST_LIMIT`]), by name.
fn primitives(rows: &[LockInfo]) -> BTreeMap<&str, Primitive<'_>> {
    let mut found: BTreeMap<&str, Primitive<'_>> = BTreeMap::new();
    for row in rows.iter().filter(|row| !row.expired) {
        let Some((name, part)) = row.key.rsplit_once(GROUP_MARK) else {
            continue;
        };
        match row.kind() {
            "semaphore" => {
                let of = part.rsplit_once("-of-").and_then(|(_, n)| n.parse().ok());
                let entry = found.entry(name).or_default();
                let (held, count) = entry.permits.get_or_insert((0, 0));
                *held += 1;
                *count = (*count).max(of.unwrap_or(0));
            }
            "read" => found.entry(name).or_default().readers += 1,
            // `~write-grant` is the write's second row, taken once no reader is left.
            "write" if part == "write" => found.entry(name).or_default().writer = Some(row),
            "leader" => found.entry(name).or_default().leader = Some(row),
            _ => {}
        }
    }
    found
}

/// The leader's identity: its owner value less the `~<32 hex digits>` elections add.
fn identity(owner: &str) -> &str {
    owner
        .rsplit_once(GROUP_MARK)
        .map_or(owner, |(identity, _)| identity)
}

pub(super) async fn page(axum::extract::State(shared): State, base: Base) -> Response {
    let locker = &shared.locker;
    let filter = LockFilter::new().limit(MAX_LIST_LIMIT);
    let rows = match locker.list_matching(&filter).await {
        Ok(rows) => rows,
        Err(err) => return layout::failure(&base, locker.table(), &err),
    };
    let found = primitives(&rows);
    let semaphores = found.iter().filter(|(_, p)| p.permits.is_some());
    let rwlocks = found
        .iter()
        .filter(|(_, p)| p.readers > 0 || p.writer.is_some());
    let elections: Vec<(&str, &LockInfo)> = found
        .iter()
        .filter_map(|(name, p)| Some((*name, p.leader?)))
        .collect();
    // Each leading election's latest terms: the acquisitions of its leader row.
    let mut terms: Vec<Vec<LockEvent>> = Vec::new();
    for (name, _) in elections.iter().take(ELECTIONS_WITH_TERMS) {
        let filter = HistoryFilter::new()
            .key(format!("{name}{GROUP_MARK}leader"))
            .kinds([
                EventKind::Acquired,
                EventKind::TakenOver,
                EventKind::HandedOff,
            ])
            .within(std::time::Duration::from_secs(3600))
            .limit(TERMS_SHOWN);
        match locker.history(&filter).await {
            Ok(events) => terms.push(events),
            Err(err) => return layout::failure(&base, locker.table(), &err),
        }
    }
    let body = html! {
        h1 { "Primitives" }
        p.note {
            "Read from the live rows of the table (a primitive with no row held is not \
             listed); times by the database clock."
            @if rows.len() == MAX_LIST_LIMIT as usize {
                strong { " Only the first " (MAX_LIST_LIMIT) " rows were read: there may be more." }
            }
        }
        h2 { "Semaphores" }
        table { thead { tr { th { "Name" } th { "Permits in use" } } }
            tbody { @for (name, p) in semaphores {
                @let (held, count) = p.permits.unwrap_or_default();
                tr { td { (name) } td.num { (held) " of " (count) } }
            } } }
        h2 { "Read-write locks" }
        table { thead { tr { th { "Name" } th { "State" } th { "Readers" } th { "Writer" } } }
            tbody { @for (name, p) in rwlocks {
                tr {
                    td { (name) }
                    td { @if p.writer.is_some() { "write" } @else { "read" } }
                    td.num { (p.readers) }
                    td.owner { @if let Some(writer) = p.writer { (writer.owner) } }
                }
            } } }
        h2 { "Elections" }
        table { thead { tr { th { "Name" } th { "Leader" } th { "Term" } th { "Leading for" } th { "Lease left" }
                th { "Latest terms (last hour, from the history)" } } }
            tbody { @for (i, (name, leader)) in elections.iter().enumerate() {
                tr {
                    td { (name) }
                    td.owner { (identity(&leader.owner)) }
                    td.num { (leader.fencing_token) }
                    td.num { (duration(leader.held_for())) }
                    td.num.lease data-left-ms=(leader.expires_in().as_millis()) {
                        (duration(leader.expires_in()))
                    }
                    td { @for term in terms.get(i).into_iter().flatten() {
                        div { "#" (term.fencing_token.unwrap_or_default()) " " code { (identity(&term.owner)) }
                            " from " (term.at.format("%H:%M:%S")) }
                    } }
                }
            } } }
    };
    layout::page(&base, locker.table(), "primitives", body)
}

pub(super) async fn metrics(axum::extract::State(shared): State, base: Base) -> Response {
    let locker = &shared.locker;
    let stats = locker.stats();
    let counters: [(&str, u64, &str); 14] = [
        ("attempts", stats.attempts, "acquisition statements sent"),
        ("acquired", stats.acquired, "acquisitions won"),
        (
            "released",
            stats.released,
            "rows released by this Locker's guards",
        ),
        (
            "releases",
            stats.releases,
            "release statements outside the engine's batches",
        ),
        ("renewals", stats.renewals, "renewal batches sent"),
        ("renewed", stats.renewed, "leases renewed"),
        (
            "renewal_errors",
            stats.renewal_errors,
            "renewal batches that failed",
        ),
        (
            "release_batches",
            stats.release_batches,
            "batched releases sent",
        ),
        ("lost", stats.lost, "leases lost"),
        ("reaped", stats.reaped, "expired rows reaped"),
        (
            "handoffs",
            stats.handoffs,
            "releases handed straight to a waiter",
        ),
        (
            "wakeups",
            stats.wakeups,
            "releases elsewhere that woke a waiter here",
        ),
        (
            "listener_connects",
            stats.listener_connects,
            "times the release listener connected",
        ),
        (
            "late_answers",
            stats.late_answers,
            "answers past their lease's local deadline",
        ),
    ];
    let body = html! {
        h1 { "Metrics" }
        p.note {
            "The counters of the Locker this console was given (" (locker.backend()) "), \
             since it was built: this process's work, not the whole table's. Renewing "
            (locker.renewing()) " leases; release listener "
            @if locker.listening() { "up" } @else { "not running" } "."
        }
        table { thead { tr { th { "Counter" } th { "Value" } th { "What it counts" } } }
            tbody { @for (name, value, what) in counters {
                tr { td { code { (name) } } td.num { (value) } td { (what) } }
            } } }
    };
    layout::page(&base, locker.table(), "metrics", body)
}
