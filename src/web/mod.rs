//! The web console (cargo feature `web`): server-rendered pages over a Locker's table, as
//! an axum [`Router`] the application mounts behind its own authentication. Read-only
//! unless the mounting code enables force-release ([`Console::allow_force_release`]).
//!
//! Every page is an HTML table that works without JavaScript; a small script (served by
//! the router itself, like the stylesheet: no CDN) refreshes it and counts leases down.
//! Keys and owners are user data: maud escapes every value spliced into a page.

mod assets;
mod jobs;
mod layout;
mod locks;
mod primitives;
mod release;
mod timeline;

use std::sync::Arc;

use axum::Router;
use axum::extract::{FromRequestParts, OriginalUri};
use axum::http::request::Parts;
use axum::routing::{get, post};

use crate::any::AnyLocker;

/// The console's pages over one Locker's table, with its options: build it, then take
/// its [`router`](Self::router) and mount it (under any prefix: links follow the mount).
///
/// # Default
/// Read-only: no page writes, and the force-release routes answer 403.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use dblock::web::Console;
///
/// # let pool = dblock::sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// let locker = dblock::Locker::new(pool);
/// # locker.migrate().await?;
/// // Behind the application's own authentication (an axum layer of its choice).
/// let app: axum::Router = axum::Router::new().nest(
///     "/admin/locks",
///     Console::new(locker).allow_force_release("ops").router(),
/// );
/// # drop(app);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Console {
    locker: AnyLocker,
    operator: Option<String>,
}

impl Console {
    /// A read-only console over `locker`'s table: a `Locker` of any backend, or an
    /// [`AnyLocker`].
    pub fn new(locker: impl Into<AnyLocker>) -> Console {
        Console {
            locker: locker.into(),
            operator: None,
        }
    }

    /// Shows a force-release button on each lock (behind a confirmation page, with a
    /// CSRF token), recorded as the operator `console:<operator>`. Only for consoles
    /// mounted behind authentication: whoever reaches the page can delete any lock.
    pub fn allow_force_release(mut self, operator: impl Into<String>) -> Console {
        self.operator = Some(operator.into());
        self
    }

    /// The console's routes: `/` (live locks, paged), `/key/<key>` (its last hour),
    /// `/primitives`, `/jobs`, `/metrics`, and the force-release routes (POST; 403 unless enabled), with its stylesheet and script.
    pub fn router(self) -> Router {
        let state = Arc::new(Shared {
            locker: self.locker,
            operator: self.operator,
            csrf: release::fresh_secret(),
        });
        Router::new()
            .route("/", get(locks::page))
            .route("/key/{*key}", get(timeline::page))
            .route("/primitives", get(primitives::page))
            .route("/jobs", get(jobs::page))
            .route("/metrics", get(primitives::metrics))
            .route("/release/confirm", post(release::confirm))
            .route("/release", post(release::release))
            .route("/assets/console.css", get(assets::css))
            .route("/assets/console.js", get(assets::js))
            .with_state(state)
    }
}

/// The read-only console over `locker`: `Console::new(locker).router()`.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let pool = dblock::sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// let locker = dblock::Locker::new(pool);
/// let app: axum::Router = axum::Router::new().nest("/locks", dblock::web::router(locker));
/// # drop(app);
/// # Ok(()) }
/// ```
pub fn router(locker: impl Into<AnyLocker>) -> Router {
    Console::new(locker).router()
}

/// What every request of one console shares.
struct Shared {
    locker: AnyLocker,
    /// `Some`: force-release is enabled, recorded under this name.
    operator: Option<String>,
    /// The CSRF token of this console's forms (fresh per router).
    csrf: String,
}

type State = axum::extract::State<Arc<Shared>>;

/// The path the console is mounted under (`""` at the root, `/admin/locks` when nested
/// there): the request's original path less the part the console's router saw. Links are
/// written with it, so they work under any prefix, with or without a trailing slash.
#[derive(Debug, Clone)]
struct Base(String);

impl<S: Send + Sync> FromRequestParts<S> for Base {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let seen = parts.uri.path();
        let original = parts
            .extensions
            .get::<OriginalUri>()
            .map_or(seen, |original| original.0.path());
        Ok(Base(mount_prefix(original, seen).to_owned()))
    }
}

/// `original` less its tail `seen` (a nested router sees `/` for its mount point itself,
/// which the original may write without the slash).
fn mount_prefix<'a>(original: &'a str, seen: &str) -> &'a str {
    if let Some(prefix) = original.strip_suffix(seen) {
        prefix
    } else if seen == "/" {
        original.trim_end_matches('/')
    } else {
        ""
    }
}

impl Base {
    /// The absolute path of the console's `path` (which starts with `/`).
    fn at(&self, path: &str) -> String {
        format!("{}{path}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::mount_prefix;

    #[test]
    fn the_mount_prefix_is_what_the_router_did_not_see() {
        assert_eq!(mount_prefix("/", "/"), "");
        assert_eq!(mount_prefix("/primitives", "/primitives"), "");
        assert_eq!(mount_prefix("/locks/primitives", "/primitives"), "/locks");
        assert_eq!(mount_prefix("/locks/", "/"), "/locks");
        assert_eq!(mount_prefix("/locks", "/"), "/locks");
        assert_eq!(mount_prefix("/a/b/key/x%2Fy", "/key/x%2Fy"), "/a/b");
    }
}
