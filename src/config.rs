//! Named defaults, limits, and the validation every public entry point runs before it
//! touches the database.

use std::time::Duration;

use crate::error::{Error, Result};

/// The table created by [`Locker::migrate`](crate::Locker::migrate) unless the builder names
/// another one.
pub const DEFAULT_TABLE: &str = "distributed_lock";
/// The table a PostgreSQL Locker built with [`Durability::Relaxed`] uses unless the
/// builder names another one: never the durable default, so relaxed and durable locks
/// never share a table.
pub const DEFAULT_RELAXED_TABLE: &str = "distributed_lock_relaxed";

/// Whether a PostgreSQL lock table's rows survive a server crash
/// ([`LockerBuilder::durability`](crate::LockerBuilder::durability)).
///
/// ```
/// use dblock::Durability;
///
/// assert_eq!(Durability::default(), Durability::Durable);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Durability {
    /// Every acquisition and release is committed to the write-ahead log and replicated:
    /// locks survive a crash, a restart and a failover. The default.
    #[default]
    Durable,
    /// The lock table is `UNLOGGED`: no write-ahead log for its rows, several times the
    /// cycles a second on a server whose disk flushes are slow. A server crash or a
    /// failover empties it: every held lock is lost (its holder learns within one renewal
    /// interval, as [`LostReason::Deleted`](crate::LostReason::Deleted)). Fencing tokens
    /// still never go backwards (the token sequence stays logged, and the first
    /// acquisition after a server start moves it 2^32 ahead), and
    /// [`LockGuard::assert_held`](crate::LockGuard::assert_held) still refuses a stale
    /// holder's writes.
    Relaxed,
}

/// Longest accepted lock key, in bytes (the column is `VARCHAR(128)`).
pub const MAX_KEY_BYTES: usize = 128;
/// Longest accepted owner prefix, in bytes; the owner value adds 32 hex digits of a UUID
/// and must fit the `VARCHAR(64)` column.
pub const MAX_OWNER_PREFIX_BYTES: usize = 32;
/// Longest accepted table name. Derived objects (`<table>_fencing_seq`, `<table>_history`,
/// index and trigger names) must stay within PostgreSQL's 63 and MySQL's 64 characters.
pub const MAX_TABLE_NAME_BYTES: usize = 40;
/// Longest accepted schema-qualified table name (`schema.table`, PostgreSQL only), each
/// part at most [`MAX_TABLE_NAME_BYTES`]: the wake-up channel `dblock:<schema>.<table>`
/// must fit PostgreSQL's 63-byte identifiers.
pub const MAX_QUALIFIED_TABLE_NAME_BYTES: usize = 56;
/// Shortest accepted lease: SQLite's clock counts milliseconds.
pub const MIN_LEASE: Duration = Duration::from_millis(1);
/// Longest accepted lease (one day). Longer work should keep a shorter lease renewed.
pub const MAX_LEASE: Duration = Duration::from_secs(24 * 60 * 60);
/// Longest accepted wait for [`Locker::acquire`](crate::Locker::acquire) (one day).
pub const MAX_WAIT: Duration = Duration::from_secs(24 * 60 * 60);
/// First retry sleep of a waiting acquire, before jitter.
pub const DEFAULT_RETRY_INITIAL: Duration = Duration::from_millis(10);
/// Cap on any one retry sleep of a waiting acquire, before jitter.
pub const DEFAULT_RETRY_MAX: Duration = Duration::from_millis(500);

/// The lease [`Locker::lease`](crate::Locker::lease) suggests and the renewal interval
/// is checked against (Redisson's watchdog default).
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// How often the watchdog renews a held lease by default; a guard renews at
/// `min(interval, lease / 3)`, so short leases are renewed often enough.
pub const DEFAULT_RENEW_INTERVAL: Duration = Duration::from_secs(10);
/// The fixed part of the default lease margin (see
/// [`LockerBuilder::lease_margin`](crate::LockerBuilder::lease_margin)), capped at a tenth
/// of the lease for short leases.
pub const DEFAULT_LEASE_MARGIN: Duration = Duration::from_millis(100);
/// The drift part of every lease margin: `lease / LEASE_DRIFT_DIVISOR` (1 %), for clocks
/// that run at different rates and timers that fire late.
pub const LEASE_DRIFT_DIVISOR: u32 = 100;

