//! The console in a real browser: Debian's headless Chromium driven through ChromeDriver
//! (WebDriver, the `fantoccini` client), against `dblock web` (the CLI's server, behind its
//! token) on every backend. A lock the test holds appears; its key's timeline draws its
//! holds; a hostile key is shown as text and runs nothing; a request without the token is
//! refused; force-release is refused by a read-only console, and on one that enables it
//! removes the row through the confirmation page and leaves its event in the history.
//!
//! Screenshots go to `target/browser/`; with `DBLOCK_UPDATE_SCREENSHOTS=1` also to `docs/`
//! (the README shows `docs/console.png`). Without Chromium and ChromeDriver the test says
//! why and skips, or fails when `DBLOCK_TEST_REQUIRE` names `browser` (CI does).

// This binary uses part of the shared harness; the rest is for the conformance binaries.
#[allow(dead_code)]
#[macro_use]
mod common;
#[path = "browser/driver.rs"]
mod driver;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{TestBackend, TestDb};
use dblock::{EventKind, HistoryFilter, LockEvent, Locker};
use fantoccini::{Client, Locator};
use tokio::io::AsyncBufReadExt as _;
use tokio::process::{Child, Command};

const LEASE: Duration = Duration::from_secs(120);
/// How long the history may take to hold what the test recorded (a tick is 1 s).
const HISTORY_WAIT: Duration = Duration::from_secs(30);
/// A key that would run script if a page spliced it in as HTML.
const HOSTILE: &str =
    "<img src=x onerror=\"window.__dblock_xss=1\"><script>window.__dblock_xss=2</script>";
const KEY: &str = "browser:invoice-42";
/// The read-only console's token; the one that enables force-release has another (cookies
/// are per host, not per port: the second console must not take the first one's).
const TOKENS: [&str; 2] = [
    "browser-test-read-only-0123456789abcdef",
    "browser-test-releasing-0123456789abcdef",
];
const OPERATOR: &str = "browser-test";

/// `dblock web` on the test's table, on a free loopback port; killed when dropped.
struct Console {
    _server: Child,
    token: &'static str,
    /// `http://127.0.0.1:<port>`
    base: String,
}

impl Console {
    async fn start<DB: TestBackend>(db: &TestDb<DB>, allow_force_release: bool) -> Console {
        let url = match DB::LABEL {
            "sqlite" => format!("sqlite:{}", db.location),
            _ => db.location.clone(),
        };
        let token = TOKENS[usize::from(allow_force_release)];
        let mut command = Command::new(env!("CARGO_BIN_EXE_dblock"));
        command
            .args(["--database-url", &url, "--table", &db.table])
            .args(["web", "--listen", "127.0.0.1:0", "--token", token])
            .env_remove("DATABASE_URL")
            .env("USER", OPERATOR)
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true);
        if allow_force_release {
            command.arg("--allow-force-release");
        }
        let mut server = command.spawn().expect("dblock web starts");
        let stdout = server.stdout.take().expect("its stdout");
        let first = tokio::io::BufReader::new(stdout)
            .lines()
            .next_line()
            .await
            .expect("its stdout reads")
            .expect("the address line");
        let at = first.split("http://").nth(1).expect(&first);
        let addr = at.split('/').next().expect(&first);
        Console {
            _server: server,
            token,
            base: format!("http://{addr}"),
        }
    }

    /// Opens the console in `browser`: the token once in the address, traded for the
    /// console's cookie.
    async fn log_in(&self, browser: &Client) {
        browser
            .goto(&format!("{}/?token={}", self.base, self.token))
            .await
            .expect("the console opens with its token");
        let url = browser.current_url().await.unwrap();
        assert!(
            !url.as_str().contains(self.token),
            "the token left the address: {url}"
        );
    }
}

