//! The web console, read through its Router with `oneshot` (no server, no browser), on
//! every backend: what the pages show, what they escape, what they never show, paging,
//! and force-release (403 unless enabled; CSRF and cross-site checks before any delete).

// This binary uses part of the shared harness; the rest is for the conformance binaries.
#[allow(dead_code)]
#[macro_use]
mod common;

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::counted::{count_writes, writes};
use common::{TestBackend, TestDb};
use dblock::web::{self, Console};
use dblock::{EventKind, HistoryFilter};
use tower::ServiceExt as _;

const LEASE: Duration = Duration::from_secs(60);

/// A form's fields, or a request's extra headers.
type Pairs<'a> = &'a [(&'a str, &'a str)];

/// The answer to one request: status and body.
async fn send(router: &Router, request: Request<Body>) -> (StatusCode, String) {
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), 1 << 24)
        .await
        .unwrap();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

async fn get(router: &Router, uri: &str) -> (StatusCode, String) {
    send(router, Request::get(uri).body(Body::empty()).unwrap()).await
}

/// A form post, with extra headers.
async fn post(
    router: &Router,
    uri: &str,
    fields: &[(&str, &str)],
    headers: &[(&str, &str)],
) -> (StatusCode, String) {
    let body: Vec<String> = fields
        .iter()
        .map(|(name, value)| format!("{name}={}", form_encoded(value)))
        .collect();
    let mut request =
        Request::post(uri).header("content-type", "application/x-www-form-urlencoded");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    send(router, request.body(Body::from(body.join("&"))).unwrap()).await
}

fn form_encoded(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => {
                char::from(byte).to_string()
            }
            _ => format!("%{byte:02X}"),
        })
        .collect()
}