/// How long before the database may see a lease expire that dblock ends it locally.
///
/// A lease's local deadline is the send time of the last statement that set its expiry
/// (the acquisition, a renewal, an `extend`), plus the lease, **minus this margin**. The
/// database starts counting the lease only once the statement reaches it, so its expiry
/// is never earlier than `send time + lease` by the database clock; ending the lease a
/// margin sooner covers what can still make the holder learn late: the client's clock
/// running slower than the server's, a timer that fires a millisecond late, a task
/// scheduled late on a busy machine. At the deadline [`LockGuard::lost`](crate::LockGuard::lost)
/// completes, [`LockGuard::lost_reason`](crate::LockGuard::lost_reason) turns `Some` and
/// [`Locker::with_lock`](crate::Locker::with_lock) drops its work, whether or not a renewal
/// is in flight; an acquisition or `extend` answered after it yields no lease.
///
/// The margin of a lease `l` is `fixed + l / 100`, where `fixed` is
/// [`DEFAULT_LEASE_MARGIN`] (100 ms) capped at `l / 10` by default, or what
/// [`LockerBuilder::lease_margin`](crate::LockerBuilder::lease_margin) sets: 3 s leases end
/// 130 ms early, 30 s leases 400 ms early, 100 ms leases 11 ms early. A lease must exceed
/// its margin plus its renew interval; the default margin always leaves room.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dblock::Error> {
/// use std::time::Duration;
/// use dblock::Locker;
///
/// let pool = dblock::sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// let locker = Locker::new(pool.clone());
/// assert_eq!(locker.lease_margin(Duration::from_secs(3)), Duration::from_millis(130));
/// assert_eq!(locker.lease_margin(Duration::from_secs(30)), Duration::from_millis(400));
///
/// // A wider fixed part, for a client whose timers may fire late by more than 100 ms.
/// let wary = Locker::builder(pool).lease_margin(Duration::from_millis(500)).build()?;
/// assert_eq!(wary.lease_margin(Duration::from_secs(30)), Duration::from_millis(800));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct LeaseMargin {
    /// The fixed part; `None`: [`DEFAULT_LEASE_MARGIN`], capped at a tenth of the lease.
    pub(crate) fixed: Option<Duration>,
}

impl LeaseMargin {
    /// The margin of a lease of `lease`.
    pub(crate) fn of(&self, lease: Duration) -> Duration {
        let fixed = self
            .fixed
            .unwrap_or_else(|| DEFAULT_LEASE_MARGIN.min(lease / 10));
        fixed + lease / LEASE_DRIFT_DIVISOR
    }

    /// Refuses a lease that would end locally before its first renewal could run: it must
    /// exceed its margin plus its renew interval (`renew`, `None` when not renewed).
    pub(crate) fn check(&self, lease: Duration, renew: Option<Duration>) -> Result<()> {
        let margin = self.of(lease);
        let interval = renew.unwrap_or(Duration::ZERO);
        if margin + interval >= lease {
            return Err(Error::InvalidDuration {
                what: "lease",
                value: lease,
                reason: format!(
                    "must exceed its margin ({margin:?}, LockerBuilder::lease_margin) plus its                      renew interval ({interval:?}): the lease would end locally before it                      could be renewed"
                ),
            });
        }
        Ok(())
    }
}

