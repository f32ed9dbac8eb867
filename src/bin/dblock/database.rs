//! From a URL to a connected [`Locker`]: the backend is chosen by the URL's scheme, the
//! rest is generic. The pool is small (an operator's command runs one statement at a
//! time) and gives up connecting after `--connect-timeout`.

use std::str::FromStr;
use std::time::Duration;

use dblock::{Backend, Locker};
use sqlx::pool::PoolOptions;
use sqlx::{Connection, Pool};

use crate::args::{Cli, Command};
use crate::commands::{self, Output};
use crate::failure::Failure;

/// Two connections: one for the command, one spare for dblock's own bookkeeping
/// (SQLite's migration keeps one open while it runs).
const MAX_CONNECTIONS: u32 = 2;

/// The database a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scheme {
    Postgres,
    MySql,
    Sqlite,
}

impl Scheme {
    /// `postgres://` or `postgresql://`, `mysql://` or `mariadb://`, `sqlite:`.
    pub(crate) fn of(url: &str) -> Option<Scheme> {
        let (scheme, _) = url.split_once(':')?;
        match scheme.to_ascii_lowercase().as_str() {
            "postgres" | "postgresql" => Some(Scheme::Postgres),
            "mysql" | "mariadb" => Some(Scheme::MySql),
            "sqlite" => Some(Scheme::Sqlite),
            _ => None,
        }
    }
}

/// The URL as messages show it: with `***` for a password, in the user part or in a
/// `password=` parameter.
pub(crate) fn redacted(url: &str) -> String {
    let (head, query) = match url.split_once('?') {
        Some((head, query)) => (head, Some(query)),
        None => (url, None),
    };
    // The password runs from the first `:` after `//` to the last `@`: cut there, a
    // password with an unencoded `/` or `@` is still hidden (a path with an `@` may hide
    // more than the password, which is the safe side).
    let mut shown = match head.split_once("://") {
        Some((scheme, rest)) => match (rest.split_once(':'), rest.rfind('@')) {
            (Some((user, _)), Some(at)) if user.len() < at && !user.contains('@') => {
                format!("{scheme}://{user}:***{}", &rest[at..])
            }
            _ => head.to_owned(),
        },
        None => head.to_owned(),
    };
    if let Some(query) = query {
        let params: Vec<String> = query
            .split('&')
            .map(|param| match param.split_once('=') {
                Some((name, _)) if name.eq_ignore_ascii_case("password") => format!("{name}=***"),
                _ => param.to_owned(),
            })
            .collect();
        shown = format!("{shown}?{}", params.join("&"));
    }
    shown
}

/// Connects to the database `cli` names and runs its command there.
pub(crate) async fn execute(cli: &Cli) -> Result<Output, Failure> {
    let url = cli
        .database_url
        .as_deref()
        .filter(|url| !url.is_empty())
        .ok_or_else(|| {
            Failure::usage("no database: give --database-url URL or set DATABASE_URL".to_owned())
        })?;
    let shown = redacted(url);
    let scheme = Scheme::of(url).ok_or_else(|| {
        Failure::usage(format!(
            "unsupported database URL {shown}: it must start with postgres://, postgresql://, \
             mysql://, mariadb:// or sqlite:"
        ))
    })?;
    match scheme {
        #[cfg(feature = "postgres")]
        Scheme::Postgres => open::<sqlx::Postgres>(options(url, &shown)?, &shown, cli).await,
        #[cfg(feature = "mysql")]
        Scheme::MySql => open::<sqlx::MySql>(options(url, &shown)?, &shown, cli).await,
        #[cfg(feature = "sqlite")]
        Scheme::Sqlite => {
            let options: sqlx::sqlite::SqliteConnectOptions = options(url, &shown)?;
            // Only migrate creates a database file: any other command on a path that is
            // not there is a typo, and an empty file would only hide it.
            let options = match cli.command {
                Command::Migrate { print_sql: false } => options.create_if_missing(true),
                // Nothing connects.
                Command::Migrate { print_sql: true } => options,
                _ => {
                    let file = options.get_filename();
                    let in_memory = url.contains(":memory:") || url.contains("mode=memory");
                    if !in_memory && !file.exists() {
                        return Err(Failure::database(format!(
                            "no SQLite database file at {}: check the path (only `dblock \
                             migrate` creates one)",
                            file.display()
                        )));
                    }
                    options
                }
            };
            open::<sqlx::Sqlite>(options, &shown, cli).await
        }
        #[allow(unreachable_patterns)] // every backend's feature is on
        scheme => Err(Failure::usage(format!(
            "this dblock was built without {scheme:?} support (cargo features postgres, mysql, sqlite)"
        ))),
    }
}