/// The value of the hidden `csrf` field of a confirmation page.
fn csrf_of(page: &str) -> String {
    let at = page.find(r#"name="csrf" value=""#).expect("a CSRF field") + 19;
    page[at..].split('"').next().unwrap().to_owned()
}

/// A Locker on the test's table that records history (kept an hour), without renewals.
fn recording<DB: TestBackend>(db: &TestDb<DB>) -> dblock::Locker<DB> {
    dblock::Locker::builder(db.pool.clone())
        .table(&db.table)
        .auto_renew(false)
        .history(Duration::from_secs(3600))
        .build()
        .unwrap()
}

/// `key`, held by the test's own Locker.
async fn hold<DB: TestBackend>(db: &TestDb<DB>, key: &str) -> dblock::LockGuard<DB> {
    db.locker.try_acquire(key, LEASE).await.unwrap().unwrap()
}

/// How many rows of the locks page's table a page shows.
fn rows_on(page: &str) -> usize {
    let body = page.split("<tbody>").nth(1).expect("a table body");
    body.split("</tbody>")
        .next()
        .unwrap()
        .matches("<tr")
        .count()
}

/// A held lock shows with its key (linked to its timeline), owner and fencing token; the
/// other pages answer too.
async fn a_held_lock_shows_with_its_owner_and_token<DB: TestBackend>()
where
    dblock::AnyLocker: From<dblock::Locker<DB>>,
{
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let guard = hold(&db, "invoice:42").await;
    let router = web::router(db.locker.clone());
    let (status, page) = get(&router, "/").await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains(">invoice:42</a>"), "{page}");
    assert!(page.contains(r#"href="/key/invoice%3A42""#), "{page}");
    assert!(page.contains(guard.owner()), "{page}");
    assert!(
        page.contains(&format!(">{}</td>", guard.fencing_token())),
        "{page}"
    );
    assert_eq!(rows_on(&page), 1);
    // Read-only: no release form.
    assert!(!page.contains("/release/confirm"), "{page}");
    for path in [
        "/primitives",
        "/metrics",
        "/assets/console.css",
        "/assets/console.js",
    ] {
        let (status, _) = get(&router, path).await;
        assert_eq!(status, StatusCode::OK, "{path}");
    }
    guard.release().await.unwrap();
}

/// Keys and owners are user data: a key `<script>` and an owner with `"&<` show as text,
/// on the locks page, the primitives page and the confirmation page.
async fn keys_and_owners_are_escaped<DB: TestBackend>()
where
    dblock::AnyLocker: From<dblock::Locker<DB>>,
{
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let locker = dblock::Locker::builder(db.pool.clone())
        .table(&db.table)
        .auto_renew(false)
        .owner_prefix("a\"&<b:")
        .build()
        .unwrap();
    let key = "<script>alert(1)</script>";
    let guard = locker.try_acquire(key, LEASE).await.unwrap().unwrap();
    let leader = locker
        .election("<i>e")
        .campaign("x\"&<y", LEASE)
        .await
        .unwrap();
    let router = Console::new(locker.clone())
        .allow_force_release("ops")
        .router();
    let (_, locks) = get(&router, "/").await;
    let (_, primitives) = get(&router, "/primitives").await;
    let (_, confirm) = post(&router, "/release/confirm", &[("key", key)], &[]).await;
    for page in [&locks, &primitives, &confirm] {
        assert!(!page.contains("<script>alert"), "{page}");
        assert!(!page.contains("a\"&<b"), "{page}");
        assert!(!page.contains("<i>e"), "{page}");
        assert!(!page.contains("x\"&<y"), "{page}");
    }
    assert!(
        locks.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{locks}"
    );
    assert!(locks.contains("a&quot;&amp;&lt;b:"), "{locks}");
    assert!(
        confirm.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{confirm}"
    );
    assert!(primitives.contains("x&quot;&amp;&lt;y"), "{primitives}");
    assert!(primitives.contains("&lt;i&gt;e"), "{primitives}");
    leader.resign().await.unwrap();
    guard.release().await.unwrap();
}

/// Without `allow_force_release` both POST routes answer 403, no page shows a release
/// form, and the row stays.
async fn force_release_is_refused_unless_enabled<DB: TestBackend>()
where
    dblock::AnyLocker: From<dblock::Locker<DB>>,
{
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let guard = hold(&db, "stuck").await;
    let router = web::router(db.locker.clone());
    let (status, _) = post(&router, "/release/confirm", &[("key", "stuck")], &[]).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = post(&router, "/release", &[("key", "stuck"), ("csrf", "x")], &[]).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(db.locker.holder("stuck").await.unwrap().is_some());
    guard.release().await.unwrap();
}

/// Enabled: the confirmation page carries the token; a post without it, with a wrong one,
/// or from another site (by `Origin` or `Sec-Fetch-Site`, even with the right token) is
/// refused and deletes nothing; the right one from the same origin deletes the row.
async fn force_release_needs_the_csrf_token_and_the_same_origin<DB: TestBackend>()
where
    dblock::AnyLocker: From<dblock::Locker<DB>>,
{
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let guard = hold(&db, "stuck").await;
    let router = Console::new(db.locker.clone())
        .allow_force_release("ops")
        .router();
    let (_, locks) = get(&router, "/").await;
    assert!(locks.contains(r#"action="/release/confirm""#), "{locks}");
    let (status, confirm) = post(&router, "/release/confirm", &[("key", "stuck")], &[]).await;
    assert_eq!(status, StatusCode::OK);
    let token = csrf_of(&confirm);
    assert_eq!(token.len(), 64);
    let wrong = "0".repeat(64);
    let refused: [(Pairs<'_>, Pairs<'_>); 5] = [
        (&[("key", "stuck")], &[]),
        (&[("key", "stuck"), ("csrf", &wrong)], &[]),
        (&[("key", "stuck"), ("csrf", &token[..63])], &[]),
        (
            &[("key", "stuck"), ("csrf", &token)],
            &[
                ("host", "console.local"),
                ("origin", "https://evil.example"),
            ],
        ),
        (
            &[("key", "stuck"), ("csrf", &token)],
            &[("sec-fetch-site", "cross-site")],
        ),
    ];
    for (fields, headers) in refused {
        let (status, _) = post(&router, "/release", fields, headers).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{fields:?} {headers:?}");
        assert!(
            db.locker.holder("stuck").await.unwrap().is_some(),
            "{fields:?}"
        );
    }
    let same_origin = [
        ("host", "console.local"),
        ("origin", "http://console.local"),
        ("sec-fetch-site", "same-origin"),
    ];
    let (status, done) = post(
        &router,
        "/release",
        &[("key", "stuck"), ("csrf", &token)],
        &same_origin,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert!(done.contains("Released"), "{done}");
    assert!(db.locker.holder("stuck").await.unwrap().is_none());
    assert!(matches!(
        guard.release().await,
        Err(dblock::Error::NotHeld { .. })
    ));
    // One ForceReleased event, under the console's operator, for the one release done.
    let forced = HistoryFilter::new()
        .key("stuck")
        .kinds([EventKind::ForceReleased]);
    let events = db.locker.history(&forced).await.unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].detail.as_deref(), Some("console:ops"));
}

/// A key's page over its last hour, from the history a recording Locker wrote: a hold
/// released and a hold force-released from the console, as bars and as rows, the
/// force-release marked, every event listed; the key escaped throughout.
async fn a_keys_timeline_shows_holds_and_force_releases<DB: TestBackend>()
where
    dblock::AnyLocker: From<dblock::Locker<DB>>,
{
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let recording = recording(&db);
    let key = "<b>&\"k/1";
    let first = recording.try_acquire(key, LEASE).await.unwrap().unwrap();
    let first_token = first.fencing_token();
    first.release().await.unwrap();
    let second = recording.try_acquire(key, LEASE).await.unwrap().unwrap();
    let second_token = second.fencing_token();
    // The recorder writes its events a tick later.
    let of_key = HistoryFilter::new().key(key);
    common::wait_until(
        "three events written",
        Duration::from_secs(15),
        async || recording.history(&of_key).await.unwrap().len() == 3,
    )
    .await;

    let router = Console::new(db.locker.clone())
        .allow_force_release("ops")
        .router();
    let (_, confirm) = post(&router, "/release/confirm", &[("key", key)], &[]).await;
    let fields = [("key", key), ("csrf", &csrf_of(&confirm))];
    let (status, _) = post(&router, "/release", &fields, &[]).await;
    assert_eq!(status, StatusCode::OK);

    let (status, page) = get(&router, &format!("/key/{}", form_encoded(key))).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(!page.contains("<b>&"), "{page}");
    assert!(page.contains("&lt;b&gt;&amp;&quot;k/1"), "{page}");
    assert!(page.contains("Not held now"), "{page}");
    // Two bars, one force-release mark.
    let svg = page.split("<svg").nth(1).expect(&page);
    let svg = svg.split("</svg>").next().unwrap();
    assert_eq!(
        svg.matches("<rect").count(),
        3,
        "the background and two holds: {svg}"
    );
    assert_eq!(svg.matches("<polygon").count(), 1, "{svg}");
    assert!(svg.contains("force_released at"), "{svg}");
    let holds = page.split("<h2>Holds</h2>").nth(1).unwrap();
    let holds = holds.split("</table>").next().unwrap();
    assert_eq!(rows_on(holds), 2, "{holds}");
    let released = format!(">{first_token}</td><td>released</td>");
    let forced = format!(">{second_token}</td><td>force_released</td>");
    assert!(holds.contains(&released), "{holds}");
    assert!(holds.contains(&forced), "{holds}");
    let events = page
        .split("<h2>Events of the last hour</h2>")
        .nth(1)
        .unwrap();
    assert_eq!(rows_on(events), 4, "{events}");
    assert!(events.contains(">console:ops<"), "{events}");
    drop(second);
    recording.shutdown().await;
}

/// `/jobs`: a job's runs and skips, from the history its recording Locker wrote.
async fn jobs_show_their_runs_and_skips<DB: TestBackend>()
where
    dblock::AnyLocker: From<dblock::Locker<DB>>,
{
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let recording = recording(&db);
    for _ in 0..2 {
        let ran = recording
            .job("nightly<x>")
            .run(async |_| Ok::<_, dblock::Error>(()))
            .await
            .unwrap();
        assert!(ran.is_some());
    }
    let held = hold(&db, "nightly<x>").await;
    let skipped = recording
        .job("nightly<x>")
        .run(async |_| Ok::<_, dblock::Error>(()))
        .await
        .unwrap();
    assert!(skipped.is_none());
    let jobs = HistoryFilter::new().kinds([EventKind::JobRan, EventKind::JobSkipped]);
    common::wait_until(
        "three job events written",
        Duration::from_secs(15),
        async || recording.history(&jobs).await.unwrap().len() == 3,
    )
    .await;
    let (status, page) = get(&web::router(db.locker.clone()), "/jobs").await;
    assert_eq!(status, StatusCode::OK);
    let row = page.split("<td>nightly&lt;x&gt;</td>").nth(1).expect(&page);
    let row = row.split("</tr>").next().unwrap();
    let numbers: Vec<&str> = row
        .split(r#"<td class="num">"#)
        .skip(1)
        .map(|cell| cell.split("</td>").next().unwrap())
        .collect();
    // Last run, took, runs, skips, overruns, next period.
    assert_eq!(numbers[2..], ["2", "1", "0", ""], "{row}");
    assert!(row.contains("<td>job</td>"), "{row}");
    held.release().await.unwrap();
    recording.shutdown().await;
}

/// 250 locks: pages of 100 in key order, each with a link to the next, the last without.
async fn pages_hold_a_hundred_rows_and_link_the_next<DB: TestBackend>()
where
    dblock::AnyLocker: From<dblock::Locker<DB>>,
{
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let mut guards = Vec::new();
    for i in 0..250 {
        let key = format!("k{i:03}");
        guards.push(db.locker.try_acquire(&key, LEASE).await.unwrap().unwrap());
    }
    let router = web::router(db.locker.clone());
    let mut uri = "/".to_owned();
    let mut shown = Vec::new();
    loop {
        let (status, page) = get(&router, &uri).await;
        assert_eq!(status, StatusCode::OK);
        shown.push(rows_on(&page));
        match page.split(r#"rel="next" href=""#).nth(1) {
            Some(rest) => uri = rest.split('"').next().unwrap().replace("&amp;", "&"),
            None => break,
        }
        assert!(shown.len() < 5, "a next link past the last row");
    }
    assert_eq!(shown, [100, 100, 50]);
    assert!(uri.contains("after=k199"), "{uri}");
    for guard in guards {
        guard.release().await.unwrap();
    }
}

/// Mounted under a prefix, every link keeps it (axum's `nest` serves `/admin/locks`, not
/// `/admin/locks/`); at the root, links have none.
async fn links_follow_the_mount_prefix<DB: TestBackend>()
where
    dblock::AnyLocker: From<dblock::Locker<DB>>,
{
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let guard = hold(&db, "a/b").await;
    let app = Router::new().nest("/admin/locks", web::router(db.locker.clone()));
    let (status, page) = get(&app, "/admin/locks").await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains(r#"href="/admin/locks/primitives""#), "{page}");
    assert!(
        page.contains(r#"href="/admin/locks/assets/console.css""#),
        "{page}"
    );
    assert!(page.contains(r#"href="/admin/locks/key/a%2Fb""#), "{page}");
    let (status, page) = get(&app, "/admin/locks/metrics").await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains(r#"href="/admin/locks/""#), "{page}");
    let (_, page) = get(&web::router(db.locker.clone()), "/metrics").await;
    assert!(page.contains(r#"href="/primitives""#), "{page}");
    guard.release().await.unwrap();
}

/// No page shows the connection URL (nor its host, port or file), whatever it answers,
/// errors included.
async fn no_page_shows_the_database_url<DB: TestBackend>()
where
    dblock::AnyLocker: From<dblock::Locker<DB>>,
{
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let guard = hold(&db, "held").await;
    let missing = dblock::Locker::builder(db.pool.clone())
        .table("no_such_table")
        .build()
        .unwrap();
    let url = DB::url(&db.location);
    // Host, port, user, database or file: what follows the scheme.
    let after_scheme = url.split_once("://").map_or(url.as_str(), |(_, rest)| rest);
    let secret_parts: Vec<&str> = after_scheme
        .split(['/', '@', '?', ':'])
        .filter(|part| part.len() > 4)
        .collect();
    for console in [db.locker.clone(), missing] {
        let router = Console::new(console).allow_force_release("ops").router();
        let mut pages = Vec::new();
        for path in ["/", "/primitives", "/metrics", "/?after=%00"] {
            pages.push(get(&router, path).await);
        }
        pages.push(post(&router, "/release/confirm", &[("key", "held")], &[]).await);
        for (status, page) in pages {
            assert!(!page.contains(&url), "{status}: {page}");
            for part in &secret_parts {
                assert!(!page.contains(part), "{part:?} in {status}: {page}");
            }
        }
    }
    guard.release().await.unwrap();
}

/// `/primitives`: a semaphore's permits in use, a read-write lock's readers, an
/// election's leader and, from the history, its latest terms.
async fn primitives_show_permits_readers_and_terms<DB: TestBackend>()
where
    dblock::AnyLocker: From<dblock::Locker<DB>>,
{
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let recording = recording(&db);
    let pool = recording.semaphore("pool<x>", 3);
    let permits = [
        pool.try_acquire(LEASE).await.unwrap().unwrap(),
        pool.try_acquire(LEASE).await.unwrap().unwrap(),
    ];
    let catalog = recording.rw_lock("catalog");
    let readers = [
        catalog.try_read(LEASE).await.unwrap().unwrap(),
        catalog.try_read(LEASE).await.unwrap().unwrap(),
    ];
    let relay = recording.election("relay");
    let first = relay.campaign("node-a", LEASE).await.unwrap();
    let first_term = first.fencing_token();
    first.resign().await.unwrap();
    let second = relay.campaign("node-b", LEASE).await.unwrap();
    let second_term = second.fencing_token();
    let terms = HistoryFilter::new()
        .key("relay~leader")
        .kinds([EventKind::Acquired]);
    common::wait_until("two terms written", Duration::from_secs(15), async || {
        recording.history(&terms).await.unwrap().len() == 2
    })
    .await;

    let (status, page) = get(&web::router(db.locker.clone()), "/primitives").await;
    assert_eq!(status, StatusCode::OK);
    let row_of = |name: &str| {
        let row = page.split(&format!("<td>{name}</td>")).nth(1).expect(&page);
        row.split("</tr>").next().unwrap().to_owned()
    };
    assert!(row_of("pool&lt;x&gt;").contains(">2 of 3<"), "{page}");
    let catalog_row = row_of("catalog");
    assert!(
        catalog_row.starts_with("<td>read</td><td class=\"num\">2</td>"),
        "{catalog_row}"
    );
    let relay_row = row_of("relay");
    assert!(relay_row.contains(">node-b<"), "{relay_row}");
    assert!(
        relay_row.contains(&format!(">{second_term}<")),
        "{relay_row}"
    );
    assert!(
        relay_row.contains(&format!("#{second_term} <code>node-b</code>")),
        "{relay_row}"
    );
    assert!(
        relay_row.contains(&format!("#{first_term} <code>node-a</code>")),
        "{relay_row}"
    );
    second.resign().await.unwrap();
    for reader in readers {
        reader.release().await.unwrap();
    }
    for permit in permits {
        permit.release().await.unwrap();
    }
    recording.shutdown().await;
}

/// The "Waiting (other processes)" cell of `key`'s row on a locks page.
fn waiting_elsewhere(page: &str, key: &str) -> String {
    let row = page
        .split("<tr")
        .find(|row| row.contains(&format!(">{key}</a>")))
        .unwrap_or_else(|| panic!("no row of {key}: {page}"));
    let at = row.find(r#"class="num elsewhere">"#).expect("the cell") + 22;
    row[at..].split("</td>").next().unwrap().to_owned()
}

/// Waiters of other processes show: a second Locker on a pool of its own (as another
/// process's would be) waits in `acquire` for a key the first holds, and the locks page
/// says that key is waited for (a count of 1, or "yes" on PostgreSQL) and another held
/// key not.
async fn waiters_of_other_processes_show<DB: TestBackend>()
where
    dblock::AnyLocker: From<dblock::Locker<DB>>,
{
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let held = hold(&db, "waited").await;
    let quiet = hold(&db, "quiet").await;
    let other = dblock::Locker::builder(db.another_pool().await)
        .table(&db.table)
        .build()
        .unwrap();
    let waiter = tokio::spawn({
        let other = other.clone();
        async move {
            other
                .acquire("waited", LEASE, Duration::from_secs(60))
                .await
        }
    });
    common::wait_until(
        "the other Locker waits",
        Duration::from_secs(10),
        async || other.waiting("waited") == 1,
    )
    .await;
    let router = web::router(db.locker.clone());
    // The other Locker marks the row (or registers its queue) once its first attempt
    // lost: a statement of its own after the attempt, which nothing here can await.
    common::wait_until(
        "the page shows the waiter",
        Duration::from_secs(20),
        async || {
            let (_, page) = get(&router, "/").await;
            !matches!(waiting_elsewhere(&page, "waited").as_str(), "0" | "no")
        },
    )
    .await;
    let (status, page) = get(&router, "/").await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("Waiting (other processes)"), "{page}");
    // The note says what this backend counts.
    let backend = dblock::AnyLocker::from(db.locker.clone()).backend();
    assert!(page.contains(&format!("on {backend}")), "{page}");
    // One Locker waits: PostgreSQL's flag, or a count of exactly one.
    let waited = waiting_elsewhere(&page, "waited");
    assert!(matches!(waited.as_str(), "yes" | "1"), "{waited}: {page}");
    let quiet_cell = waiting_elsewhere(&page, "quiet");
    assert!(
        matches!(quiet_cell.as_str(), "0" | "no"),
        "{quiet_cell}: {page}"
    );
    // This console's own Locker waits for neither.
    assert_eq!(db.locker.waiting("waited"), 0);
    held.release().await.unwrap();
    let won = waiter.await.unwrap().unwrap();
    won.release().await.unwrap();
    quiet.release().await.unwrap();
    other.shutdown().await;
}

/// Every page, a timeline, the confirmation page and the refused releases write nothing:
/// triggers count each insert, update and delete on the lock table, its marks and its
/// history (SQLite, whose triggers see every write of every connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_writes_only_a_confirmed_release() {
    let Some(db) = TestDb::<dblock::Sqlite>::open().await else {
        return;
    };
    let t = &db.table;
    let counted = [t.clone(), format!("{t}_waiter"), format!("{t}_events")];
    count_writes(&db, &counted).await;
    let guard = hold(&db, "held").await;
    let before = writes(&db).await;
    let router = Console::new(db.locker.clone())
        .allow_force_release("ops")
        .router();
    for path in [
        "/",
        "/?prefix=h&after=a",
        "/primitives",
        "/jobs",
        "/metrics",
        "/key/held",
    ] {
        let (status, page) = get(&router, path).await;
        assert_eq!(status, StatusCode::OK, "{path}: {page}");
    }
    let (_, confirm) = post(&router, "/release/confirm", &[("key", "held")], &[]).await;
    let (status, _) = post(&router, "/release", &[("key", "held"), ("csrf", "x")], &[]).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(writes(&db).await, before, "reads wrote");
    let fields = [("key", "held"), ("csrf", &csrf_of(&confirm))];
    let (status, _) = post(&router, "/release", &fields, &[]).await;
    assert_eq!(status, StatusCode::OK);
    // The row's delete and its force_released event.
    assert_eq!(writes(&db).await, before + 2);
    drop(guard);
}

per_backend!(
    a_held_lock_shows_with_its_owner_and_token,
    keys_and_owners_are_escaped,
    force_release_is_refused_unless_enabled,
    force_release_needs_the_csrf_token_and_the_same_origin,
    pages_hold_a_hundred_rows_and_link_the_next,
    links_follow_the_mount_prefix,
    no_page_shows_the_database_url,
    a_keys_timeline_shows_holds_and_force_releases,
    jobs_show_their_runs_and_skips,
    primitives_show_permits_readers_and_terms,
    waiters_of_other_processes_show,
);