/// How often a reaper started with [`ReaperConfig::default`](crate::ReaperConfig) runs.
pub const DEFAULT_REAP_INTERVAL: Duration = Duration::from_secs(60);
/// The bound on every lock-table statement that is neither an acquisition attempt nor a
/// release or extension (those are bounded by their lease): `list`, `holder`, the
/// database clock, `force_release`, reaper batches, fair mode's tickets, the engine's
/// renewal batches and the listener's statements. A statement that gets no answer by
/// then is abandoned and its connection closed. Ten seconds: a lock-table statement
/// takes milliseconds when the database answers (it waits for no row lock longer than
/// an attempt's deadline), so ten seconds is three orders of magnitude of headroom for a
/// loaded server, and short enough that a caller learns of a dead network long before
/// the pool's acquire timeout (sqlx: 30 s) or TCP's retransmission limit (~15 min).
/// [`LockerBuilder::statement_timeout`](crate::LockerBuilder::statement_timeout) sets
/// another.
pub const DEFAULT_STATEMENT_TIMEOUT: Duration = Duration::from_secs(10);
/// Shortest accepted statement timeout.
pub const MIN_STATEMENT_TIMEOUT: Duration = Duration::from_millis(100);
/// Longest accepted statement timeout (one hour).
pub const MAX_STATEMENT_TIMEOUT: Duration = Duration::from_secs(60 * 60);
/// The bound on [`Locker::migrate`](crate::Locker::migrate): longer than the statement
/// timeout, because a migration may wait for another process's migration (they take
/// turns under a lock) and its DDL for the locks of live transactions on the table.
pub const MIGRATION_TIMEOUT: Duration = Duration::from_secs(5 * 60);
/// How long past its wait a waiting [`Locker::acquire`](crate::Locker::acquire) may take
/// to answer when the database does not: an attempt sent just before the wait ran out
/// gets this long to answer, and reading who held the key for the
/// [`Error::Timeout`](crate::Error::Timeout) half a second more. So `acquire(key, lease,
/// wait)` answers within `wait + WAIT_SLACK + 0.5 s` whatever the network does.
pub const WAIT_SLACK: Duration = Duration::from_secs(1);
/// Rows deleted per reaper statement by default: bounded so a large backlog never holds
/// many row locks at once.
pub const DEFAULT_REAP_BATCH: u32 = 1000;

/// How a waiting acquire spaces its attempts: exponential backoff with full jitter, each
/// sleep a uniform draw from `[0, min(max, initial * 2^n)]`.
///
/// # Default
/// `initial` = [`DEFAULT_RETRY_INITIAL`] (10 ms), `max` = [`DEFAULT_RETRY_MAX`] (500 ms).
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use dblock::{Locker, RetryPolicy};
///
/// let default = RetryPolicy::default();
/// assert_eq!(default.initial, Duration::from_millis(10));
/// assert_eq!(default.max, Duration::from_millis(500));
///
/// // Sleeps drawn from [0, 5 ms], [0, 10 ms], [0, 20 ms], ... capped at 100 ms.
/// let policy = RetryPolicy {
///     initial: Duration::from_millis(5),
///     max: Duration::from_millis(100),
/// };
/// assert!(policy.delays().take(10).all(|sleep| sleep <= policy.max));
///
/// let pool = dblock::sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// let locker = Locker::builder(pool).retry(policy).build()?; // how `acquire` waits
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Upper bound of the first sleep.
    pub initial: Duration,
    /// Upper bound of every later sleep.
    pub max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            initial: DEFAULT_RETRY_INITIAL,
            max: DEFAULT_RETRY_MAX,
        }
    }
}

impl RetryPolicy {
    /// The sleeps of this policy, one per failed attempt, forever.
    pub fn delays(&self) -> impl Iterator<Item = Duration> + Send + use<> {
        let (initial, max) = (self.initial, self.max);
        (0u32..).map(move |attempt| {
            let ceiling = initial
                .saturating_mul(2u32.saturating_pow(attempt.min(31)))
                .min(max);
            ceiling.mul_f64(fastrand::f64())
        })
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.initial.is_zero() || self.max < self.initial {
            return Err(Error::InvalidConfig(format!(
                "retry policy needs 0 < initial <= max, got {self:?}"
            )));
        }
        Ok(())
    }
}

/// Marks the rows of a coordination primitive: a semaphore's permits, a read-write
/// lock's readers and writer, an election's leader are rows keyed `<name>~<part>`, and
/// `<name>~` is the key of the local queue their waiters line up in.
pub(crate) const GROUP_MARK: char = '~';

/// The group `key` belongs to: its text up to and including the last [`GROUP_MARK`].
pub(crate) fn group_of(key: &str) -> Option<&str> {
    key.rfind(GROUP_MARK)
        .map(|at| &key[..at + GROUP_MARK.len_utf8()])
        .filter(|group| group.len() < key.len())
}

/// Rejects keys the table cannot hold exactly.
pub(crate) fn validate_key(key: &str) -> Result<()> {
    let reason = if key.is_empty() {
        "the key is empty"
    } else if key.len() > MAX_KEY_BYTES {
        "the key is longer than 128 bytes"
    } else if key.contains('\0') {
        "the key contains a NUL byte"
    } else {
        return Ok(());
    };
    Err(Error::InvalidKey {
        key: crate::error::shown_key(key),
        key_bytes: key.len(),
        reason,
    })
}

