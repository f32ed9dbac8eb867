//! `/key/<key>`: one key's last hour from the lock history: its holds drawn as bars (who,
//! for how long), losses and force-releases marked, then the holds and the events as
//! tables. Times are the database clock's: the window ends at the database's "now" as a
//! read of the table returned it.

use std::time::Duration;

use axum::extract::Path;
use axum::response::Response;
use chrono::{DateTime, Utc};
use maud::{Markup, html};

use super::layout::{self, duration};
use super::{Base, State};
use crate::admin::{LockFilter, LockInfo};
use crate::history::{HistoryFilter, LockEvent, MAX_HISTORY_LIMIT};
use crate::recorder::EventKind;

/// How far back the timeline looks.
const WINDOW: Duration = Duration::from_secs(3600);

/// The drawing's width in SVG units (it scales to the page).
const WIDTH: f64 = 900.0;

/// One holder's time on the key, as the events tell it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Hold {
    pub(super) owner: String,
    pub(super) token: Option<i64>,
    pub(super) from: DateTime<Utc>,
    /// Whether it began before the window (or before the history recorded it).
    pub(super) began_before: bool,
    pub(super) until: DateTime<Utc>,
    /// What ended it: a release, a loss, a force-release, a takeover or hand-off by the
    /// next holder; `None` while it is held (or its end was not recorded).
    pub(super) ended_by: Option<EventKind>,
}