/// The events of `key` once `enough` of them are written (the recording Locker writes its
/// noted events once a tick).
async fn events_of<DB: TestBackend>(
    locker: &Locker<DB>,
    key: &str,
    enough: usize,
) -> Vec<LockEvent> {
    let until = Instant::now() + HISTORY_WAIT;
    loop {
        let filter = HistoryFilter::new().key(key).oldest_first();
        let events = locker.history(&filter).await.unwrap();
        if events.len() >= enough {
            return events;
        }
        assert!(
            Instant::now() < until,
            "{enough} events of {key} not written in {HISTORY_WAIT:?}: {events:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Saves `browser`'s window as `name`.png under target/browser/ (and docs/ when asked).
async fn screenshot(browser: &Client, name: &str, label: &str) {
    let png = browser.screenshot().await.expect("a screenshot");
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dir = root.join("target").join("browser");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("{name}-{label}.png")), &png).unwrap();
    if std::env::var("DBLOCK_UPDATE_SCREENSHOTS").is_ok_and(|v| v == "1") && label == "postgres" {
        std::fs::write(root.join("docs").join(format!("{name}.png")), &png).unwrap();
    }
}

/// How long a page may take to show what the test waits for, on a busy machine.
const PAGE_WAIT: Duration = Duration::from_secs(30);

/// The element `locator` finds once the page shows it (a click's navigation may not have
/// ended when the click returns).
async fn appears(browser: &Client, locator: Locator<'_>) -> fantoccini::elements::Element {
    let what = format!("{locator:?}");
    browser
        .wait()
        .at_most(PAGE_WAIT)
        .for_element(locator)
        .await
        .unwrap_or_else(|err| panic!("{what} did not appear: {err}"))
}

/// Clicks what `locator` finds, found again if the page's live refresh replaced it between
/// the find and the click.
async fn click(browser: &Client, locator: Locator<'_>) {
    for _ in 0..5 {
        let element = appears(browser, locator).await;
        match element.click().await {
            Ok(()) => return,
            Err(fantoccini::error::CmdError::Standard(err))
                if err.error == fantoccini::error::ErrorStatus::StaleElementReference => {}
            Err(err) => panic!("clicking {locator:?}: {err}"),
        }
    }
    panic!("{locator:?} was replaced five times in a row");
}

/// The status of a form POST the page itself sends (same origin, with the cookie).
async fn post_from_page(browser: &Client, path: &str, body: &str) -> u16 {
    let script = "const [path, body, done] = arguments;
        fetch(path, { method: 'POST', body,
                      headers: { 'Content-Type': 'application/x-www-form-urlencoded' } })
            .then(r => done(r.status), e => done(String(e)));";
    let status = browser
        .execute_async(script, vec![path.into(), body.into()])
        .await
        .expect("the page's fetch");
    status
        .as_u64()
        .unwrap_or_else(|| panic!("a status, not {status}")) as u16
}

async fn the_console_works_in_a_real_browser<DB: TestBackend>() {
    if let Some(reason) = driver::missing() {
        common::skip("browser", &reason);
        return;
    }
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    // A recording Locker on the test's table: one hold that ended, one on now, and the
    // hostile key.
    let locker = Locker::builder(db.pool.clone())
        .table(&db.table)
        .history(Duration::from_secs(3600))
        .build()
        .unwrap();
    let ended = locker
        .try_acquire(KEY, LEASE)
        .await
        .unwrap()
        .expect("a free key");
    ended.release().await.unwrap();
    let held = locker
        .try_acquire(KEY, LEASE)
        .await
        .unwrap()
        .expect("a free key");
    let hostile = locker
        .try_acquire(HOSTILE, LEASE)
        .await
        .unwrap()
        .expect("a free key");
    let before = events_of(&locker, KEY, 3).await;
    let kinds: Vec<EventKind> = before.iter().map(|event| event.kind).collect();
    assert_eq!(
        kinds,
        [
            EventKind::Acquired,
            EventKind::Released,
            EventKind::Acquired
        ]
    );

    // One browser at a time: the three backends' cases would otherwise start three
    // Chromiums at once on a two-core machine.
    static ONE_BROWSER: std::sync::OnceLock<tokio::sync::Mutex<()>> = std::sync::OnceLock::new();
    let _turn = ONE_BROWSER.get_or_init(Default::default).lock().await;
    let chromedriver = driver::Driver::start().await;
    let browser = chromedriver.session().await;
    let read_only = Console::start(&db, false).await;

    // Without the token: refused, nothing of the table shown.
    browser.goto(&format!("{}/", read_only.base)).await.unwrap();
    let refused = browser
        .find(Locator::Css("body"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(refused.contains("needs its token"), "{refused}");
    assert!(!refused.contains(KEY), "{refused}");
    assert!(browser.find(Locator::Css("table.locks")).await.is_err());

    // With it: the held key, its owner and token; the hostile key as text, run nowhere.
    read_only.log_in(&browser).await;
    let table = browser
        .find(Locator::Css("table.locks"))
        .await
        .expect("the locks table");
    let text = table.text().await.unwrap();
    assert!(text.contains(KEY), "{text}");
    assert!(text.contains(held.owner()), "{text}");
    assert!(text.contains(&held.fencing_token().to_string()), "{text}");
    assert!(
        text.contains(HOSTILE),
        "the hostile key shown as text: {text}"
    );
    let ran = browser
        .execute("return window.__dblock_xss === undefined && document.querySelectorAll('table.locks img, table.locks script').length === 0", vec![])
        .await
        .unwrap();
    assert_eq!(
        ran,
        serde_json::Value::Bool(true),
        "the hostile key ran or made elements"
    );
    // Read-only: no release form, and a POST is refused; the row stays.
    assert!(
        browser
            .find_all(Locator::Css("table.locks form"))
            .await
            .unwrap()
            .is_empty()
    );
    let body = format!("key={}&csrf=x", KEY.replace(':', "%3A"));
    assert_eq!(
        post_from_page(&browser, "release/confirm", &body).await,
        403
    );
    assert_eq!(post_from_page(&browser, "release", &body).await, 403);
    assert!(db.locker.holder(KEY).await.unwrap().is_some());
    screenshot(&browser, "console", DB::LABEL).await;

    // The key's timeline: both holds drawn as bars over the last hour.
    click(&browser, Locator::LinkText(KEY)).await;
    appears(&browser, Locator::Css("svg.timeline")).await;
    let bars = browser
        .find_all(Locator::Css("svg.timeline rect[y='14']"))
        .await
        .unwrap();
    assert_eq!(
        bars.len(),
        2,
        "one bar for the ended hold, one for the current"
    );
    screenshot(&browser, "timeline", DB::LABEL).await;

    // A console that enables force-release: the row's button, the confirmation, then the
    // row is gone and the history has the operator's event.
    drop(read_only);
    let enabled = Console::start(&db, true).await;
    enabled.log_in(&browser).await;
    let row = format!("//tr[td/a[text()='{KEY}']]//button");
    click(&browser, Locator::XPath(&row)).await;
    appears(&browser, Locator::Css("button.danger")).await;
    assert!(
        db.locker.holder(KEY).await.unwrap().is_some(),
        "the first step deletes nothing"
    );
    click(&browser, Locator::Css("button.danger")).await;
    let answer = appears(
        &browser,
        Locator::XPath("//p[starts-with(normalize-space(.), 'Released')]"),
    )
    .await;
    let answer = answer.text().await.unwrap();
    assert!(answer.contains(KEY), "{answer}");
    assert!(
        db.locker.holder(KEY).await.unwrap().is_none(),
        "the row is gone"
    );
    let filter = HistoryFilter::new()
        .key(KEY)
        .kinds([EventKind::ForceReleased]);
    let forced = db.locker.history(&filter).await.unwrap();
    assert_eq!(forced.len(), 1, "{forced:?}");
    assert_eq!(forced[0].owner, held.owner());
    assert_eq!(forced[0].fencing_token, Some(held.fencing_token()));
    assert_eq!(
        forced[0].detail.as_deref(),
        Some(&*format!("console:{OPERATOR}"))
    );

    browser.close().await.unwrap();
    drop(enabled);
    held.release().await.ok(); // lost: the console released it
    hostile.release().await.unwrap();
    locker.shutdown().await;
}

per_backend!(the_console_works_in_a_real_browser);
