//! Sections 1 and 2: the uncontended cycle (try_acquire + release on distinct keys) of
//! dblock, its dialect layer alone, the hand-written statements, the seeds' plain INSERT
//! and Redis, interleaved in rounds.
//!
//! One way down: this module runs the contenders once per server
//! ([`comparison`], what the cells share) and the old design's task pattern
//! ([`anatomy`]), then hands the figures to the cells that write the report's parts:
//! [`uncontended`] (section 1's tables and targets), [`overhead`] (where dblock's
//! difference goes), [`reference`] (section 2, Redis, and fast mode).

mod anatomy;
mod comparison;
mod overhead;
mod reference;
mod uncontended;

use std::fmt::Write as _;

use crate::servers::{BenchDb, Server};
use crate::settings::Settings;

/// Runs sections 1 and 2 on every server given; returns their markdown.
pub async fn section(
    settings: &Settings,
    pg: Option<&Server<sqlx::Postgres>>,
    my: Option<&Server<sqlx::MySql>>,
    redis: Option<&redis::Client>,
) -> String {
    let mut comparisons = Vec::new();
    let mut anatomies = String::new();
    let mut problems = Vec::new();
    if let Some(pg) = pg {
        match comparison::on_backend(settings, pg, redis).await {
            Ok(mut c) => comparisons.append(&mut c),
            Err(e) => problems.push(format!("{}: {e}", pg.label)),
        }
        anatomies
            .push_str(&anatomy::markdown(&pg.label, sqlx::Postgres::select_one(&pg.pool)).await);
    }
    if let Some(my) = my {
        match comparison::on_backend(settings, my, redis).await {
            Ok(mut c) => comparisons.append(&mut c),
            Err(e) => problems.push(format!("{}: {e}", my.label)),
        }
        anatomies.push_str(&anatomy::markdown(&my.label, sqlx::MySql::select_one(&my.pool)).await);
    }
    let mut out = uncontended::markdown(&comparisons);
    for p in problems {
        let _ = writeln!(out, "Not measured: {p}\n");
    }
    out.push_str(&overhead::markdown(&comparisons));
    out.push_str(&anatomies);
    out.push_str(&reference::markdown(&comparisons, redis.is_some()));
    out.push_str(&reference::relaxed_markdown(&comparisons));
    out
}