/// The holds the events (oldest first) describe, within `[since, now]`; `current` is the
/// key's row now, if any.
pub(super) fn holds(
    events: &[LockEvent],
    current: Option<&LockInfo>,
    since: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Vec<Hold> {
    let mut holds: Vec<Hold> = Vec::new();
    let mut open: Option<Hold> = None;
    for event in events {
        match event.kind {
            EventKind::Acquired | EventKind::TakenOver | EventKind::HandedOff => {
                if let Some(mut previous) = open.take() {
                    previous.until = event.at;
                    previous.ended_by = Some(event.kind);
                    holds.push(previous);
                }
                open = Some(Hold {
                    owner: event.owner.clone(),
                    token: event.fencing_token,
                    from: event.at,
                    began_before: false,
                    until: now,
                    ended_by: None,
                });
            }
            EventKind::Released | EventKind::Lost | EventKind::ForceReleased => {
                let ends_open = open.as_ref().is_some_and(|hold| {
                    event.fencing_token.is_none() || hold.token == event.fencing_token
                });
                let mut hold = match open.take() {
                    Some(hold) if ends_open => hold,
                    other => {
                        // An end whose start is outside the window (or was not recorded).
                        if let Some(mut previous) = other {
                            previous.until = event.at;
                            holds.push(previous);
                        }
                        Hold {
                            owner: event.owner.clone(),
                            token: event.fencing_token,
                            from: since,
                            began_before: true,
                            until: event.at,
                            ended_by: None,
                        }
                    }
                };
                hold.until = event.at;
                hold.ended_by = Some(event.kind);
                holds.push(hold);
            }
            _ => {}
        }
    }
    match (open, current) {
        (Some(hold), _) => holds.push(hold),
        // Held now, its acquisition not in the window's events.
        (None, Some(row)) if !row.expired => holds.push(Hold {
            owner: row.owner.clone(),
            token: Some(row.fencing_token),
            from: row.acquired_at.max(since),
            began_before: row.acquired_at < since,
            until: now,
            ended_by: None,
        }),
        _ => {}
    }
    holds
}

/// The key's page.
pub(super) async fn page(
    axum::extract::State(shared): State,
    base: Base,
    Path(key): Path<String>,
) -> Response {
    let locker = &shared.locker;
    let table = locker.table();
    // The key's row (the first with the key as prefix is the key itself, if there).
    let current = match locker
        .list_matching(&LockFilter::new().prefix(key.as_str()).limit(1))
        .await
    {
        Ok(rows) => rows.into_iter().find(|row| row.key == key),
        Err(err) => return layout::failure(&base, table, &err),
    };
    let filter = HistoryFilter::new()
        .key(key.as_str())
        .within(WINDOW)
        .oldest_first()
        .limit(MAX_HISTORY_LIMIT);
    let events = match locker.history(&filter).await {
        Ok(events) => events,
        Err(err) => return layout::failure(&base, table, &err),
    };
    // The database's "now": a read of the table returns it with every row.
    let now = match &current {
        Some(row) => Some(row.read_at),
        None => match locker.list_matching(&LockFilter::new().limit(1)).await {
            Ok(rows) => rows.first().map(|row| row.read_at),
            Err(err) => return layout::failure(&base, table, &err),
        },
    };
    let now = now.or_else(|| events.last().map(|event| event.at));
    let body = html! {
        h1 { "Key " code { (key) } }
        @match &current {
            Some(row) => p {
                "Held by " code { (row.owner) } " with token " (row.fencing_token) " for "
                (duration(row.held_for())) "; "
                @if row.expired { "its lease has run out." } @else {
                    "lease left " span.lease data-left-ms=(row.expires_in().as_millis()) {
                        (duration(row.expires_in()))
                    } "."
                }
            },
            None => p { "Not held now (no row)." },
        }
        @if !locker.records_history() {
            p.note {
                "This console's Locker does not record the history; other Lockers of the \
                 table may (LockerBuilder::history). What they recorded is shown."
            }
        }
        @match now {
            Some(now) => {
                @let since = now - chrono::Duration::from_std(WINDOW).unwrap_or_default();
                @let holds = holds(&events, current.as_ref(), since, now);
                (drawing(&holds, &events, since, now))
                (holds_table(&holds))
            }
            None => p { "No events in the last hour." },
        }
        (events_table(&events))
        @if events.len() == MAX_HISTORY_LIMIT as usize {
            p.note { "Only the first " (MAX_HISTORY_LIMIT) " events of the hour are shown." }
        }
    };
    layout::page(&base, table, &format!("key {key}"), body)
}

/// The hour as an inline SVG: holds as bars, losses and force-releases as marks, ticks
/// every ten minutes. Each shape has a title (a tooltip) saying what it is.
fn drawing(
    holds: &[Hold],
    events: &[LockEvent],
    since: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Markup {
    let span = (now - since).num_milliseconds().max(1) as f64;
    let x = |at: DateTime<Utc>| {
        ((at - since).num_milliseconds() as f64 / span * WIDTH).clamp(0.0, WIDTH)
    };
    let marks = events
        .iter()
        .filter(|event| matches!(event.kind, EventKind::Lost | EventKind::ForceReleased));
    html! {
        svg.timeline viewBox=(format!("0 0 {WIDTH} 70")) role="img"
            aria-label="Holds of the key over the last hour" {
            rect x="0" y="10" width=(WIDTH) height="30" fill="#f6f8fa" {}
            @for hold in holds {
                rect x=(format!("{:.1}", x(hold.from)))
                    y="14" height="22"
                    width=(format!("{:.1}", (x(hold.until) - x(hold.from)).max(1.0)))
                    fill=(if hold.ended_by.is_none() { "#2da44e" } else { "#0969da" }) {
                    title { (hold_text(hold)) }
                }
            }
            @for event in marks {
                @let (cx, colour) = (x(event.at), if event.kind == EventKind::Lost { "#cf222e" } else { "#bf8700" });
                polygon points=(format!("{:.1},6 {:.1},14 {:.1},6", cx - 5.0, cx, cx + 5.0)) fill=(colour) {
                    title { (event.kind) " at " (event.at.format("%H:%M:%S%.3f")) ": " (event.owner)
                        @if let Some(detail) = &event.detail { " (" (detail) ")" } }
                }
            }
            @for tick in 0..=6 {
                @let tx = WIDTH * f64::from(tick) / 6.0;
                line x1=(format!("{tx:.1}")) x2=(format!("{tx:.1}")) y1="40" y2="46" stroke="#57606a" {}
                text x=(format!("{tx:.1}")) y="60" font-size="11" fill="#57606a"
                    text-anchor=(match tick { 0 => "start", 6 => "end", _ => "middle" }) {
                    @if tick == 6 { "now" } @else { "-" (60 - tick * 10) " min" }
                }
            }
        }
        p.note {
            "Bars: holds (green: still held or its end not recorded). Marks: "
            span.lost { "red" } " a lost lease, " span.forced { "amber" } " a force-release."
        }
    }
}

fn hold_text(hold: &Hold) -> String {
    let held = (hold.until - hold.from).to_std().unwrap_or_default();
    let token = hold.token.map_or("-".to_owned(), |token| token.to_string());
    let end = hold
        .ended_by
        .map_or("held (or end not recorded)", |kind| kind.as_str());
    format!(
        "{} (token {token}) for {}{}: {end}",
        hold.owner,
        if hold.began_before { "at least " } else { "" },
        duration(held)
    )
}

fn holds_table(holds: &[Hold]) -> Markup {
    html! {
        h2 { "Holds" }
        table { thead { tr { th { "From" } th { "Held for" } th { "Holder (owner)" } th { "Token" } th { "Ended by" } } }
            tbody { @for hold in holds {
                tr {
                    td.num { @if hold.began_before { "before " } (hold.from.format("%H:%M:%S%.3f")) }
                    td.num { (duration((hold.until - hold.from).to_std().unwrap_or_default())) }
                    td.owner { (hold.owner) }
                    td.num { @if let Some(token) = hold.token { (token) } }
                    td { @match hold.ended_by { Some(kind) => (kind), None => "still held" } }
                }
            } } }
    }
}

fn events_table(events: &[LockEvent]) -> Markup {
    html! {
        h2 { "Events of the last hour" }
        table { thead { tr { th { "At (UTC, database clock)" } th { "Event" } th { "Owner" } th { "Token" } th { "Detail" } } }
            tbody { @for event in events {
                tr {
                    td.num { (event.at.format("%Y-%m-%d %H:%M:%S%.3f")) }
                    td { (event.kind) }
                    td.owner { (event.owner) }
                    td.num { @if let Some(token) = event.fencing_token { (token) } }
                    td { @if let Some(detail) = &event.detail { (detail) } }
                }
            } } }
    }
}
