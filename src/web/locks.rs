//! `/`: the live locks, one page of rows in key order (`?prefix=&after=&limit=`), each with
//! its holder, fencing token, lease left, this console's waiters and what the database
//! knows of other Lockers' waiters (one statement for the page's keys).

use axum::extract::Query;
use axum::response::Response;
use maud::{Markup, html};
use serde::Deserialize;

use super::layout::{self, duration, encoded};
use super::{Base, Shared, State};
use crate::admin::{LockFilter, LockInfo, MAX_LIST_LIMIT, Waiters};

/// Rows on a page unless `?limit=` says otherwise.
pub(super) const PAGE_ROWS: u32 = 100;

/// Most rows on one page: a page stays a page (a longer listing is `dblock list`'s job).
const MAX_PAGE_ROWS: u32 = 1000;

/// The page's query: which keys, from where, how many.
#[derive(Debug, Default, Deserialize)]
pub(super) struct Paging {
    #[serde(default)]
    prefix: String,
    #[serde(default)]
    after: String,
    limit: Option<u32>,
}

/// One page of locks.
pub(super) async fn page(
    axum::extract::State(shared): State,
    base: Base,
    Query(paging): Query<Paging>,
) -> Response {
    let locker = &shared.locker;
    let limit = paging.limit.unwrap_or(PAGE_ROWS).clamp(1, MAX_PAGE_ROWS);
    // One row more than shown tells whether there is a next page.
    let filter = LockFilter::new()
        .prefix(paging.prefix.as_str())
        .after(paging.after.as_str())
        .limit((limit + 1).min(MAX_LIST_LIMIT));
    let mut rows = match locker.list_matching(&filter).await {
        Ok(rows) => rows,
        Err(err) => return layout::failure(&base, locker.table(), &err),
    };
    let more = rows.len() > limit as usize;
    rows.truncate(limit as usize);
    let keys: Vec<&str> = rows.iter().map(|row| row.key.as_str()).collect();
    let elsewhere = match locker.waiters_elsewhere(&keys).await {
        Ok(waiters) => waiters,
        Err(err) => return layout::failure(&base, locker.table(), &err),
    };
    let next = match (more, rows.last()) {
        (true, Some(last)) => Some(format!(
            "{}?prefix={}&after={}&limit={limit}",
            base.at("/"),
            encoded(&paging.prefix),
            encoded(&last.key)
        )),
        _ => None,
    };
    let body = html! {
        h1 { "Locks" }
        form method="get" action=(base.at("/")) {
            label { "Keys starting with " input type="text" name="prefix" value=(paging.prefix); }
            " " button type="submit" { "Show" }
        }
        p.note {
            "Rows of the table in key order, expired ones too until they are taken over or \
             reaped; times by the database clock. " em { "Waiting here" } " counts the \
             callers of this console's own Locker waiting for the key. "
            em { "Waiting (other processes)" } " is what the database knows of the waiters \
             of other Lockers: Lockers, not callers (a Locker with many waiting callers \
             counts once); " (elsewhere_note(locker.backend())) ". Waiters that retry with \
             plain SQL leave no trace."
        }
        (table(&base, &shared, &rows, &elsewhere))
        p.paging {
            @if !paging.after.is_empty() {
                a href=(format!("{}?prefix={}&limit={limit}", base.at("/"), encoded(&paging.prefix))) {
                    "First page"
                }
                " "
            }
            @if let Some(next) = &next {
                a rel="next" href=(next) { "Next " (limit) }
            } @else {
                span { (rows.len()) " rows on this page; no more." }
            }
        }
    };
    layout::page(&base, locker.table(), "locks", body)
}

/// What "Waiting (other processes)" shows on `backend` (an `AnyLocker::backend` name).
fn elsewhere_note(backend: &str) -> &'static str {
    match backend {
        "PostgreSQL" => {
            "on PostgreSQL only whether any waiter marked the row (yes or no): the mark \
             stays until the row is deleted, also after that waiter gave up or when it was \
             this console's own"
        }
        "MySQL" => {
            "on MySQL/MariaDB how many Lockers are registered for the key's queue (the key, \
             or a primitive's group <name>~, the same count on each of its rows): at most \
             two, further ones wait unseen, and none on Galera"
        }
        _ => {
            "on SQLite how many Lockers have a live mark on the key or its group (<name>~, \
             where a primitive's waiters mark), which their listeners keep while they wait"
        }
    }
}

/// The "Waiting (other processes)" cell of `key`: a count, or yes / no for a flag.
fn elsewhere(waiters: &Waiters, key: &str) -> String {
    match (waiters.counted, waiters.of(key)) {
        (true, n) => n.to_string(),
        (false, 0) => "no".to_owned(),
        (false, _) => "yes".to_owned(),
    }
}

fn table(base: &Base, shared: &Shared, rows: &[LockInfo], waiters: &Waiters) -> Markup {
    html! {
        table.locks {
            thead { tr {
                th { "Key" } th { "Kind" } th { "Holder (owner)" } th { "Token" }
                th { "Held for" } th { "Lease left" } th { "Waiting here" }
                th { "Waiting (other processes)" }
                @if shared.operator.is_some() { th { "Force release" } }
            } }
            tbody {
                @for row in rows {
                    tr class=[row.expired.then_some("expired")] {
                        td { a href=(base.at(&format!("/key/{}", encoded(&row.key)))) { (row.key) } }
                        td { (row.kind()) }
                        td.owner { (row.owner) }
                        td.num { (row.fencing_token) }
                        td.num { (duration(row.held_for())) }
                        @if row.expired {
                            td.num { "expired" }
                        } @else {
                            td.num.lease data-left-ms=(row.expires_in().as_millis()) {
                                (duration(row.expires_in()))
                            }
                        }
                        td.num { (shared.locker.waiting(&row.key)) }
                        td.num.elsewhere { (elsewhere(waiters, &row.key)) }
                        @if shared.operator.is_some() {
                            td { form method="post" action=(base.at("/release/confirm")) {
                                input type="hidden" name="key" value=(row.key);
                                button type="submit" { "Release…" }
                            } }
                        }
                    }
                }
            }
        }
    }
}
