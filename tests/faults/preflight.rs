//! The suite's header: before any server starts, which selected groups will be skipped on
//! this machine and why (a missing server binary, package or libfaketime), or will fail
//! because they are required here (`CI` set, or the group named in `DBLOCK_TEST_REQUIRE`).
//! The checks are the ones the scenarios skip by, so the header and the summary's SKIP
//! rows say the same thing; the header only says it before a long run, not after it.

use dblock::{MySql, Postgres};

use crate::db::FaultDb;
use crate::holder::libfaketime;
use crate::server::{Kind, Server};
use crate::{SCENARIOS, Selection, failover, galera, galera_scenarios, patroni_scenarios};
use crate::{replica, required, skew};

/// A selected group this machine lacks something for.
pub struct Gap {
    /// The scenarios it stands for, as a reader finds them in the summary.
    pub group: String,
    /// What is missing.
    pub reason: String,
    /// Whether the run fails on it here, instead of skipping it.
    pub required: bool,
}

/// Prints the header for `selection`.
pub fn print(selection: &Selection<'_>) {
    for line in header(&gaps(selection)) {
        println!("{line}");
    }
}

/// The selected groups this machine cannot run, in the order the suite runs them.
fn gaps(selection: &Selection<'_>) -> Vec<Gap> {
    let mut gaps = Vec::new();
    let wants_any = |names: &[&str]| names.iter().any(|name| selection.wants(name));
    let tracks = wants_any(SCENARIOS);
    let postgres = Server::installed(Kind::Postgres);
    let mariadb = Server::installed(Kind::MariaDb);
    if tracks && !postgres {
        gaps.push(Gap {
            group: format!("every {} scenario (groups 1-9, 12)", Postgres::LABEL),
            reason: crate::not_installed(Kind::Postgres),
            required: required("postgres"),
        });
    }
    // Clock skew needs a server of its own (SQLite shares the client's clock).
    let skewed: Vec<&str> = [(postgres, Postgres::LABEL), (mariadb, MySql::LABEL)]
        .into_iter()
        .filter_map(|(installed, label)| installed.then_some(label))
        .collect();
    if wants_any(&skew::NAMES) && !skewed.is_empty() && libfaketime().is_none() {
        gaps.push(Gap {
            group: format!("5a-5d client clock skew ({})", skewed.join(", ")),
            reason: skew::NO_FAKETIME.to_owned(),
            required: required("faketime"),
        });
    }
    if wants_any(&failover::POSTGRES_NAMES) && postgres && !replica::installed() {
        gaps.push(Gap {
            group: format!("8a-8d failover ({})", Postgres::LABEL),
            reason: failover::NO_REPLICA_TOOLS.to_owned(),
            required: required("postgres"),
        });
    }
    if let Some(reason) = patroni_scenarios::unmet()
        && wants_any(&patroni_scenarios::NAMES)
    {
        gaps.push(Gap {
            group: "11a-11d patroni".to_owned(),
            reason,
            required: required("patroni"),
        });
    }
    if tracks && !mariadb {
        gaps.push(Gap {
            group: format!("every {} scenario (groups 1-9, 12)", MySql::LABEL),
            reason: crate::not_installed(Kind::MariaDb),
            required: required("mysql"),
        });
    }
    if let Err(reason) = galera::installed()
        && wants_any(&galera_scenarios::NAMES)
    {
        gaps.push(Gap {
            group: format!("10a-10g {}", galera_scenarios::LABEL),
            reason,
            required: required("galera"),
        });
    }
    gaps
}

/// The header's lines: one per gap, after a line that says what they mean.
fn header(gaps: &[Gap]) -> Vec<String> {
    if gaps.is_empty() {
        return vec!["faults: header: every selected group has what it needs here".to_owned()];
    }
    let mut lines = vec![format!(
        "faults: header: {} selected group(s) cannot run on this machine:",
        gaps.len()
    )];
    lines.extend(gaps.iter().map(|gap| {
        let verdict = if gap.required {
            "FAILED (required here: CI or DBLOCK_TEST_REQUIRE)"
        } else {
            "skipped"
        };
        format!("faults:   {verdict}: {}: {}", gap.group, gap.reason)
    }));
    lines
}
