//! The suite's results: one row per scenario and backend, printed as a table at the end.

use std::sync::Mutex;
use std::time::Duration;

/// How a scenario ended on one backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Pass,
    Fail,
    /// Could not run here (a server or tool missing outside CI), with the reason.
    Skip,
    /// Means nothing for this backend (say, a server restart for SQLite); not counted.
    NotApplicable,
}

#[derive(Debug, Clone)]
pub struct Row {
    pub scenario: String,
    pub backend: &'static str,
    pub outcome: Outcome,
    /// What was measured, or why it failed or was skipped.
    pub detail: String,
    pub took: Duration,
}

/// Collected from every scenario; printed once at the end.
#[derive(Default)]
pub struct Report {
    rows: Mutex<Vec<Row>>,
}

impl Report {
    pub fn add(&self, row: Row) {
        let mark = match row.outcome {
            Outcome::Pass => "ok",
            Outcome::Fail => "FAILED",
            Outcome::Skip => "skipped",
            Outcome::NotApplicable => "n/a",
        };
        // Progress as it happens, so a hung run still shows how far it got.
        eprintln!(
            "faults: {} [{}] {mark} in {:.1} s: {}",
            row.scenario,
            row.backend,
            row.took.as_secs_f64(),
            row.detail
        );
        self.rows
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(row);
    }

    pub fn rows(&self) -> Vec<Row> {
        self.rows.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Prints the table and the closing count line; `true` when nothing failed.
    pub fn print(&self, elapsed: Duration) -> bool {
        let rows = self.rows();
        let scenario_width = rows
            .iter()
            .map(|r| r.scenario.len())
            .max()
            .unwrap_or(8)
            .max(8);
        println!();
        println!(
            "dblock fault suite: summary ({:.0} s)",
            elapsed.as_secs_f64()
        );
        println!(
            "{:<scenario_width$}  {:<8}  {:<7}  {:>6}  figures",
            "scenario", "backend", "outcome", "time"
        );
        println!("{}", "-".repeat(scenario_width + 40));
        for row in &rows {
            let outcome = match row.outcome {
                Outcome::Pass => "PASS",
                Outcome::Fail => "FAIL",
                Outcome::Skip => "SKIP",
                Outcome::NotApplicable => "n/a",
            };
            println!(
                "{:<scenario_width$}  {:<8}  {:<7}  {:>5.1}s  {}",
                row.scenario,
                row.backend,
                outcome,
                row.took.as_secs_f64(),
                row.detail
            );
        }
        let count = |o: Outcome| rows.iter().filter(|r| r.outcome == o).count();
        let (passed, failed, skipped) = (
            count(Outcome::Pass),
            count(Outcome::Fail),
            count(Outcome::Skip),
        );
        println!();
        // The plain closing line CI reads.
        println!("faults: {passed} passed, {failed} failed, {skipped} skipped");
        failed == 0
    }
}

/// Seconds with two decimals, for figures.
pub fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

/// Signed milliseconds, for differences between two clocks' readings.
pub fn ms(micros: i64) -> String {
    format!("{:+.0} ms", micros as f64 / 1000.0)
}

/// How far before (or after) a reference instant something happened, from their
/// difference in µs (positive: before).
pub fn before_or_after(micros: i64) -> String {
    let ms = micros.unsigned_abs() as f64 / 1000.0;
    if micros >= 0 {
        format!("{ms:.0} ms before")
    } else {
        format!("{ms:.0} ms after")
    }
}
