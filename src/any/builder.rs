//! [`AnyLockerBuilder`]: from a URL to a connected [`AnyLocker`]. The scheme picks the
//! backend; the options are the [`LockerBuilder`](crate::LockerBuilder)'s that every
//! backend has, applied by one generic function.

use std::time::Duration;

use sqlx::Connection;
use sqlx::pool::PoolOptions;

use super::AnyLocker;
use crate::config::RetryPolicy;
use crate::dialect::Backend;
use crate::error::{Error, Result};
use crate::locker::Locker;

/// How many connections the pool [`AnyLockerBuilder::connect`] opens may hold, unless
/// [`max_connections`](AnyLockerBuilder::max_connections) says otherwise: sqlx's own
/// default.
pub const DEFAULT_ANY_MAX_CONNECTIONS: u32 = 10;

/// The database a URL names, by its scheme; whether its feature is compiled in is
/// decided where it is matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scheme {
    Postgres,
    MySql,
    Sqlite,
}

impl Scheme {
    /// `postgres://` or `postgresql://`, `mysql://` or `mariadb://`, `sqlite:`, in any
    /// case. Only the scheme is shown in the error: the URL may carry a password.
    fn of(url: &str) -> Result<Scheme> {
        let scheme = url
            .split_once(':')
            .map(|(scheme, _)| scheme.to_ascii_lowercase());
        match scheme.as_deref() {
            Some("postgres" | "postgresql") => Ok(Scheme::Postgres),
            Some("mysql" | "mariadb") => Ok(Scheme::MySql),
            Some("sqlite") => Ok(Scheme::Sqlite),
            _ => Err(Error::InvalidConfig(format!(
                "unsupported database URL scheme {:?}: a URL must start with postgres://, \
                 postgresql://, mysql://, mariadb:// or sqlite:",
                scheme.unwrap_or_default()
            ))),
        }
    }
}

/// Options for an [`AnyLocker`]: the database URL, the pool's size, and the
/// [`LockerBuilder`](crate::LockerBuilder) options every backend has, each with the
/// same default (see the method named). Backend-specific options (PostgreSQL's
/// `durability`, `listener_options`) and a pool of your own: build the `Locker` and
/// convert it, `AnyLocker::from(locker)`.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use dblock::{AnyLocker, Error};
///
/// let locker = AnyLocker::builder("sqlite::memory:")
///     .table("billing_lock") // default: distributed_lock
///     .owner_prefix("billing-7f3:") // default: "<host>:<pid>:"
///     .default_lease(Duration::from_secs(10)) // default: 30 s
///     .connect()
///     .await?;
/// locker.migrate().await?;
/// assert_eq!((locker.backend(), locker.table()), ("SQLite", "billing_lock"));
///
/// // Refused before anything connects or is written.
/// let unknown = AnyLocker::connect("redis://cache:6379").await;
/// assert!(matches!(unknown, Err(Error::InvalidConfig(_))));
/// let reserved = AnyLocker::builder("sqlite::memory:").table("order").connect().await;
/// assert!(matches!(reserved, Err(Error::InvalidTableName { .. })));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct AnyLockerBuilder {
    url: String,
    max_connections: u32,
    table: Option<String>,
    owner_prefix: Option<String>,
    retry: Option<RetryPolicy>,
    default_lease: Option<Duration>,
    renew_interval: Option<Duration>,
    lease_margin: Option<Duration>,
    auto_renew: Option<bool>,
    listen: Option<bool>,
    fair: Option<bool>,
    statement_timeout: Option<Duration>,
    history: Option<Duration>,
}

impl AnyLockerBuilder {
    pub(super) fn new(url: &str) -> Self {
        AnyLockerBuilder {
            url: url.to_owned(),
            max_connections: DEFAULT_ANY_MAX_CONNECTIONS,
            table: None,
            owner_prefix: None,
            retry: None,
            default_lease: None,
            renew_interval: None,
            lease_margin: None,
            auto_renew: None,
            listen: None,
            fair: None,
            statement_timeout: None,
            history: None,
        }
    }

    /// The most connections the pool holds. Default: [`DEFAULT_ANY_MAX_CONNECTIONS`]
    /// (10). At least 1.
    pub fn max_connections(mut self, max: u32) -> Self {
        self.max_connections = max;
        self
    }

    /// [`LockerBuilder::table`](crate::LockerBuilder::table).
    pub fn table(mut self, name: impl Into<String>) -> Self {
        self.table = Some(name.into());
        self
    }

