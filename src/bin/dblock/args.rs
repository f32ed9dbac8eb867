//! The command line, as clap parses it. Range and format checks that clap can make here
//! are made here (exit code 2 before anything connects); the rest of the input (keys,
//! the table name) is checked by dblock itself.

use std::time::Duration;

use clap::builder::NonEmptyStringValueParser;
use clap::{Args, Parser, Subcommand};

/// Printed under `--help`: what scripts can rely on.
const EXIT_CODES: &str = "\
Exit codes:
  0  success (also: a list with no rows, a migrate or reap with nothing to do)
  1  no row for the key (show, release)
  2  usage error: bad option, URL scheme, key, table name or duration
  3  database error: cannot connect, table not migrated, statement failed
Every failure prints one line on stderr, starting with `dblock: `.";

/// Operate a dblock lock table: list and inspect locks, clear a stuck one, reap expired
/// rows, create the table. Times shown are the database clock's, never this machine's.
#[derive(Parser, Debug)]
#[command(name = "dblock", version, after_help = EXIT_CODES)]
pub(crate) struct Cli {
    /// The database: postgres://, postgresql://, mysql://, mariadb:// or sqlite:PATH.
    ///
    /// The environment's value is not shown by --help: URLs carry passwords.
    #[arg(
        long,
        global = true,
        env = "DATABASE_URL",
        hide_env_values = true,
        value_name = "URL"
    )]
    pub(crate) database_url: Option<String>,

    /// The lock table; on PostgreSQL it may be schema-qualified (schema.table).
    #[arg(long, global = true, value_name = "T", default_value = dblock::DEFAULT_TABLE)]
    pub(crate) table: String,

    /// How long to keep trying to connect before giving up (exit code 3).
    #[arg(long, global = true, value_name = "DURATION", default_value = "5s",
          value_parser = humantime::parse_duration)]
    pub(crate) connect_timeout: Duration,

    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Create the lock table, or upgrade it; safe to run again (prints "up to date").
    Migrate {
        /// Print the SQL instead, script by script, without connecting (for Flyway,
        /// Liquibase, sqlx-migrate...).
        #[arg(long)]
        print_sql: bool,
    },
    /// List lock rows in key order (bytes), expired ones too, with relative times.
    List(ListArgs),
    /// One key's row: owner, fencing token, times.
    Show {
        /// The exact key.
        #[arg(value_parser = NonEmptyStringValueParser::new())]
        key: String,
        /// One JSON object instead of `field: value` lines.
        #[arg(long)]
        json: bool,
    },
    /// Delete a key's row whoever holds it (the holder is not asked); needs --force.
    /// The lock history records it (a force_released event naming the operator).
    Release {
        /// Required: the row is deleted even while its holder is alive and working.
        #[arg(long)]
        force: bool,
        /// Who released it, for the lock history. Default: cli:$USER.
        #[arg(long, value_name = "NAME", value_parser = NonEmptyStringValueParser::new())]
        operator: Option<String>,
        /// The exact key.
        #[arg(value_parser = NonEmptyStringValueParser::new())]
        key: String,
    },
    /// Delete every expired row (live leases are never touched); prints how many.
    Reap,
    /// The lock history (what Lockers built with `history(retention)` recorded), newest
    /// first: acquisitions, releases, handoffs, losses, force-releases, jobs, periods.
    History(HistoryArgs),
    /// Serve the web console (live locks, primitives, jobs, each key's last hour,
    /// metrics) until interrupted. Every request needs the token: printed at start
    /// unless given, then sent as `?token=` once (a cookie follows) or as
    /// `Authorization: Bearer`. Read-only unless --allow-force-release.
    Web(WebArgs),
}

#[derive(Args, Debug)]
pub(crate) struct WebArgs {
    /// Where to listen. An address other than loopback needs an explicit --token (and
    /// a TLS proxy in front: the token travels in every request).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    pub(crate) listen: std::net::SocketAddr,

    /// The token every request must carry. Default: a fresh random one, printed.
    #[arg(long, value_name = "T", value_parser = token)]
    pub(crate) token: Option<String>,

    /// Show a force-release button on each lock (with a confirmation; recorded in the
    /// history as console:$USER).
    #[arg(long)]
    pub(crate) allow_force_release: bool,
}

/// A `--token`: long enough not to be guessed, and printable as it is (a URL value).
fn token(text: &str) -> Result<String, String> {
    if text.len() < 16 {
        return Err("at least 16 characters".to_owned());
    }
    if !text
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_.~".contains(&b))
    {
        return Err("only letters, digits and - _ . ~".to_owned());
    }
    Ok(text.to_owned())
}

#[derive(Args, Debug)]
pub(crate) struct HistoryArgs {
    /// The exact key, or a prefix with a trailing `*` (`invoice:*`); none: every key.
    #[arg(value_name = "KEY|PREFIX*", value_parser = NonEmptyStringValueParser::new())]
    pub(crate) key: Option<String>,

    /// Only events of the last DURATION (1h30m, 90s, 2days), by the database clock.
    #[arg(long, value_name = "DURATION", value_parser = held_duration)]
    pub(crate) since: Option<Duration>,

    /// Only events of kind K (repeatable): acquired, released, handed_off, lost,
    /// force_released, job_ran, job_skipped, job_overran, period, taken_over.
    #[arg(long, value_name = "K", value_parser = crate::history::kind)]
    pub(crate) kind: Vec<dblock::EventKind>,

    /// Only events whose owner starts with O (an owner value, or `host:pid:`).
    #[arg(long, value_name = "O", value_parser = NonEmptyStringValueParser::new())]
    pub(crate) owner: Option<String>,

    /// At most N events (the newest).
    #[arg(long, value_name = "N", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(dblock::MAX_HISTORY_LIMIT)))]
    pub(crate) limit: u32,

    /// One JSON object per event and line, instead of the table.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args, Debug)]
pub(crate) struct ListArgs {
    /// Only keys that start with P (compared as bytes).
    #[arg(long, value_name = "P", default_value = "")]
    pub(crate) prefix: String,

    /// Only rows whose lease has run out.
    #[arg(long)]
    pub(crate) expired: bool,

    /// Only rows acquired at least DURATION ago (1h30m, 90s, 2days): locks that may have
    /// leaked. The rows of dblock's `LockFilter::held_longer_than`, expired ones too
    /// (marked so); the reaper's leak check reaps those first and reports the rest.
    #[arg(long, value_name = "DURATION", value_parser = held_duration)]
    pub(crate) held_longer_than: Option<Duration>,

    /// At most N rows; a note on stderr says when more were left out.
    #[arg(long, value_name = "N", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(dblock::MAX_LIST_LIMIT)))]
    pub(crate) limit: u32,

    /// One JSON object per row and line, instead of the table.
    #[arg(long)]
    pub(crate) json: bool,
}

/// The longest `--held-longer-than`: the library's own bound, checked here too so that a
/// typo is a usage error said in the CLI's words.
const MAX_HELD: Duration = dblock::MAX_HELD_LONGER_THAN;

/// A `--held-longer-than` value: a duration as people write it, up to [`MAX_HELD`].
fn held_duration(text: &str) -> Result<Duration, String> {
    let held = humantime::parse_duration(text).map_err(|err| err.to_string())?;
    match held <= MAX_HELD {
        true => Ok(held),
        false => Err("at most 1000 years".to_owned()),
    }
}