/// Everything a waiting acquire checks before it writes anything.
pub(crate) fn validate_acquire(key: &str, lease: Duration, wait: Duration) -> Result<()> {
    validate_key(key)?;
    validate_lease(lease)?;
    validate_wait(wait)
}

/// Rejects leases outside `[MIN_LEASE, MAX_LEASE]`.
pub(crate) fn validate_lease(lease: Duration) -> Result<()> {
    validate_range("lease", lease, MIN_LEASE, MAX_LEASE)
}

/// Rejects waits above `MAX_WAIT` (zero is a single attempt).
pub(crate) fn validate_wait(wait: Duration) -> Result<()> {
    validate_range("wait", wait, Duration::ZERO, MAX_WAIT)
}

pub(crate) fn validate_range(
    what: &'static str,
    value: Duration,
    min: Duration,
    max: Duration,
) -> Result<()> {
    if value < min || value > max {
        return Err(Error::InvalidDuration {
            what,
            value,
            reason: format!("must be between {min:?} and {max:?}"),
        });
    }
    Ok(())
}

/// The unqualified part of a validated table name: the table itself, without its schema.
/// Index names take it, since PostgreSQL creates an index in its table's schema and
/// refuses a qualified index name.
pub(crate) fn unqualified(table: &str) -> &str {
    table.rsplit('.').next().unwrap_or(table)
}

/// Checks a lock table's name: one plain identifier (see [`validate_identifier`]), or on a
/// backend that takes them (`refused_qualified` is `None`; else it is why not),
/// `schema.table` with both parts plain identifiers,
/// the schema not one of PostgreSQL's own (`pg_*`), and the whole at most
/// [`MAX_QUALIFIED_TABLE_NAME_BYTES`]. The one place a table name's rules live.
pub(crate) fn validate_table_name(
    name: &str,
    refused_qualified: Option<&'static str>,
) -> Result<()> {
    let refuse = |reason| {
        Err(Error::InvalidTableName {
            name: name.to_owned(),
            reason,
        })
    };
    let Some((schema, table)) = name.split_once('.') else {
        return validate_identifier(name);
    };
    if let Some(reason) = refused_qualified {
        return refuse(reason);
    }
    if table.contains('.') {
        return refuse("a qualified name has one dot: schema.table");
    }
    if name.len() > MAX_QUALIFIED_TABLE_NAME_BYTES {
        return refuse(
            "a schema-qualified name is longer than 56 bytes (the NOTIFY channel \
             dblock:<schema>.<table> must fit PostgreSQL's 63-byte identifiers)",
        );
    }
    if let Some(problem) = identifier_problem(schema) {
        return refuse(problem.reason(Part::Schema));
    }
    if schema.to_ascii_lowercase().starts_with("pg_") {
        return refuse("PostgreSQL reserves schema names starting with pg_");
    }
    match identifier_problem(table) {
        Some(problem) => refuse(problem.reason(Part::Table)),
        None => Ok(()),
    }
}

/// Accepts plain identifiers only: `[A-Za-z_][A-Za-z0-9_]*`, at most
/// [`MAX_TABLE_NAME_BYTES`], and not a word any of the backends reserves (see
/// [`RESERVED_WORDS`]). Such a name needs no quoting on any backend, so it can be spliced
/// into SQL text without opening a door to injection, and the same name works everywhere.
pub(crate) fn validate_identifier(name: &str) -> Result<()> {
    match identifier_problem(name) {
        Some(problem) => Err(Error::InvalidTableName {
            name: name.to_owned(),
            reason: problem.reason(Part::Whole),
        }),
        None => Ok(()),
    }
}

/// Which part of a name a reason speaks of.
#[derive(Clone, Copy)]
enum Part {
    Whole,
    Schema,
    Table,
}

/// What is wrong with an identifier.
#[derive(Clone, Copy)]
enum Problem {
    Empty,
    TooLong,
    BadStart,
    BadCharacter,
    Reserved,
    SqlitePrefix,
}

