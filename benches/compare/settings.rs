//! What a run measures and for how long: environment variables, overridden by flags.

use std::path::PathBuf;
use std::time::Duration;

const HELP: &str = "\
cargo bench --bench compare [-- FLAGS]

Flags (each also an environment variable; the flag wins):
  --rounds N          DBLOCK_BENCH_ROUNDS       rounds per comparison (default 5)
  --round-secs S      DBLOCK_BENCH_ROUND_SECS   seconds per contender per round (default 1)
  --long                                        rounds 15, round-secs 3: for a quiet machine
  --sections LIST     DBLOCK_BENCH_SECTIONS     any of cycle,hotkey,stock,renewal,reaper,
                                                primitives,history,console (console:
                                                built with --features web) (default: all)
  --cells LIST        DBLOCK_BENCH_CELLS        only these cells, and their sections: cells of
                                                sections 3 and 7 by number (3.1, 3.1b, 3.2,
                                                3.3, 3.4, 7.1, 7.2, 7.3, 7.4, 8.1, 8.2, 9.1), or a
                                                section's number for all of it (1 to 9)
                                                (default: all)
  --guards LIST       DBLOCK_BENCH_GUARDS       guards held through one Locker in the renewal
                                                section, one run each (default 1000,10000)
  --reap-rows N       DBLOCK_BENCH_REAP_ROWS    expired rows per reaper round (default 100000)
  --out PATH          DBLOCK_BENCH_OUT          report file (default bench/RESULTS.md)
Servers (empty or `off` skips one):
  DBLOCK_BENCH_POSTGRES_URL  default postgres://postgres@127.0.0.1:5432/test
  DBLOCK_BENCH_MYSQL_URL     default mysql://root@127.0.0.1:3306/test
  DBLOCK_BENCH_REDIS_URL     default redis://127.0.0.1:6379
SQLite (cells 3.2, 7.2, 7.3 and 9.1; `off` skips it):
  DBLOCK_BENCH_SQLITE        a directory for the bench's database file, made fresh in a
                             directory of its own and removed afterwards (default: the
                             system's temp dir)
";

/// The sections of the report, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    Cycle,
    HotKey,
    Stock,
    Renewal,
    Reaper,
    Primitives,
    History,
    Console,
}

impl Section {
    const ALL: [Section; 8] = [
        Section::Cycle,
        Section::HotKey,
        Section::Stock,
        Section::Renewal,
        Section::Reaper,
        Section::Primitives,
        Section::History,
        Section::Console,
    ];