    /// [`LockerBuilder::owner_prefix`](crate::LockerBuilder::owner_prefix).
    pub fn owner_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.owner_prefix = Some(prefix.into());
        self
    }

    /// [`LockerBuilder::retry`](crate::LockerBuilder::retry).
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = Some(policy);
        self
    }

    /// [`LockerBuilder::default_lease`](crate::LockerBuilder::default_lease).
    pub fn default_lease(mut self, lease: Duration) -> Self {
        self.default_lease = Some(lease);
        self
    }

    /// [`LockerBuilder::renew_interval`](crate::LockerBuilder::renew_interval).
    pub fn renew_interval(mut self, interval: Duration) -> Self {
        self.renew_interval = Some(interval);
        self
    }

    /// [`LockerBuilder::lease_margin`](crate::LockerBuilder::lease_margin).
    pub fn lease_margin(mut self, fixed: Duration) -> Self {
        self.lease_margin = Some(fixed);
        self
    }

    /// [`LockerBuilder::auto_renew`](crate::LockerBuilder::auto_renew).
    pub fn auto_renew(mut self, on: bool) -> Self {
        self.auto_renew = Some(on);
        self
    }

    /// [`LockerBuilder::listen`](crate::LockerBuilder::listen) (PostgreSQL, SQLite on a
    /// file, MySQL/MariaDB).
    pub fn listen(mut self, on: bool) -> Self {
        self.listen = Some(on);
        self
    }

    /// [`LockerBuilder::fair`](crate::LockerBuilder::fair).
    pub fn fair(mut self, on: bool) -> Self {
        self.fair = Some(on);
        self
    }

    /// [`LockerBuilder::statement_timeout`](crate::LockerBuilder::statement_timeout).
    pub fn statement_timeout(mut self, bound: Duration) -> Self {
        self.statement_timeout = Some(bound);
        self
    }

    /// [`LockerBuilder::history`](crate::LockerBuilder::history): records the lock
    /// history, kept `retention` long.
    pub fn history(mut self, retention: Duration) -> Self {
        self.history = Some(retention);
        self
    }

    /// Checks the URL and every option, then opens a pool on the database the URL's
    /// scheme names and one connection of it, so that an unreachable server is an error
    /// here rather than at the first lock. Nothing is written (call
    /// [`migrate`](AnyLocker::migrate) for the lock table).
    ///
    /// Errors, before any connection is tried: [`Error::InvalidConfig`] for a URL whose
    /// scheme is not one of `postgres://`, `postgresql://`, `mysql://`, `mariadb://`,
    /// `sqlite:`, whose backend's cargo feature is off, or that sqlx cannot read, or a
    /// `max_connections` of zero; the errors of
    /// [`LockerBuilder::build`](crate::LockerBuilder::build) for the options. Then
    /// [`Error::Database`] when no connection could be opened (sqlx gives up after
    /// its 30 s acquire timeout). A SQLite file is not created unless the URL asks for
    /// it (`?mode=rwc`).
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is written; a dropped future leaves at most a pool that
    /// closes when dropped.
    pub async fn connect(self) -> Result<AnyLocker> {
        if self.max_connections == 0 {
            return Err(Error::InvalidConfig(
                "max_connections must be at least 1".to_owned(),
            ));
        }
        match Scheme::of(&self.url)? {
            #[cfg(feature = "postgres")]
            Scheme::Postgres => self.open::<sqlx::Postgres>().await,
            #[cfg(feature = "mysql")]
            Scheme::MySql => self.open::<sqlx::MySql>().await,
            #[cfg(feature = "sqlite")]
            Scheme::Sqlite => self.open::<sqlx::Sqlite>().await,
            #[allow(unreachable_patterns)] // reachable when a backend's feature is off
            scheme => Err(Error::InvalidConfig(format!(
                "this dblock was built without {scheme:?} support: enable its cargo \
                 feature (postgres, mysql, sqlite)"
            ))),
        }
    }

    /// The pool (lazy: nothing connects yet), the options checked, then one connection.
    async fn open<DB: Backend>(self) -> Result<AnyLocker>
    where
        Locker<DB>: Into<AnyLocker>,
    {
        let options: <DB::Connection as Connection>::Options = self
            .url
            .parse()
            .map_err(|err| Error::InvalidConfig(format!("invalid {} URL: {err}", DB::NAME)))?;
        let pool = PoolOptions::<DB>::new()
            .max_connections(self.max_connections)
            .connect_lazy_with(options);
        let locker = self.configure(pool.clone())?;
        // Returned to the pool at once; for an in-memory SQLite database it also keeps
        // the database alive as an idle connection.
        drop(pool.acquire().await?);
        Ok(locker.into())
    }

    /// The options every backend's builder has, applied where set.
    fn configure<DB: Backend>(self, pool: sqlx::Pool<DB>) -> Result<Locker<DB>> {
        let mut builder = Locker::builder(pool);
        if let Some(table) = self.table {
            builder = builder.table(table);
        }
        if let Some(prefix) = self.owner_prefix {
            builder = builder.owner_prefix(prefix);
        }
        if let Some(policy) = self.retry {
            builder = builder.retry(policy);
        }
        if let Some(lease) = self.default_lease {
            builder = builder.default_lease(lease);
        }
        if let Some(interval) = self.renew_interval {
            builder = builder.renew_interval(interval);
        }
        if let Some(fixed) = self.lease_margin {
            builder = builder.lease_margin(fixed);
        }
        if let Some(on) = self.auto_renew {
            builder = builder.auto_renew(on);
        }
        if let Some(on) = self.listen {
            builder = builder.listen(on);
        }
        if let Some(on) = self.fair {
            builder = builder.fair(on);
        }
        if let Some(bound) = self.statement_timeout {
            builder = builder.statement_timeout(bound);
        }
        if let Some(retention) = self.history {
            builder = builder.history(retention);
        }
        builder.build()
    }
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
            ("sqlite::memory:", Some(Scheme::Sqlite)),
            ("redis://h", None),
            ("locks.db", None),
            ("", None),
        ];
        for (url, scheme) in cases {
            assert_eq!(Scheme::of(url).ok(), scheme, "{url}");
        }
    }

    #[test]
    fn an_unknown_scheme_does_not_show_the_password() {
        let Err(Error::InvalidConfig(why)) = Scheme::of("redis://u:secret@h") else {
            panic!("expected InvalidConfig");
        };
        assert!(
            why.contains("\"redis\"") && !why.contains("secret"),
            "{why}"
        );
    }
}