impl Problem {
    fn reason(self, part: Part) -> &'static str {
        use Part::*;
        use Problem::*;
        match (self, part) {
            (Empty, Whole) => "the name is empty",
            (Empty, Schema) => "the schema name is empty",
            (Empty, Table) => "the table name after the schema is empty",
            (TooLong, Whole) => "the name is longer than 40 bytes",
            (TooLong, Schema) => "the schema name is longer than 40 bytes",
            (TooLong, Table) => "the table name after the schema is longer than 40 bytes",
            (BadStart, Whole) => "the name must start with an ASCII letter or underscore",
            (BadStart, Schema) => "the schema name must start with an ASCII letter or underscore",
            (BadStart, Table) => {
                "the table name after the schema must start with an ASCII letter or underscore"
            }
            (BadCharacter, Whole) => "the name may hold only ASCII letters, digits and underscores",
            (BadCharacter, Schema | Table) => {
                "each part of a qualified name may hold only ASCII letters, digits and underscores"
            }
            (Reserved, Whole) => {
                "the name is a reserved SQL word on PostgreSQL, MySQL/MariaDB or SQLite"
            }
            (Reserved, Schema) => {
                "the schema name is a reserved SQL word on PostgreSQL, MySQL/MariaDB or SQLite"
            }
            (Reserved, Table) => {
                "the table name after the schema is a reserved SQL word on PostgreSQL, \
                 MySQL/MariaDB or SQLite"
            }
            (SqlitePrefix, _) => "SQLite reserves names starting with sqlite_",
        }
    }
}

fn identifier_problem(name: &str) -> Option<Problem> {
    let mut chars = name.chars();
    let lower = name.to_ascii_lowercase();
    match chars.next() {
        None => Some(Problem::Empty),
        Some(_) if name.len() > MAX_TABLE_NAME_BYTES => Some(Problem::TooLong),
        Some(first) if !(first.is_ascii_alphabetic() || first == '_') => Some(Problem::BadStart),
        Some(_) if !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') => {
            Some(Problem::BadCharacter)
        }
        Some(_) if RESERVED_WORDS.binary_search(&lower.as_str()).is_ok() => Some(Problem::Reserved),
        Some(_) if lower.starts_with("sqlite_") => Some(Problem::SqlitePrefix),
        Some(_) => None,
    }
}

