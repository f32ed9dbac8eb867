//! Section 7, cell 3: one election, 4 candidates in 4 real OS processes, each with its
//! own Locker and pool; the leader resigns after 0.5-1.5 s (random) and campaigns
//! again at once. Counts the resignations, and how many were followed by the lead of a
//! candidate of another process rather than the resigner's own.
//!
//! Each worker reports its leads with their terms: a lead's term is its row's fencing
//! token, which rises with every lead, so all workers' leads sorted by term are the
//! order of leads across processes, and the lead after a resignation is the next one in
//! that order, without comparing clocks.

use std::fmt::Write as _;

use super::procs::{self, LEAD_MS, TAKE_OVER};
use crate::measure::{median, new_owner, spread};
use crate::report::{Table, count, ms_f, verdict};
use crate::servers::{LockDb, Server};
use crate::settings::Settings;
use crate::workers::{self, Job, Lead, Mode, Report};

const TABLE: &str = "bench_lock_election_procs";
const PROCESSES: usize = 4;
/// A round is this many times the bench's round: leads of about a second each.
const ROUND_FACTOR: u32 = 10;
/// Issue 45's target: the share of resignations followed by another process's lead.
const HANDED_TARGET: f64 = 0.90;

/// What followed the resignations of one round.
#[derive(Default)]
struct Handovers {
    /// Per process: its resignations by choice, and how many of them the next lead was
    /// another process's.
    resigned: Vec<u64>,
    handed: Vec<u64>,
    /// Resignations no lead followed within the round.
    unfollowed: u64,
    /// Leads whose term another lead of the round had too (none should).
    same_term: u64,
    /// Seconds from each resignation's call to the next lead (any process's) by the
    /// wall clock, which the workers of one machine share.
    gaps: Vec<f64>,
}

impl Handovers {
    fn of(round: &[Report]) -> Handovers {
        let mut leads: Vec<(usize, Lead)> = round
            .iter()
            .enumerate()
            .flat_map(|(p, r)| r.leads.iter().map(move |&lead| (p, lead)))
            .collect();
        leads.sort_by_key(|(_, lead)| lead.term);
        let mut h = Handovers {
            resigned: vec![0; round.len()],
            handed: vec![0; round.len()],
            ..Handovers::default()
        };
        h.same_term = leads
            .windows(2)
            .filter(|w| w[0].1.term == w[1].1.term)
            .count() as u64;
        for (i, &(p, lead)) in leads.iter().enumerate() {
            if !lead.at_will {
                continue;
            }
            h.resigned[p] += 1;
            match leads.get(i + 1) {
                Some(&(next_p, next)) => {
                    h.handed[p] += u64::from(next_p != p);
                    h.gaps
                        .push(next.granted.saturating_sub(lead.ended) as f64 / 1e9);
                }
                None => h.unfollowed += 1,
            }
        }
        h
    }

    fn resignations(&self) -> u64 {
        self.resigned.iter().sum()
    }

    fn handed_over(&self) -> u64 {
        self.handed.iter().sum()
    }

    fn handed_share(&self) -> f64 {
        self.handed_over() as f64 / self.resignations() as f64
    }
}

