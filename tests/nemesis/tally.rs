//! What the workers said on stdout, counted as the lines come in (a killed worker's
//! lines up to its death are counted too).

use std::collections::{BTreeMap, HashMap};

use crate::db::Kind;

/// How many failure messages of each phase the report keeps, as samples.
const SAMPLES: usize = 3;

/// A write a worker saw commit: it must be in the history as it said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acked {
    pub kind: Kind,
    pub seq: i64,
    pub token: i64,
    pub worker: i32,
    pub incarnation: i32,
}

/// The workers' events, per kind where it applies.
#[derive(Debug, Default)]
pub struct Tally {
    pub acquisitions: BTreeMap<Kind, u64>,
    pub written: BTreeMap<Kind, u64>,
    pub refused: BTreeMap<Kind, u64>,
    pub timeouts: BTreeMap<Kind, u64>,
    /// By phase (`acquire`, `write`, `release`) and kind.
    pub failed: BTreeMap<(String, Kind), u64>,
    /// By kind and outcome (`ok`, `not_held`, `expired`).
    pub released: BTreeMap<(Kind, String), u64>,
    /// Leases whose `lost()` had fired by their release, by kind and reason.
    pub lost: BTreeMap<(Kind, String), u64>,
    pub acked: Vec<Acked>,
    /// MariaDB connection ids, per worker and incarnation.
    pub connections: HashMap<(i32, i32), Vec<u64>>,
    /// `ERROR` lines and lines that are not part of the protocol.
    pub errors: Vec<String>,
    /// The first few distinct failure messages per phase.
    pub samples: BTreeMap<String, Vec<String>>,
}

impl Tally {
    /// Counts one line of worker `worker` (incarnation `incarnation`).
    pub fn record(&mut self, worker: i32, incarnation: i32, line: &str) {
        if let Err(err) = self.parse(worker, incarnation, line) {
            self.errors
                .push(format!("worker {worker}/{incarnation}: {err}: {line:?}"));
        }
    }

    fn parse(&mut self, worker: i32, incarnation: i32, line: &str) -> Result<(), String> {
        let mut words = line.splitn(4, ' ');
        let tag = words.next().unwrap_or_default();
        let mut next = || words.next().ok_or("a word is missing");
        let bump = |map: &mut BTreeMap<Kind, u64>, kind: Kind| *map.entry(kind).or_default() += 1;
        match tag {
            "CONN" => {
                let id = next()?.parse().map_err(|e| format!("{e}"))?;
                self.connections
                    .entry((worker, incarnation))
                    .or_default()
                    .push(id);
            }
            "ACQ" => bump(&mut self.acquisitions, next()?.parse()?),
            "WROTE" => {
                let kind: Kind = next()?.parse()?;
                let token = next()?.parse().map_err(|e| format!("{e}"))?;
                let seq = next()?.parse().map_err(|e| format!("{e}"))?;
                bump(&mut self.written, kind);
                self.acked.push(Acked {
                    kind,
                    seq,
                    token,
                    worker,
                    incarnation,
                });
            }
            "REFUSED" => bump(&mut self.refused, next()?.parse()?),
            "TIMEOUT" => bump(&mut self.timeouts, next()?.parse()?),
            "FAILED" => {
                let phase = next()?.to_owned();
                let kind: Kind = next()?.parse()?;
                let message = next().unwrap_or_default();
                *self.failed.entry((phase.clone(), kind)).or_default() += 1;
                let samples = self.samples.entry(phase).or_default();
                let sample = format!("{kind}: {message}");
                if samples.len() < SAMPLES && !samples.contains(&sample) {
                    samples.push(sample);
                }
            }
            "RELEASED" => {
                let kind = next()?.parse()?;
                *self.released.entry((kind, next()?.to_owned())).or_default() += 1;
            }
            "LOST" => {
                let kind = next()?.parse()?;
                *self.lost.entry((kind, next()?.to_owned())).or_default() += 1;
            }
            "ERROR" => self
                .errors
                .push(format!("worker {worker}/{incarnation}: {line}")),
            _ => return Err("not a line of the protocol".to_owned()),
        }
        Ok(())
    }

    pub fn get(map: &BTreeMap<Kind, u64>, kind: Kind) -> u64 {
        map.get(&kind).copied().unwrap_or(0)
    }
}
