//! Section 8: what the lock history (`LockerBuilder::history`) costs. Cell 8.1: the
//! uncontended cycle with history on vs off, interleaved in the same rounds (issue 44's
//! target: on >= 0.95x off). Cell 8.2: the history statements a tick of one Locker that
//! takes, holds and drops 10,000 guards (target: at most one a tick).

mod batches;
mod cycle;

use crate::servers::{BenchDb, Server};
use crate::settings::Settings;

/// Runs section 8's cells on one server; returns their markdown.
pub async fn section<DB: BenchDb>(settings: &Settings, server: &Server<DB>) -> String {
    let mut out = format!("### {}\n\n", server.label);
    if settings.runs_cell("8.1") {
        out.push_str(&cycle::markdown(settings, server).await);
    }
    if settings.runs_cell("8.2") {
        out.push_str(&batches::markdown(server).await);
    }
    out
}