/// Words that cannot name a table unquoted on at least one backend, lower case, sorted
/// (byte order) for binary search. Checked one by one with `CREATE TABLE <word>` against
/// PostgreSQL 15 (its reserved and type/function-name keywords), MariaDB 10.11 (every word
/// of `information_schema.keywords`) and SQLite 3.40 (its keyword list); MySQL 8's
/// additions (`rank`, `system`, window functions, ...) are taken from its manual.
/// Without this check a name like `order` passed validation and `migrate()` failed after
/// creating the history table (and on MySQL the fencing table).
#[rustfmt::skip]
const RESERVED_WORDS: &[&str] = &[
    "accessible", "add", "all", "alter", "analyse", "analyze", "and", "any", "array", "as",
    "asc", "asensitive", "asymmetric", "authorization", "autoincrement", "before",
    "between", "bigint", "binary", "blob", "both", "by", "call", "cascade", "case", "cast",
    "change", "char", "character", "check", "collate", "collation", "column", "commit",
    "concurrently", "condition", "constraint", "continue", "convert", "create", "cross",
    "cube", "cume_dist", "current_catalog", "current_date", "current_role",
    "current_schema", "current_time", "current_timestamp", "current_user", "cursor",
    "databases", "day_hour", "day_microsecond", "day_minute", "day_second", "dec",
    "decimal", "declare", "default", "deferrable", "delayed", "delete", "delete_domain_id",
    "dense_rank", "desc", "describe", "deterministic", "distinct", "distinctrow", "div",
    "do", "do_domain_ids", "double", "drop", "dual", "each", "else", "elseif", "empty",
    "enclosed", "end", "escape", "escaped", "except", "exists", "exit", "explain", "false",
    "fetch", "first_value", "float", "float4", "float8", "for", "force", "foreign",
    "freeze", "from", "full", "fulltext", "function", "grant", "group", "grouping",
    "groups", "having", "high_priority", "hour_microsecond", "hour_minute", "hour_second",
    "if", "ignore", "ignore_domain_ids", "ilike", "in", "index", "infile", "initially",
    "inner", "inout", "insensitive", "insert", "int", "int1", "int2", "int3", "int4",
    "int8", "integer", "intersect", "interval", "into", "is", "isnull", "iterate", "join",
    "json_table", "key", "keys", "kill", "lag", "last_value", "lateral", "lead", "leading",
    "leave", "left", "like", "limit", "linear", "lines", "load", "localtime",
    "localtimestamp", "lock", "long", "longblob", "longtext", "loop", "low_priority",
    "master_demote_to_replica", "master_demote_to_slave", "master_ssl_verify_server_cert",
    "match", "maxvalue", "mediumblob", "mediumint", "mediumtext", "member", "middleint",
    "minute_microsecond", "minute_second", "mod", "modifies", "natural",
    "no_write_to_binlog", "not", "nothing", "notnull", "nth_value", "ntile", "null",
    "numeric", "of", "offset", "on", "only", "optimize", "optionally", "or", "order", "out",
    "outer", "outfile", "over", "overlaps", "page_checksum", "parse_vcol_expr", "partition",
    "percent_rank", "placing", "portion", "precision", "primary", "procedure", "purge",
    "qualify", "range", "rank", "read", "read_write", "reads", "real", "recursive",
    "ref_system_id", "references", "regexp", "release", "rename", "repeat", "replace",
    "require", "resignal", "restrict", "return", "returning", "revoke", "right", "rlike",
    "row", "row_number", "rows", "schemas", "second_microsecond", "select", "sensitive",
    "separator", "session_user", "set", "show", "signal", "similar", "smallint", "some",
    "spatial", "specific", "sql", "sql_big_result", "sql_calc_found_rows",
    "sql_small_result", "sqlexception", "sqlstate", "sqlwarning", "ssl", "starting",
    "stats_auto_recalc", "stats_persistent", "stats_sample_pages", "straight_join",
    "symmetric", "system", "table", "tablesample", "terminated", "then", "tinyblob",
    "tinyint", "tinytext", "to", "trailing", "transaction", "trigger", "true", "undo",
    "union", "unique", "unlock", "unsigned", "update", "usage", "use", "user", "using",
    "utc_date", "utc_time", "utc_timestamp", "values", "varbinary", "varchar",
    "varcharacter", "variadic", "varying", "verbose", "when", "where", "while", "window",
    "with", "write", "xor", "year_month", "zerofill",
];

/// Owner prefixes end up in the `VARCHAR(64)` owner column and in operators' logs.
pub(crate) fn validate_owner_prefix(prefix: &str) -> Result<()> {
    if prefix.len() > MAX_OWNER_PREFIX_BYTES || prefix.chars().any(char::is_control) {
        return Err(Error::InvalidConfig(format!(
            "owner prefix {prefix:?} must be at most {MAX_OWNER_PREFIX_BYTES} bytes without control characters"
        )));
    }
    Ok(())
}

/// Longest host name part of a default owner prefix, in bytes.
const HOST_PART_BYTES: usize = 20;

/// The owner prefix a Locker uses unless told otherwise: `<host>:<pid>:`, this machine's
/// short host name (up to the first `.`, at most 20 bytes of `[A-Za-z0-9_-]`, `host` when
/// none can be read) and the process id, so an operator reading `dblock list` can tell
/// which replica holds a lock. At most 32 bytes (20 + 1 + 10 + 1).
pub(crate) fn default_owner_prefix() -> String {
    let name = gethostname::gethostname();
    let name = name.to_string_lossy();
    let mut host: String = name
        .split('.')
        .next()
        .unwrap_or("")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .take(HOST_PART_BYTES)
        .collect();
    if host.is_empty() {
        host.push_str("host");
    }
    format!("{host}:{}:", std::process::id())
}