    /// Its numbers in the report.
    fn numbers(self) -> &'static [&'static str] {
        match self {
            Section::Cycle => &["1", "2"],
            Section::HotKey => &["3"],
            Section::Stock => &["4"],
            Section::Renewal => &["5"],
            Section::Reaper => &["6"],
            Section::Primitives => &["7"],
            Section::History => &["8"],
            Section::Console => &["9"],
        }
    }

    fn name(self) -> &'static str {
        match self {
            Section::Cycle => "cycle",
            Section::HotKey => "hotkey",
            Section::Stock => "stock",
            Section::Renewal => "renewal",
            Section::Reaper => "reaper",
            Section::Primitives => "primitives",
            Section::History => "history",
            Section::Console => "console",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Settings {
    pub postgres_url: Option<String>,
    pub mysql_url: Option<String>,
    pub redis_url: Option<String>,
    /// Where the SQLite cells' database file goes; `None`: no SQLite.
    pub sqlite_dir: Option<PathBuf>,
    pub rounds: usize,
    pub round: Duration,
    pub sections: Vec<Section>,
    /// The cells picked (`--cells`), `None` for all.
    pub cells: Option<Vec<String>>,
    pub guards: Vec<usize>,
    pub reap_rows: u64,
    pub out: PathBuf,
    /// The flags as given, for the report's "how this was made" line.
    pub args: Vec<String>,
}

impl Settings {
    pub fn runs(&self, section: Section) -> bool {
        let picked = |cell: &String| {
            let number = cell.split('.').next().unwrap_or_default();
            section.numbers().contains(&number)
        };
        self.sections.contains(&section) && self.cells.as_ref().is_none_or(|c| c.iter().any(picked))
    }

    /// Whether cell `id` (`3.2`) runs, its section running: all do unless `--cells` picked
    /// others.
    pub fn runs_cell(&self, id: &str) -> bool {
        let section = id.split('.').next().unwrap_or_default();
        self.cells
            .as_ref()
            .is_none_or(|cells| cells.iter().any(|c| c == id || c == section))
    }

    /// Reads the environment, then the flags. Exits with the help text on `--help` or on a
    /// flag it does not know.
    pub fn from_env_and_args() -> Settings {
        let mut s = Settings {
            postgres_url: server_url(
                "DBLOCK_BENCH_POSTGRES_URL",
                "postgres://postgres@127.0.0.1:5432/test",
            ),
            mysql_url: server_url("DBLOCK_BENCH_MYSQL_URL", "mysql://root@127.0.0.1:3306/test"),
            redis_url: server_url("DBLOCK_BENCH_REDIS_URL", "redis://127.0.0.1:6379"),
            sqlite_dir: match std::env::var("DBLOCK_BENCH_SQLITE") {
                Ok(v) if v == "off" => None,
                Ok(v) if !v.is_empty() => Some(PathBuf::from(v)),
                _ => Some(std::env::temp_dir()),
            },
            rounds: 5,
            round: Duration::from_secs(1),
            sections: Section::ALL.to_vec(),
            cells: None,
            guards: vec![1000, 10_000],
            reap_rows: 100_000,
            out: PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/bench/RESULTS.md")),
            args: Vec::new(),
        };
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        if let Some(v) = env("DBLOCK_BENCH_ROUNDS") {
            s.rounds = parse("DBLOCK_BENCH_ROUNDS", &v);
        }
        if let Some(v) = env("DBLOCK_BENCH_ROUND_SECS") {
            s.round = secs("DBLOCK_BENCH_ROUND_SECS", &v);
        }
        if let Some(v) = env("DBLOCK_BENCH_SECTIONS") {
            s.sections = sections(&v);
        }
        if let Some(v) = env("DBLOCK_BENCH_CELLS") {
            s.cells = Some(cells(&v));
        }
        if let Some(v) = env("DBLOCK_BENCH_GUARDS") {
            s.guards = counts("DBLOCK_BENCH_GUARDS", &v);
        }
        if let Some(v) = env("DBLOCK_BENCH_REAP_ROWS") {
            s.reap_rows = parse("DBLOCK_BENCH_REAP_ROWS", &v);
        }
        if let Some(v) = env("DBLOCK_BENCH_OUT") {
            s.out = PathBuf::from(v);
        }

        let mut args = std::env::args().skip(1);
        while let Some(flag) = args.next() {
            let mut value = || {
                args.next()
                    .unwrap_or_else(|| usage(&format!("{flag} needs a value")))
            };
            match flag.as_str() {
                // `cargo bench` passes --bench to every bench binary.
                "--bench" => continue,
                "--rounds" => s.rounds = parse(&flag, &value()),
                "--round-secs" => s.round = secs(&flag, &value()),
                "--long" => {
                    s.rounds = 15;
                    s.round = Duration::from_secs(3);
                }
                "--sections" => s.sections = sections(&value()),
                "--cells" => s.cells = Some(cells(&value())),
                "--guards" => s.guards = counts(&flag, &value()),
                "--reap-rows" => s.reap_rows = parse(&flag, &value()),
                "--out" => s.out = PathBuf::from(value()),
                "--help" | "-h" => {
                    print!("{HELP}");
                    std::process::exit(0);
                }
                other => usage(&format!("unknown flag {other}")),
            }
        }
        if s.rounds == 0
            || s.round.is_zero()
            || s.guards.is_empty()
            || s.guards.contains(&0)
            || s.reap_rows == 0
        {
            usage("rounds, round-secs, guards and reap-rows must be positive");
        }
        s.args = std::env::args()
            .skip(1)
            .filter(|a| a != "--bench")
            .collect();
        s
    }
}

fn server_url(var: &str, default: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(v) if v.is_empty() || v == "off" => None,
        Ok(v) => Some(v),
        Err(_) => Some(default.to_owned()),
    }
}

fn usage(problem: &str) -> ! {
    eprintln!("compare: {problem}\n\n{HELP}");
    std::process::exit(2);
}

fn parse<T: std::str::FromStr>(what: &str, value: &str) -> T {
    value
        .parse()
        .unwrap_or_else(|_| usage(&format!("{what}: cannot read {value:?}")))
}

fn counts(what: &str, list: &str) -> Vec<usize> {
    list.split(',')
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(|v| parse(what, v))
        .collect()
}

fn secs(what: &str, value: &str) -> Duration {
    let secs: f64 = parse(what, value);
    Duration::try_from_secs_f64(secs).unwrap_or_else(|_| usage(&format!("{what}: bad duration")))
}

fn sections(list: &str) -> Vec<Section> {
    list.split(',')
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .map(|name| {
            Section::ALL
                .into_iter()
                .find(|s| s.name() == name)
                .unwrap_or_else(|| usage(&format!("unknown section {name:?}")))
        })
        .collect()
}

/// The cells `--cells` may name besides a section's number.
const CELLS: [&str; 12] = [
    "3.1", "3.1b", "3.2", "3.3", "3.4", "7.1", "7.2", "7.3", "7.4", "8.1", "8.2", "9.1",
];

fn cells(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|id| !id.is_empty())
        .map(|id| {
            let known =
                CELLS.contains(&id) || Section::ALL.iter().any(|s| s.numbers().contains(&id));
            if !known {
                usage(&format!("unknown cell {id:?}"));
            }
            id.to_owned()
        })
        .collect()
}