/// Cell 3 on one server; its markdown.
pub async fn cell<DB: LockDb>(
    settings: &Settings,
    server: &Server<DB>,
) -> Result<String, Box<dyn std::error::Error>> {
    drop(server.fresh_locker(TABLE).await?);
    let run = new_owner()[..8].to_owned();
    let length = settings.round * ROUND_FACTOR;
    let mut rounds: Vec<Vec<Report>> = Vec::new();
    for r in 0..settings.rounds {
        eprintln!(
            "primitives: {}, election, {PROCESSES} processes, round {}/{}",
            server.label,
            r + 1,
            settings.rounds
        );
        let name = format!("elect-{run}-{r}");
        let job = Job::new(Mode::Election, TABLE, &name, 1, length);
        rounds.push(workers::round(&server.url, &job, PROCESSES).await?);
    }
    DB::drop_lock_table(&server.pool, TABLE).await?;
    let handovers: Vec<Handovers> = rounds.iter().map(|r| Handovers::of(r)).collect();

    let mut table = Table::new(&[
        "process",
        "leads",
        "share of the leads",
        "resignations",
        "followed by another process's lead",
        "errors to callers (campaign / resign)",
    ]);
    for p in 0..PROCESSES {
        let shares: Vec<f64> = rounds.iter().map(|round| procs::share(round, p)).collect();
        let (lo, hi) = spread(shares.iter().copied());
        let resigned: u64 = handovers.iter().map(|h| h.resigned[p]).sum();
        let handed: u64 = handovers.iter().map(|h| h.handed[p]).sum();
        let acquire_errors: u64 = rounds.iter().map(|round| round[p].acquire_errors).sum();
        let release_errors: u64 = rounds.iter().map(|round| round[p].release_errors).sum();
        table.row(vec![
            format!("{} (own Locker, 1 candidate)", p + 1),
            count(
                rounds
                    .iter()
                    .map(|round| round[p].acquisitions as f64)
                    .sum(),
            ),
            format!(
                "{:.0} % ({:.0}-{:.0})",
                median(shares.iter().copied()) * 100.0,
                lo * 100.0,
                hi * 100.0
            ),
            count(resigned as f64),
            count(handed as f64),
            format!("{acquire_errors} / {release_errors}"),
        ]);
    }
    let mut out = format!(
        "One election, {PROCESSES} candidates, one per process; the leader resigns after \
         {}-{} s (random) and campaigns again at once; {} rounds of {:.0} s. A leader \
         resigns by choice only with at least {} ms of the round left (time for another \
         candidate to take over); its last lead of a round ends at the round's end and is \
         not counted. The lead that follows a resignation is the one with the next term \
         (terms rise with every lead).\n\n",
        LEAD_MS.0 as f64 / 1e3,
        LEAD_MS.1 as f64 / 1e3,
        settings.rounds,
        length.as_secs_f64(),
        TAKE_OVER.as_millis(),
    );
    out.push_str(&table.render());
    out.push('\n');
    let shares: Vec<f64> = handovers.iter().map(Handovers::handed_share).collect();
    let share_median = median(shares.iter().copied());
    let (lo, hi) = spread(shares.iter().copied());
    let resignations: u64 = handovers.iter().map(Handovers::resignations).sum();
    let handed: u64 = handovers.iter().map(Handovers::handed_over).sum();
    let _ = writeln!(
        out,
        "- Target: resignations followed by another process's lead >= {:.0} % -> {} ({:.0} \
         %, median of rounds; {:.0}-{:.0} % across rounds; {handed} of {resignations} in \
         all).",
        HANDED_TARGET * 100.0,
        verdict(share_median >= HANDED_TARGET),
        share_median * 100.0,
        lo * 100.0,
        hi * 100.0,
    );
    let mut gaps: Vec<f64> = handovers.iter().flat_map(|h| h.gaps.clone()).collect();
    gaps.sort_by(f64::total_cmp);
    let _ = writeln!(
        out,
        "- From a resignation's call to the next lead (any process's, the resigner's \
         included; wall clock): p50 {} ms, longest {} ms (reported, no target).",
        ms_f(median(gaps.iter().copied())),
        ms_f(gaps.last().copied().unwrap_or(f64::NAN)),
    );
    let unfollowed: u64 = handovers.iter().map(|h| h.unfollowed).sum();
    if unfollowed > 0 {
        let _ = writeln!(
            out,
            "- {unfollowed} resignations had no lead after them within their round \
             (counted as not handed over)."
        );
    }
    let same_term: u64 = handovers.iter().map(|h| h.same_term).sum();
    if same_term > 0 {
        let _ = writeln!(out, "- {same_term} leads had the term of another lead.");
    }
    procs::push_notes(&mut out, &rounds);
    Ok(out)
}
