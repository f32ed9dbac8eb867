//! `/jobs`: each job's and schedule's last day from the lock history: last run, runs,
//! skips, overruns, and a schedule's next period.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::response::Response;
use maud::html;

use super::layout;
use super::{Base, State};
use crate::history::{HistoryFilter, LockEvent, MAX_HISTORY_LIMIT};
use crate::recorder::EventKind;

/// How far back the page looks.
const WINDOW: Duration = Duration::from_secs(24 * 3600);

/// What one job's or schedule's events say.
#[derive(Debug, Default, PartialEq)]
pub(super) struct JobSummary<'a> {
    /// Claimed periods seen (schedules only).
    pub(super) schedule: bool,
    pub(super) runs: usize,
    pub(super) skips: usize,
    pub(super) overruns: usize,
    /// The latest run or claimed period.
    pub(super) last_run: Option<&'a LockEvent>,
    /// The highest period number claimed.
    pub(super) last_period: Option<i64>,
}

/// A schedule's rows are `<name>@0` and `<name>@1` (by period parity), with period
/// numbers in their events' details; a job's row is its key.
fn name_of(event: &LockEvent) -> (&str, Option<i64>) {
    let period = event
        .detail
        .as_deref()
        .and_then(|detail| detail.parse().ok());
    match (event.key.rsplit_once('@'), period) {
        (Some((name, "0" | "1")), Some(period)) if event.kind != EventKind::JobRan => {
            (name, Some(period))
        }
        _ => (event.key.as_str(), None),
    }
}

/// The jobs and schedules of `events` (newest first), by name.
pub(super) fn summaries(events: &[LockEvent]) -> BTreeMap<&str, JobSummary<'_>> {
    let mut found: BTreeMap<&str, JobSummary<'_>> = BTreeMap::new();
    for event in events {
        let (name, period) = name_of(event);
        let summary = found.entry(name).or_default();
        summary.schedule |= period.is_some();
        if let Some(period) = period {
            summary.last_period = summary.last_period.max(Some(period));
        }
        match event.kind {
            EventKind::JobRan | EventKind::Period => {
                summary.runs += 1;
                summary.last_run.get_or_insert(event);
            }
            EventKind::JobSkipped => summary.skips += 1,
            EventKind::JobOverran => summary.overruns += 1,
            _ => {}
        }
    }
    found
}

pub(super) async fn page(axum::extract::State(shared): State, base: Base) -> Response {
    let locker = &shared.locker;
    let filter = HistoryFilter::new()
        .kinds([
            EventKind::JobRan,
            EventKind::JobSkipped,
            EventKind::JobOverran,
            EventKind::Period,
        ])
        .within(WINDOW)
        .limit(MAX_HISTORY_LIMIT);
    let events = match locker.history(&filter).await {
        Ok(events) => events,
        Err(err) => return layout::failure(&base, locker.table(), &err),
    };
    let found = summaries(&events);
    let body = html! {
        h1 { "Jobs and schedules" }
        p.note {
            "From the lock history of the last 24 hours (what Lockers that record it wrote; \
             times by the database clock). A run is a job's run or a schedule's claimed \
             period; a skip, a turn another node held; an overrun, a period whose work \
             ran past its end."
            @if events.len() == MAX_HISTORY_LIMIT as usize {
                strong { " Only the latest " (MAX_HISTORY_LIMIT) " events were read." }
            }
        }
        table { thead { tr {
                th { "Name" } th { "Kind" } th { "Last run (UTC)" } th { "By" } th { "Took" }
                th { "Runs" } th { "Skips" } th { "Overruns" } th { "Next period" }
            } }
            tbody { @for (name, job) in &found {
                tr {
                    td { (name) }
                    td { @if job.schedule { "schedule" } @else { "job" } }
                    @match job.last_run {
                        Some(run) => {
                            td.num { (run.at.format("%Y-%m-%d %H:%M:%S")) }
                            td.owner { (run.owner) }
                            td.num { @if run.kind == EventKind::JobRan { @if let Some(took) = &run.detail { (took) } } }
                        }
                        None => { td { "none in 24 h" } td {} td {} }
                    }
                    td.num { (job.runs) }
                    td.num { (job.skips) }
                    td.num { (job.overruns) }
                    td.num { @if let Some(period) = job.last_period { "#" (period + 1) } }
                }
            } } }
    };
    layout::page(&base, locker.table(), "jobs", body)
}
