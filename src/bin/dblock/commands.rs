//! The subcommands, written once over any backend with dblock's public API only. Each
//! returns what to print, or a [`Failure`] with its exit code; printing is main's job.

use dblock::{Backend, LockFilter, LockInfo, Locker, MAX_LIST_LIMIT};

use crate::args::{Command, ListArgs};
use crate::failure::Failure;
use crate::render::{self, Row};

/// What a successful command prints: `stdout`, and a `note` for stderr (a list cut short).
#[derive(Debug, Default)]
pub(crate) struct Output {
    pub(crate) stdout: String,
    pub(crate) note: Option<String>,
}

impl Output {
    fn line(text: String) -> Self {
        Output {
            stdout: text + "\n",
            note: None,
        }
    }
}

/// The usage errors clap cannot see, found before anything connects.
pub(crate) fn check(command: &Command) -> Result<(), Failure> {
    match command {
        Command::Release {
            force: false, key, ..
        } => Err(Failure::usage(format!(
            "release needs --force: it deletes the row of {key:?} whoever holds it, without \
             asking the holder"
        ))),
        Command::Web(args) => crate::web::check(args),
        _ => Ok(()),
    }
}

/// Runs `command` against `locker`'s table (after [`check`]).
pub(crate) async fn run<DB: Backend>(
    locker: &Locker<DB>,
    command: &Command,
) -> Result<Output, Failure>
where
    dblock::AnyLocker: From<Locker<DB>>,
{
    match command {
        Command::Migrate { print_sql: false } => migrate(locker).await,
        Command::Migrate { print_sql: true } => Ok(print_sql(locker)),
        Command::List(args) => list(locker, args).await,
        Command::Show { key, json } => show(locker, key, *json).await,
        Command::Release { key, operator, .. } => release(locker, key, operator.as_deref()).await,
        Command::Reap => reap(locker).await,
        Command::History(args) => crate::history::history(locker, args).await,
        Command::Web(args) => crate::web::serve(locker.clone(), args).await,
    }
}

async fn migrate<DB: Backend>(locker: &Locker<DB>) -> Result<Output, Failure> {
    let table = locker.table();
    Ok(Output::line(match locker.migrate().await? {
        0 => format!("table {table:?} is up to date"),
        1 => format!("applied 1 migration to table {table:?}"),
        n => format!("applied {n} migrations to table {table:?}"),
    }))
}

/// The scripts `migrate` would run, each under a comment naming it; nothing is sent.
pub(crate) fn print_sql<DB: Backend>(locker: &Locker<DB>) -> Output {
    let mut stdout = String::new();
    for script in locker.migration_sql() {
        stdout.push_str(&format!(
            "-- dblock migration {} (table {:?}): run as one script\n{}\n\n",
            script.name,
            locker.table(),
            script.sql.trim_end()
        ));
    }
    Output { stdout, note: None }
}

async fn list<DB: Backend>(locker: &Locker<DB>, args: &ListArgs) -> Result<Output, Failure> {
    let mut filter = LockFilter::new().prefix(&args.prefix);
    if args.expired {
        filter = filter.expired_only();
    }
    if let Some(held) = args.held_longer_than {
        filter = filter.held_longer_than(held);
    }
    // One row more than asked tells whether the limit cut the list; at the library's
    // maximum there is no "one more", and a full page may or may not be all.
    let asked = args.limit as usize;
    let fetched = args.limit.saturating_add(1).min(MAX_LIST_LIMIT);
    let mut rows = locker.list_matching(&filter.limit(fetched)).await?;
    let note = if rows.len() > asked {
        rows.truncate(asked);
        Some(format!("(first {asked} rows; more with --limit)"))
    } else if rows.len() == MAX_LIST_LIMIT as usize {
        Some(format!(
            "(first {MAX_LIST_LIMIT} rows, the most one list returns; there may be more: \
             narrow it with --prefix)"
        ))
    } else {
        None
    };
    let rows: Vec<Row<'_>> = rows.iter().map(Row::from).collect();
    let stdout = if args.json {
        rows.iter().map(|row| render::json(row) + "\n").collect()
    } else {
        render::table(&rows)
    };
    Ok(Output { stdout, note })
}

/// The row of exactly `key`, read as `list` reads rows (so it comes with the database
/// clock's `read_at`): the smallest key with the prefix `key` is `key` itself, if it is
/// there.
async fn lookup<DB: Backend>(locker: &Locker<DB>, key: &str) -> Result<LockInfo, Failure> {
    let filter = LockFilter::new().prefix(key).limit(1);
    let found = locker.list_matching(&filter).await?.into_iter().next();
    found.filter(|info| info.key == key).ok_or_else(|| {
        Failure::not_found(format!(
            "no lock row for key {key:?} in table {:?}",
            locker.table()
        ))
    })
}

async fn show<DB: Backend>(locker: &Locker<DB>, key: &str, json: bool) -> Result<Output, Failure> {
    let info = lookup(locker, key).await?;
    let row = Row::from(&info);
    Ok(match json {
        true => Output::line(render::json(&row)),
        false => Output {
            stdout: render::fields(&row),
            note: None,
        },
    })
}

/// Reads the row first, so that the operator learns whose lock went. Between the read and
/// the delete another owner may take an expired row over; what is printed is what was
/// read.
async fn release<DB: Backend>(
    locker: &Locker<DB>,
    key: &str,
    operator: Option<&str>,
) -> Result<Output, Failure> {
    let info = lookup(locker, key).await?;
    let operator = operator.map_or_else(crate::history::default_operator, str::to_owned);
    if !locker.force_release_by(key, &operator).await? {
        return Err(Failure::not_found(format!(
            "no lock row for key {key:?} in table {:?} any more: it went before it could be \
             deleted",
            locker.table()
        )));
    }
    Ok(Output::line(format!(
        "released {key:?}: deleted the row of {}",
        render::summary(&Row::from(&info))
    )))
}

async fn reap<DB: Backend>(locker: &Locker<DB>) -> Result<Output, Failure> {
    match locker.reap_expired().await? {
        // Not a failure: a cron job that reaps finds nothing most of the time.
        0 => Ok(Output::line(format!(
            "nothing to reap: no expired rows in table {:?}",
            locker.table()
        ))),
        1 => Ok(Output::line("reaped 1 expired row".to_owned())),
        n => Ok(Output::line(format!("reaped {n} expired rows"))),
    }
}