/// Leases are sent to the database as whole microseconds.
pub(crate) fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_owner_prefix_names_host_and_process() {
        let prefix = default_owner_prefix();
        assert!(validate_owner_prefix(&prefix).is_ok(), "{prefix:?}");
        let parts: Vec<&str> = prefix.split(':').collect();
        assert_eq!(parts.len(), 3, "{prefix:?}");
        assert!(!parts[0].is_empty() && parts[0].len() <= HOST_PART_BYTES);
        assert_eq!(parts[1], std::process::id().to_string());
        assert_eq!(parts[2], "");
    }

    #[test]
    fn keys_at_the_boundaries() {
        assert!(validate_key(&"k".repeat(128)).is_ok());
        assert!(validate_key(&"k".repeat(129)).is_err());
        assert!(validate_key("").is_err());
        assert!(validate_key("a\0b").is_err());
        // 32 four-byte emoji are 128 bytes; one more is too many.
        assert!(validate_key(&"🔒".repeat(32)).is_ok());
        assert!(validate_key(&"🔒".repeat(33)).is_err());
    }

    #[test]
    fn table_names() {
        let refused = Some("no schemas here");
        for ok in ["distributed_lock", "_x", "L1"] {
            assert!(validate_table_name(ok, refused).is_ok(), "{ok}");
            assert!(validate_table_name(ok, None).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "1abc",
            "a-b",
            "a b",
            "a;drop table x",
            "x\"y",
            "é",
            &"a".repeat(41),
            "order",
            "SELECT",
            "User",
            "key",
            "sqlite_locks",
        ] {
            assert!(validate_table_name(bad, None).is_err(), "{bad}");
        }
    }

    #[test]
    fn qualified_table_names() {
        let reason = |name: &str, schemas| match validate_table_name(name, schemas) {
            Err(Error::InvalidTableName { name: n, reason }) if n == name => reason,
            other => panic!("{name}: {other:?}"),
        };
        let fits = format!("{}.{}", "s".repeat(15), "t".repeat(40));
        assert_eq!(fits.len(), MAX_QUALIFIED_TABLE_NAME_BYTES);
        for ok in ["locks.distributed_lock", "_s.t", fits.as_str()] {
            assert!(validate_table_name(ok, None).is_ok(), "{ok}");
            assert_eq!(reason(ok, Some("why")), "why");
        }
        assert_eq!(unqualified("locks.distributed_lock"), "distributed_lock");
        assert_eq!(unqualified("distributed_lock"), "distributed_lock");
        let q = None;
        assert_eq!(
            reason("a.b.c", q),
            "a qualified name has one dot: schema.table"
        );
        assert_eq!(reason(".t", q), "the schema name is empty");
        assert_eq!(reason("s.", q), "the table name after the schema is empty");
        assert!(reason(&format!("{fits}x"), q).contains("longer than 56 bytes"));
        assert!(reason(&format!("{}.t", "s".repeat(41)), q).contains("longer than 40"));
        assert!(reason(&format!("s.{}", "t".repeat(41)), q).contains("longer than 40"));
        assert!(reason("order.t", q).starts_with("the schema name is a reserved"));
        assert!(reason("s.order", q).starts_with("the table name after the schema is a reserved"));
        assert!(reason("1s.t", q).starts_with("the schema name must start"));
        assert!(reason("s.t-x", q).starts_with("each part"));
        assert!(reason("s x.t", q).starts_with("each part"));
        assert_eq!(
            reason("pg_catalog.t", q),
            "PostgreSQL reserves schema names starting with pg_"
        );
        assert_eq!(
            reason("PG_x.t", q),
            "PostgreSQL reserves schema names starting with pg_"
        );
    }

    #[test]
    fn reserved_words_are_sorted_lower_case() {
        assert!(RESERVED_WORDS.windows(2).all(|w| w[0] < w[1]));
        assert!(
            RESERVED_WORDS
                .iter()
                .all(|w| *w == w.to_ascii_lowercase().as_str())
        );
    }

    #[test]
    fn retry_delays_stay_under_the_ceiling() {
        let policy = RetryPolicy::default();
        for (n, delay) in policy.delays().take(40).enumerate() {
            let ceiling =
                (DEFAULT_RETRY_INITIAL * 2u32.pow(n.min(20) as u32)).min(DEFAULT_RETRY_MAX);
            assert!(delay <= ceiling, "attempt {n}: {delay:?} > {ceiling:?}");
        }
    }

    #[test]
    fn lease_and_wait_limits() {
        assert!(validate_lease(Duration::ZERO).is_err());
        assert!(validate_lease(MAX_LEASE).is_ok());
        assert!(validate_lease(MAX_LEASE + Duration::from_nanos(1)).is_err());
        assert!(validate_wait(Duration::ZERO).is_ok());
        assert!(validate_wait(MAX_WAIT + Duration::from_secs(1)).is_err());
    }
}