/// The URL parsed as sqlx reads it.
fn options<O: FromStr<Err = sqlx::Error>>(url: &str, shown: &str) -> Result<O, Failure> {
    url.parse()
        .map_err(|err| Failure::usage(format!("invalid database URL {shown}: {err}")))
}

async fn open<DB: Backend>(
    options: <DB::Connection as Connection>::Options,
    shown: &str,
    cli: &Cli,
) -> Result<Output, Failure>
where
    dblock::AnyLocker: From<Locker<DB>>,
{
    let pool = PoolOptions::<DB>::new()
        .max_connections(MAX_CONNECTIONS)
        .acquire_timeout(cli.connect_timeout)
        .connect_lazy_with(options);
    let outcome = session(&pool, shown, cli).await;
    pool.close().await;
    outcome
}

async fn session<DB: Backend>(pool: &Pool<DB>, shown: &str, cli: &Cli) -> Result<Output, Failure>
where
    dblock::AnyLocker: From<Locker<DB>>,
{
    // Built before connecting (the pool is lazy): a bad table name is a usage error
    // whether the server is up or not. Nothing here acquires, so nothing is renewed or
    // waited for.
    let locker = Locker::builder(pool.clone())
        .table(&cli.table)
        .auto_renew(false)
        .listen(false)
        .build()?;
    if let Command::Migrate { print_sql: true } = cli.command {
        return Ok(commands::print_sql(&locker));
    }
    // One connection up front: an unreachable server gets a message of its own, not
    // the first statement's pool timeout.
    let conn = pool
        .acquire()
        .await
        .map_err(|err| cannot_connect(shown, err, cli.connect_timeout))?;
    drop(conn);
    let outcome = commands::run(&locker, &cli.command).await;
    locker.shutdown().await;
    outcome
}

fn cannot_connect(shown: &str, err: sqlx::Error, timeout: Duration) -> Failure {
    let why = match err {
        // sqlx retries refused connections until its timeout and keeps the cause.
        sqlx::Error::PoolTimedOut => format!(
            "no connection within {} (is the server up, and accepting connections at that \
             host and port?)",
            humantime::format_duration(timeout)
        ),
        // dblock's text of it: without the " at line N" of PostgreSQL's C source.
        err => dblock::Error::from(err)
            .to_string()
            .trim_start_matches("database error: ")
            .to_owned(),
    };
    Failure::database(format!("cannot connect to {shown}: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes_pick_the_backend() {
        let cases = [
            ("postgres://u@h/db", Some(Scheme::Postgres)),
            ("postgresql://u@h/db", Some(Scheme::Postgres)),
            ("POSTGRES://u@h/db", Some(Scheme::Postgres)),
            ("mysql://root@h/db", Some(Scheme::MySql)),
            ("mariadb://root@h/db", Some(Scheme::MySql)),
            ("sqlite:locks.db", Some(Scheme::Sqlite)),
            ("sqlite:///tmp/locks.db?mode=rwc", Some(Scheme::Sqlite)),
            ("sqlite::memory:", Some(Scheme::Sqlite)),
            ("redis://h", None),
            ("locks.db", None),
            ("", None),
        ];
        for (url, scheme) in cases {
            assert_eq!(Scheme::of(url), scheme, "{url}");
        }
    }

    #[test]
    fn passwords_are_not_shown() {
        let cases = [
            (
                "postgres://u:secret@h:5432/db",
                "postgres://u:***@h:5432/db",
            ),
            ("postgres://u:p@ss@h/db", "postgres://u:***@h/db"),
            ("mysql://root@h/db", "mysql://root@h/db"),
            (
                "postgres://h/db?user=u&password=secret&x=1",
                "postgres://h/db?user=u&password=***&x=1",
            ),
            ("sqlite:/tmp/a.db?mode=rwc", "sqlite:/tmp/a.db?mode=rwc"),
            ("postgres://u:secret@h", "postgres://u:***@h"),
            ("postgres://u:pa/ss@h/db", "postgres://u:***@h/db"),
            ("postgres://h:5432/db", "postgres://h:5432/db"),
            ("postgres://u@h:5432/db", "postgres://u@h:5432/db"),
        ];
        for (url, shown) in cases {
            assert_eq!(redacted(url), shown, "{url}");
        }
    }
}
