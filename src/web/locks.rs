//! `/`: the live locks, one page of rows in key order (`?prefix=&after=&limit=`), each with
//! its holder, fencing token, lease left and this process's waiters.

use axum::extract::Query;
use axum::response::Response;
use maud::{Markup, html};
use serde::Deserialize;

use super::layout::{self, duration, encoded};
use super::{Base, Shared, State};
use crate::admin::{LockFilter, LockInfo, MAX_LIST_LIMIT};

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
             reaped; times by the database clock. " em { "Waiting here" } " counts only the \
             callers of this console's own Locker waiting for the key; waiters in other \
             processes are not visible to it."
        }
        (table(&base, &shared, &rows))
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

fn table(base: &Base, shared: &Shared, rows: &[LockInfo]) -> Markup {
    html! {
        table.locks {
            thead { tr {
                th { "Key" } th { "Kind" } th { "Holder (owner)" } th { "Token" }
                th { "Held for" } th { "Lease left" } th { "Waiting here" }
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
