//! The operator CLI, run as the built binary against every backend: each subcommand and
//! exit code, the human table and its relative times, `--json` read back and compared
//! with what the library's `list` returns, the filters, and `DATABASE_URL`.
//!
//! The cases are written once, generic over the backend, and instantiated per backend by
//! `suite!` at the bottom; where the databases are (and when a missing one is skipped or
//! a failure) is the shared harness's business (`tests/common`).

// This binary uses part of the shared harness; the rest is for the conformance binaries.
#[allow(dead_code)]
mod common;

use std::time::Duration;

use chrono::{DateTime, Utc};
use dblock::{LockFilter, LockInfo};
use serde_json::Value;

use common::{TestBackend, TestDb};

/// What one run of the binary did.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    /// Exit code 0; what it printed on stdout.
    fn ok(&self) -> &str {
        assert_eq!(self.code, 0, "{self:#?}");
        &self.stdout
    }

    /// Exit code `code` with nothing on stdout and exactly one line on stderr, starting
    /// with `dblock: `: that line.
    fn failed(&self, code: i32) -> &str {
        assert_eq!(self.code, code, "{self:#?}");
        assert_eq!(self.stdout, "", "{self:#?}");
        let lines: Vec<&str> = self.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "one line on stderr: {self:#?}");
        assert!(lines[0].starts_with("dblock: "), "{self:#?}");
        lines[0]
    }

    /// The rows of `--json` output, one object a line.
    fn json_rows(&self) -> Vec<Value> {
        self.ok()
            .lines()
            .map(|line| serde_json::from_str(line).expect("each line is one JSON object"))
            .collect()
    }
}

/// Runs the binary with `args`, and `DATABASE_URL` only if `env_url` gives one (the
/// developer's own is removed).
async fn dblock(args: &[&str], env_url: Option<&str>) -> Run {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_dblock"));
    command
        .args(args)
        .env_remove("DATABASE_URL")
        .kill_on_drop(true);
    if let Some(url) = env_url {
        command.env("DATABASE_URL", url);
    }
    let output = command.output().await.expect("run the dblock binary");
    Run {
        code: output.status.code().expect("an exit code, not a signal"),
        stdout: String::from_utf8(output.stdout).expect("UTF-8 stdout"),
        stderr: String::from_utf8(output.stderr).expect("UTF-8 stderr"),
    }
}

/// The database URL of a test's database (for SQLite the harness gives a file path).
fn url<DB: TestBackend>(db: &TestDb<DB>) -> String {
    match DB::LABEL {
        "sqlite" => format!("sqlite:{}", db.location),
        _ => db.location.clone(),
    }
}

/// `dblock --database-url <the test's database> --table <its table> args..`
async fn on<DB: TestBackend>(db: &TestDb<DB>, args: &[&str]) -> Run {
    let url = url(db);
    let mut all = vec!["--database-url", &url, "--table", &db.table];
    all.extend_from_slice(args);
    dblock(&all, None).await
}

/// Makes a row look acquired `secs` ago, by the database clock, with plain SQL.
async fn acquired_ago<DB: TestBackend>(db: &TestDb<DB>, key: &str, secs: i64) {
    let sql = format!(
        "UPDATE {} SET acquired_at = {} WHERE lock_key = {}",
        db.table,
        DB::now_plus(-secs),
        DB::param(1)
    );
    let updated = DB::exec(&db.pool, sql, vec![key.into()]).await.unwrap();
    assert_eq!(updated, 1, "{key}");
}

/// Four rows: `job:live` held by dblock for 90 s; `job:old`, written by a plain-SQL
/// client, acquired two hours ago and expired ten minutes ago; `job:plain`, the plain
/// client's for an hour; `other`, dblock's. Returns the guards (held while they live).
async fn four_rows<DB: TestBackend>(db: &TestDb<DB>) -> Vec<dblock::LockGuard<DB>> {
    let lease = Duration::from_secs(90);
    let live = db.locker.try_acquire("job:live", lease).await.unwrap();
    let other = db.locker.try_acquire("other", lease).await.unwrap();
    db.plain
        .insert("job:old", "plain-client", -600)
        .await
        .unwrap();
    acquired_ago(db, "job:old", 7_200).await;
    db.plain
        .insert("job:plain", "plain-client", 3_600)
        .await
        .unwrap();
    vec![live.unwrap(), other.unwrap()]
}

/// The cells of a table line, cut at the header's column starts, after checking that
/// the columns line up: left-aligned cells start where their title starts, and tokens
/// (right-aligned) end where `TOKEN` ends.
fn cells(header: &str, line: &str) -> Vec<String> {
    let titles = ["KEY", "OWNER", "TOKEN", "HELD", "EXPIRES", "KIND"];
    let starts: Vec<usize> = titles.iter().map(|t| header.find(t).unwrap()).collect();
    let mut cells = Vec::new();
    for (i, title) in titles.iter().enumerate() {
        let end = starts.get(i + 1).map_or(line.len(), |next| next - 2);
        let cell = &line[starts[i]..end];
        match *title {
            "TOKEN" => assert!(cell.ends_with(|c: char| c.is_ascii_digit()), "{line:?}"),
            _ => assert!(!cell.starts_with(' '), "{title} misaligned: {line:?}"),
        }
        assert!(line[..starts[i]].ends_with("  ") || i == 0, "{line:?}");
        cells.push(cell.trim().to_owned());
    }
    cells
}

fn at(json: &Value, field: &str) -> DateTime<Utc> {
    let text = json[field]
        .as_str()
        .unwrap_or_else(|| panic!("{field} in {json}"));
    DateTime::parse_from_rfc3339(text).unwrap().to_utc()
}

fn millis(from: DateTime<Utc>, to: DateTime<Utc>) -> i64 {
    (to - from).num_milliseconds().max(0)
}

/// A `--json` object is exactly the library's row: the same fields, and durations
/// measured from the `read_at` it carries (a later read than the library's).
fn assert_same_row(json: &Value, info: &LockInfo) {
    let fields: Vec<&str> = json
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let mut expected = [
        "key",
        "owner",
        "fencing_token",
        "acquired_at",
        "expires_at",
        "expired",
        "held_ms",
        "expires_in_ms",
        "read_at",
        "kind",
    ];
    expected.sort();
    assert_eq!(fields, expected);
    assert_eq!(json["key"], info.key.as_str());
    assert_eq!(json["owner"], info.owner.as_str());
    assert_eq!(json["kind"], info.kind());
    assert_eq!(json["fencing_token"], info.fencing_token);
    assert_eq!(at(json, "acquired_at"), info.acquired_at, "{json}");
    assert_eq!(at(json, "expires_at"), info.expires_at, "{json}");
    assert_eq!(json["expired"], info.expired, "{json}");
    let read_at = at(json, "read_at");
    assert!(read_at >= info.read_at, "{json} read before {info:?}");
    assert_eq!(json["held_ms"], millis(info.acquired_at, read_at), "{json}");
    assert_eq!(
        json["expires_in_ms"],
        millis(read_at, info.expires_at),
        "{json}"
    );
}

fn keys(rows: &[Value]) -> Vec<&str> {
    rows.iter()
        .map(|row| row["key"].as_str().unwrap())
        .collect()
}

// ---- The cases -------------------------------------------------------------------------

/// Commands on a table that was never migrated fail with exit code 3 and say what to
/// run; `migrate` creates it (0), a second `migrate` is "up to date" (0), and an empty
/// list is its header (or nothing, with --json).
async fn migrate_and_missing_table<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open_unmigrated().await else {
        return;
    };
    for args in [
        &["list"][..],
        &["show", "k"],
        &["reap"],
        &["release", "--force", "k"],
    ] {
        let line = on(&db, args).await.failed(3).to_owned();
        assert!(line.contains("run `dblock migrate`"), "{args:?}: {line}");
        // PostgreSQL's error as sqlx shows it ends in " at line N" (of the server's C
        // source), which reads like a line of the SQL: not in dblock's text.
        assert!(!line.contains(" at line "), "{args:?}: {line}");
        assert!(line.contains(&db.table), "{line}");
    }
    let applied = on(&db, &["migrate"]).await;
    let expected = format!(
        "applied {} migrations to table \"{}\"\n",
        DB::MIGRATION_FILES,
        db.table
    );
    assert_eq!(applied.ok(), expected);
    let again = on(&db, &["migrate"]).await;
    assert_eq!(
        again.ok(),
        format!("table \"{}\" is up to date\n", db.table)
    );
    assert_eq!(
        on(&db, &["list"]).await.ok(),
        "KEY  OWNER  TOKEN  HELD  EXPIRES  KIND\n"
    );
    assert_eq!(on(&db, &["list", "--json"]).await.ok(), "");
}

/// The human table: aligned columns, rows of dblock and of the plain-SQL client, times
/// relative to the database clock.
async fn list_shows_an_aligned_table<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let guards = four_rows(&db).await;
    let run = on(&db, &["list"]).await;
    assert_eq!(run.stderr, "", "{run:#?}");
    let lines: Vec<&str> = run.ok().lines().collect();
    assert_eq!(lines.len(), 5, "{run:#?}");
    let header = lines[0];
    assert_eq!(
        header.split_whitespace().collect::<Vec<_>>(),
        ["KEY", "OWNER", "TOKEN", "HELD", "EXPIRES", "KIND"]
    );
    let rows: Vec<Vec<String>> = lines[1..].iter().map(|l| cells(header, l)).collect();
    let keys: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    assert_eq!(
        keys,
        ["job:live", "job:old", "job:plain", "other"],
        "key order"
    );

    let live = &rows[0];
    assert_eq!(live[1], guards[0].owner());
    assert_eq!(live[2], guards[0].fencing_token().to_string());
    assert!(live[3].starts_with("held ") && live[3].ends_with(" ms") || live[3] == "held 1 s");
    assert_eq!(live[4], "expires in 1 min");
    let old = &rows[1];
    let holder = db.locker.holder("job:old").await.unwrap().unwrap();
    assert_eq!(
        old[1..3],
        ["plain-client".to_owned(), holder.fencing_token.to_string()]
    );
    assert_eq!(
        old[3..],
        [
            "held 2 h".to_owned(),
            "expired 10 min ago".to_owned(),
            "mutex".to_owned()
        ]
    );
    assert_eq!(rows[2][4], "expires in 59 min");
    assert_eq!(rows[3][1], guards[1].owner());
}

/// `--json` lines are exactly the library's rows, and each filter selects the rows the
/// library's filter does (`--held-longer-than` is the leaked-lock check).
async fn json_and_filters_match_the_library<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let _guards = four_rows(&db).await;
    let hour = Duration::from_secs(3_600);
    let filters: [(&[&str], LockFilter); 7] = [
        (&[], LockFilter::new()),
        (&["--prefix", "job:"], LockFilter::new().prefix("job:")),
        (&["--expired"], LockFilter::new().expired_only()),
        (
            &["--held-longer-than", "1h"],
            LockFilter::new().held_longer_than(hour),
        ),
        (
            &["--held-longer-than", "1h30m", "--prefix", "job:"],
            LockFilter::new()
                .held_longer_than(hour * 3 / 2)
                .prefix("job:"),
        ),
        (
            &["--expired", "--prefix", "other"],
            LockFilter::new().expired_only().prefix("other"),
        ),
        (&["--prefix", "job:p"], LockFilter::new().prefix("job:p")),
    ];
    for (args, filter) in filters {
        let library = db.locker.list_matching(&filter).await.unwrap();
        let mut all = vec!["list", "--json"];
        all.extend_from_slice(args);
        let rows = on(&db, &all).await.json_rows();
        assert_eq!(rows.len(), library.len(), "{args:?}: {rows:#?}");
        for (json, info) in rows.iter().zip(&library) {
            assert_same_row(json, info);
        }
    }
    // What those filters select, spelled out.
    let expect = async |args: &[&str], expected: &[&str]| {
        let mut all = vec!["list", "--json"];
        all.extend_from_slice(args);
        assert_eq!(keys(&on(&db, &all).await.json_rows()), expected, "{args:?}");
    };
    expect(&["--prefix", "job:"], &["job:live", "job:old", "job:plain"]).await;
    expect(&["--expired"], &["job:old"]).await;
    expect(&["--held-longer-than", "1h"], &["job:old"]).await;
    expect(&["--held-longer-than", "3h"], &[]).await;
    expect(&["--expired", "--prefix", "other"], &[]).await;

    // show --json: the same object as list's.
    let info = &db.locker.list("job:old", 1).await.unwrap()[0];
    let run = on(&db, &["show", "job:old", "--json"]).await;
    assert_eq!(run.ok().lines().count(), 1, "{run:#?}");
    assert_same_row(&run.json_rows()[0], info);
}

/// `list --held-longer-than` is the reaper's leaked-lock check from a shell: once the
/// reaper has deleted the expired rows, it shows exactly the rows the check reports.
async fn held_longer_than_is_the_leak_check<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let _guards = four_rows(&db).await;
    acquired_ago(&db, "other", 7_200).await;
    // Before any reap the expired old row is listed too, marked expired.
    let before = on(&db, &["list", "--json", "--held-longer-than", "1h"]).await;
    assert_eq!(keys(&before.json_rows()), ["job:old", "other"]);
    assert_eq!(before.json_rows()[0]["expired"], true);

    let reaper = db
        .locker
        .spawn_reaper(dblock::ReaperConfig {
            interval: Duration::from_millis(50),
            leak_threshold: Some(Duration::from_secs(3_600)),
            ..dblock::ReaperConfig::default()
        })
        .unwrap();
    let mut reports = reaper.long_held();
    let wait = reports.wait_for(|report| report.checks >= 1);
    let report = tokio::time::timeout(Duration::from_secs(15), wait)
        .await
        .expect("a leak check within 15 s")
        .unwrap()
        .clone();
    reaper.stop().await;
    let reported: Vec<(String, String, i64)> = report
        .rows
        .iter()
        .map(|row| (row.key.clone(), row.owner.clone(), row.fencing_token))
        .collect();
    let listed = on(&db, &["list", "--json", "--held-longer-than", "1h"]).await;
    let listed: Vec<(String, String, i64)> = listed
        .json_rows()
        .iter()
        .map(|row| {
            let text = |field: &str| row[field].as_str().unwrap().to_owned();
            (
                text("key"),
                text("owner"),
                row["fencing_token"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(listed, reported);
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(
        listed[0].0, "other",
        "the live old row; the expired one was reaped"
    );
}

/// `--limit` cuts the list and says so on stderr; out of range is a usage error.
async fn limit_is_reported<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let _guards = four_rows(&db).await;
    let cut = on(&db, &["list", "--limit", "2"]).await;
    assert_eq!(cut.ok().lines().count(), 3, "header and two rows: {cut:#?}");
    assert_eq!(cut.stderr, "(first 2 rows; more with --limit)\n");
    let cut = on(&db, &["list", "--json", "--limit", "3"]).await;
    assert_eq!(keys(&cut.json_rows()), ["job:live", "job:old", "job:plain"]);
    assert_eq!(cut.stderr, "(first 3 rows; more with --limit)\n");
    let whole = on(&db, &["list", "--limit", "4"]).await;
    assert_eq!(whole.ok().lines().count(), 5);
    assert_eq!(whole.stderr, "", "nothing was left out");
    for limit in ["0", "10001", "many"] {
        let line = on(&db, &["list", "--limit", limit])
            .await
            .failed(2)
            .to_owned();
        assert!(line.contains("--limit"), "{line}");
    }
}

/// `show`: every field as `name: value` lines; an unknown key (a prefix of one too) is
/// exit code 1, a key dblock refuses exit code 2.
async fn show_one_key<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let guards = four_rows(&db).await;
    let text = on(&db, &["show", "job:live"]).await.ok().to_owned();
    let lines: Vec<(&str, &str)> = text
        .lines()
        .map(|line| line.split_once(':').map(|(n, v)| (n, v.trim())).unwrap())
        .collect();
    let names: Vec<&str> = lines.iter().map(|(name, _)| *name).collect();
    assert_eq!(
        names,
        [
            "key",
            "owner",
            "fencing_token",
            "acquired_at",
            "expires_at",
            "expired",
            "kind"
        ]
    );
    assert_eq!(lines[0].1, "job:live");
    assert_eq!(lines[1].1, guards[0].owner());
    assert_eq!(lines[2].1, guards[0].fencing_token().to_string());
    let expires_at = lines[4].1.strip_suffix(" (expires in 1 min)").expect(&text);
    let expires_at = DateTime::parse_from_rfc3339(expires_at).unwrap().to_utc();
    assert_eq!(expires_at, guards[0].expires_at());
    assert!(lines[3].1.contains(" (held "), "{text}");
    assert_eq!(lines[5].1, "false");
    let old = on(&db, &["show", "job:old"]).await;
    assert!(old.ok().contains("(held 2 h)") && old.ok().contains("(expired 10 min ago)"));

    for missing in ["nope", "job", "job:"] {
        let line = on(&db, &["show", missing]).await.failed(1).to_owned();
        assert!(line.contains("no lock row"), "{line}");
    }
    let long = "k".repeat(dblock::MAX_KEY_BYTES + 1);
    let line = on(&db, &["show", &long]).await.failed(2).to_owned();
    assert!(line.contains("invalid lock key"), "{line}");
    on(&db, &["show", ""]).await.failed(2);
}

/// `release` needs `--force` (2, nothing deleted); with it the row goes whoever holds it
/// and the output says whose it was; a key without a row is 1.
async fn release_needs_force<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let guards = four_rows(&db).await;
    let line = on(&db, &["release", "job:live"]).await.failed(2).to_owned();
    assert!(
        line.contains("--force") && line.contains("whoever holds it"),
        "{line}"
    );
    assert!(db.locker.holder("job:live").await.unwrap().is_some());

    let released = on(&db, &["release", "--force", "job:live"]).await;
    let text = released.ok();
    assert!(text.starts_with("released \"job:live\""), "{text}");
    assert!(text.contains(guards[0].owner()), "{text}");
    let token = format!("fencing token {}", guards[0].fencing_token());
    assert!(text.contains(&token), "{text}");
    assert!(db.locker.holder("job:live").await.unwrap().is_none());
    // The plain client's row, too.
    let text = on(&db, &["release", "--force", "job:plain"])
        .await
        .ok()
        .to_owned();
    assert!(text.contains("plain-client"), "{text}");
    assert_eq!(db.plain.row_count().await, 2);

    let line = on(&db, &["release", "--force", "job:live"])
        .await
        .failed(1)
        .to_owned();
    assert!(line.contains("no lock row"), "{line}");
}

/// `reap` deletes exactly the expired rows and says how many; with none left it says so
/// and exits 0.
async fn reap_deletes_the_expired<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let _guards = four_rows(&db).await;
    db.plain.insert("gone", "plain-client", -1).await.unwrap();
    assert_eq!(on(&db, &["reap"]).await.ok(), "reaped 2 expired rows\n");
    let left = db.locker.list("", 100).await.unwrap();
    let left: Vec<&str> = left.iter().map(|info| info.key.as_str()).collect();
    assert_eq!(left, ["job:live", "job:plain", "other"]);
    // Nothing left is no failure: a `set -e` cron script goes on.
    let nothing = on(&db, &["reap"]).await;
    assert_eq!(
        nothing.ok(),
        format!(
            "nothing to reap: no expired rows in table \"{}\"\n",
            db.table
        )
    );
}

/// `DATABASE_URL` is read when `--database-url` is absent; the option wins over it.
async fn database_url_from_the_environment<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let _guards = four_rows(&db).await;
    let url = url(&db);
    let table = ["--table", db.table.as_str()];
    let from_env = dblock(&[&table[..], &["list", "--json"]].concat(), Some(&url)).await;
    assert_eq!(from_env.json_rows().len(), 4);
    let flag = [&["--database-url", url.as_str()][..], &table, &["reap"]].concat();
    let both = dblock(&flag, Some("redis://nowhere")).await;
    assert_eq!(both.ok(), "reaped 1 expired row\n");
    // Options may also follow the subcommand.
    let after = [
        &["show", "other", "--database-url", url.as_str()][..],
        &table,
    ]
    .concat();
    assert!(dblock(&after, None).await.ok().contains("key:"));
}

/// Input dblock or clap refuses is exit code 2, with nothing written.
async fn usage_errors<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let _guards = four_rows(&db).await;
    let url = url(&db);
    let bad_table = dblock(
        &["--database-url", &url, "--table", "no such", "list"],
        None,
    )
    .await;
    assert!(bad_table.failed(2).contains("invalid table name"));
    let reserved = dblock(&["--database-url", &url, "--table", "order", "list"], None).await;
    assert!(reserved.failed(2).contains("invalid table name"));
    if DB::LABEL != "postgres" {
        // Only PostgreSQL takes a schema-qualified table.
        let qualified = dblock(&["--database-url", &url, "--table", "s.t", "list"], None).await;
        assert!(qualified.failed(2).contains("schema-qualified"));
    }
    for args in [
        &["list", "--held-longer-than", "soon"][..],
        &["list", "--held-longer-than", "300000years"],
        &["list", "--no-such-option"],
        &["frobnicate"],
        &["show"],
        &[],
    ] {
        on(&db, args).await.failed(2);
    }
    assert_eq!(db.plain.row_count().await, 4);
}

/// A server's database that is not there: exit code 3, the server's words, and none of
/// sqlx's " at line N" (PostgreSQL's C source line, which reads like a line of SQL).
async fn missing_database_is_said_plainly<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    if DB::LABEL == "sqlite" {
        return; // sqlite_file_is_created_by_migrate_only covers a missing file.
    }
    let mut missing = url::Url::parse(&url(&db)).unwrap();
    missing.set_path("/dblock_no_such_database");
    let line = dblock(&["--database-url", missing.as_str(), "list"], None)
        .await
        .failed(3)
        .to_owned();
    assert!(line.contains("cannot connect to"), "{line}");
    assert!(line.contains("dblock_no_such_database"), "{line}");
    assert!(!line.contains(" at line "), "{line}");
}

/// `history` reads what recording Lockers wrote: an exact key, a prefix (`PREFIX*`),
/// kinds, an owner, a limit, newest first; `--json` is one object per event with the
/// library's values; a bad `--kind` is a usage error. `release --force` writes a
/// `force_released` event naming the operator (`--operator`, else `cli:$USER`).
async fn history_reads_the_events<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let recording = dblock::Locker::builder(db.pool.clone())
        .table(&db.table)
        .owner_prefix("cli-test:1:")
        .history(Duration::from_secs(3600))
        .build()
        .unwrap();
    for key in ["inv:1", "inv:2", "other"] {
        let guard = recording
            .try_acquire(key, Duration::from_secs(30))
            .await
            .unwrap();
        guard.unwrap().release().await.unwrap();
    }
    recording.shutdown().await;
    let library = db
        .locker
        .history(&dblock::HistoryFilter::new().key("inv:1"))
        .await
        .unwrap();

    let rows = on(&db, &["history", "inv:1", "--json"]).await.json_rows();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows.len(), library.len());
    for (row, event) in rows.iter().zip(&library) {
        assert_eq!(row["key"], "inv:1");
        assert_eq!(row["kind"], event.kind.as_str());
        assert_eq!(row["owner"], event.owner.as_str());
        assert_eq!(row["fencing_token"], event.fencing_token.unwrap());
        assert_eq!(row["id"], event.id);
        assert_eq!(at(row, "at"), event.at);
        assert_eq!(row["row_kind"], "mutex");
    }
    assert_eq!(
        (&rows[0]["kind"], &rows[1]["kind"]),
        (&"released".into(), &"acquired".into())
    );

    let acquired = on(&db, &["history", "inv:*", "--kind", "acquired", "--json"]).await;
    let acquired = acquired.json_rows();
    let keys: Vec<&str> = acquired
        .iter()
        .map(|r| r["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["inv:2", "inv:1"], "newest first");
    let table = on(&db, &["history"]).await.ok().to_owned();
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 7, "{table}");
    assert!(
        lines[0].starts_with("AT") && lines[0].contains("KIND") && lines[0].contains("DETAIL"),
        "{table}"
    );
    assert!(
        lines[1].contains("released") && lines[1].contains("other"),
        "{table}"
    );
    let one = on(
        &db,
        &[
            "history",
            "--limit",
            "1",
            "--owner",
            "cli-test:1:",
            "--since",
            "1h",
            "--json",
        ],
    )
    .await;
    assert_eq!(one.json_rows().len(), 1);
    assert!(
        on(&db, &["history", "--owner", "nobody", "--json"])
            .await
            .ok()
            .is_empty()
    );
    let line = on(&db, &["history", "--kind", "stolen"])
        .await
        .failed(2)
        .to_owned();
    assert!(line.contains("unknown event kind"), "{line}");

    for (key, operator) in [("held:1", Some("ops-team")), ("held:2", None)] {
        let _guard = db
            .locker
            .try_acquire(key, Duration::from_secs(30))
            .await
            .unwrap()
            .unwrap();
        let mut args = vec!["release", "--force", key];
        args.extend(operator.iter().flat_map(|name| ["--operator", *name]));
        on(&db, &args).await.ok();
    }
    let released = on(
        &db,
        &["history", "held:*", "--kind", "force_released", "--json"],
    )
    .await;
    let details: Vec<String> = released
        .json_rows()
        .iter()
        .map(|r| r["detail"].as_str().unwrap().to_owned())
        .collect();
    let user = std::env::var("USER").unwrap_or_else(|_| "unknown".to_owned());
    assert_eq!(details, [format!("cli:{user}"), "ops-team".to_owned()]);
}

/// One HTTP/1.1 request to `addr` (`head`: the request line and headers, without the
/// blank line); the status code and the whole answer (headers and body).
async fn http(addr: &str, head: &str, body: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "{head}\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    let status = answer.split(' ').nth(1).and_then(|code| code.parse().ok());
    (status.expect(&answer), answer)
}

/// `dblock web` refuses every request without its token (none, a wrong one, in any of
/// the places it may travel), a POST included, which deletes nothing; with the token as a
/// bearer, or as the cookie a first `?token=` visit sets, the console answers, and its
/// page shows the held key escaped and no part of the database URL.
async fn web_needs_its_token<DB: TestBackend>() {
    use tokio::io::AsyncBufReadExt as _;

    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let guard = db
        .locker
        .try_acquire("held<k>", Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap();
    let url = url(&db);
    let mut server = tokio::process::Command::new(env!("CARGO_BIN_EXE_dblock"))
        .args(["--database-url", &url, "--table", &db.table])
        .args(["web", "--listen", "127.0.0.1:0", "--allow-force-release"])
        .env_remove("DATABASE_URL")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(server.stdout.take().unwrap()).lines();
    let first = lines.next_line().await.unwrap().expect("the address line");
    let at = first.split("http://").nth(1).expect(&first);
    let (addr, token) = at.split_once("/?token=").expect(&first);
    assert_eq!(token.len(), 32, "{first}");

    let wrong = "0".repeat(32);
    let refused = [
        "GET / HTTP/1.1".to_owned(),
        format!("GET / HTTP/1.1\r\nAuthorization: Bearer {wrong}"),
        format!("GET / HTTP/1.1\r\nCookie: dblock_token={wrong}"),
        format!("GET /?token={wrong} HTTP/1.1"),
        format!("GET /metrics HTTP/1.1\r\nAuthorization: Basic {token}"),
    ];
    for head in &refused {
        let (status, answer) = http(addr, head, "").await;
        assert_eq!(status, 401, "{head}: {answer}");
        assert!(!answer.contains("held"), "{answer}");
    }
    let form = "key=held%3Ck%3E&csrf=x";
    let post = "POST /release HTTP/1.1\r\nContent-Type: application/x-www-form-urlencoded";
    let (status, _) = http(addr, post, form).await;
    assert_eq!(status, 401);
    assert!(db.locker.holder("held<k>").await.unwrap().is_some());

    let (status, page) = http(
        addr,
        &format!("GET / HTTP/1.1\r\nAuthorization: Bearer {token}"),
        "",
    )
    .await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains(">held&lt;k&gt;</a>"), "{page}");
    let after_scheme = url.split_once(':').unwrap().1.trim_start_matches('/');
    for part in after_scheme
        .split(['/', '@', '?', ':'])
        .filter(|part| part.len() > 4)
    {
        assert!(!page.contains(part), "{part:?} in {page}");
    }
    let (status, answer) = http(addr, &format!("GET /?token={token}&prefix=h HTTP/1.1"), "").await;
    assert_eq!(status, 303, "{answer}");
    let answer = answer.to_ascii_lowercase();
    assert!(answer.contains("\r\nlocation: /?prefix=h\r\n"), "{answer}");
    let cookie = format!("set-cookie: dblock_token={token}; httponly; samesite=strict; path=/");
    assert!(answer.contains(&cookie), "{answer}");
    let (status, _) = http(
        addr,
        &format!("GET /primitives HTTP/1.1\r\nCookie: a=b; dblock_token={token}"),
        "",
    )
    .await;
    assert_eq!(status, 200);
    server.kill().await.unwrap();
    guard.release().await.unwrap();
}

macro_rules! suite {
    ($($backend:ident: $db:ty),* $(,)?) => {
        $(mod $backend {
            suite!(@cases $db;
                migrate_and_missing_table,
                missing_database_is_said_plainly,
                list_shows_an_aligned_table,
                json_and_filters_match_the_library,
                held_longer_than_is_the_leak_check,
                limit_is_reported,
                show_one_key,
                release_needs_force,
                reap_deletes_the_expired,
                database_url_from_the_environment,
                usage_errors,
                history_reads_the_events,
                web_needs_its_token,
            );
        })*
    };
    (@cases $db:ty; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                super::$case::<$db>().await;
            }
        )*
    };
}

suite!(postgres: dblock::Postgres, mysql: dblock::MySql, sqlite: dblock::Sqlite);

/// `--table schema.table` on PostgreSQL: `migrate` creates the table in the schema, and
/// `list`, `show` and `release --force` work on it; the same name's table elsewhere (the
/// default schema) is not touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_schema_qualified_table() {
    let Some(db) = TestDb::<dblock::Postgres>::open().await else {
        return;
    };
    let schemas = common::schemas::Schemas::new(&db.pool, &db.location, 1, 1).await;
    let table = format!("{}.{}", schemas.names[0], db.table);
    let run = async |args: &[&str]| {
        let mut all = vec!["--database-url", &db.location, "--table", &table];
        all.extend_from_slice(args);
        dblock(&all, None).await
    };
    let applied = run(&["migrate"]).await;
    assert_eq!(
        applied.ok(),
        format!("applied 5 migrations to table \"{table}\"\n")
    );
    let locker = dblock::Locker::builder(db.pool.clone())
        .table(&table)
        .auto_renew(false)
        .build()
        .unwrap();
    let guard = locker
        .try_acquire("job:1", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    let rows = run(&["list", "--json"]).await.json_rows();
    assert_eq!(keys(&rows), ["job:1"]);
    assert_eq!(
        on(&db, &["list", "--json"]).await.ok(),
        "",
        "the unqualified table is empty"
    );
    assert!(run(&["show", "job:1"]).await.ok().contains(guard.owner()));
    let released = run(&["release", "--force", "job:1"]).await;
    assert!(released.ok().starts_with("released \"job:1\""));
    assert!(locker.holder("job:1").await.unwrap().is_none());
}

// ---- Without a database ----------------------------------------------------------------

/// A loopback port that refuses connections: bound, then closed again.
fn refusing_port() -> u16 {
    let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    socket.local_addr().unwrap().port()
}

/// A server that is not there is exit code 3, within the connect timeout, with the URL
/// (password hidden) in the message.
#[tokio::test]
async fn unreachable_server_is_a_database_error() {
    for scheme in ["postgres", "mysql"] {
        let url = format!("{scheme}://u:secret@127.0.0.1:{}/test", refusing_port());
        let run = dblock(
            &["--database-url", &url, "--connect-timeout", "300ms", "list"],
            None,
        )
        .await;
        let line = run.failed(3);
        assert!(
            line.contains("cannot connect to") && line.contains("u:***@127.0.0.1"),
            "{line}"
        );
        assert!(!line.contains("secret"), "{line}");
    }
}

/// `migrate --print-sql` prints every script under a comment naming it, for the table
/// given, without connecting: no server behind the URL, and no SQLite file created.
#[tokio::test]
async fn print_sql_needs_no_database() {
    let port = refusing_port();
    let path =
        std::env::temp_dir().join(format!("dblock-cli-{}.db", uuid::Uuid::new_v4().simple()));
    let cases = [
        (
            format!("postgres://u@127.0.0.1:{port}/test"),
            5,
            "CREATE SEQUENCE IF NOT EXISTS locks_fencing_seq",
        ),
        (
            format!("mysql://root@127.0.0.1:{port}/test"),
            3,
            "CREATE TRIGGER locks_fence_insert",
        ),
        (
            format!("sqlite:{}", path.display()),
            4,
            "CREATE TRIGGER IF NOT EXISTS locks_fence_insert",
        ),
    ];
    for (url, scripts, marker) in cases {
        let run = dblock(
            &[
                "--database-url",
                &url,
                "--table",
                "locks",
                "migrate",
                "--print-sql",
            ],
            None,
        )
        .await;
        let sql = run.ok();
        let headers = sql.matches("-- dblock migration V").count();
        assert_eq!(headers, scripts, "{url}: {sql}");
        assert!(
            sql.contains("-- dblock migration V1__distributed_lock.sql"),
            "{sql}"
        );
        assert!(sql.contains(marker), "{url}: {sql}");
        assert!(
            !sql.contains("{table}") && !sql.contains("{unlogged}"),
            "{sql}"
        );
    }
    assert!(!path.exists(), "--print-sql created the SQLite file");
}

/// SQLite: `migrate` creates the database file; other commands never do (a missing file
/// is a typo, exit code 3).
#[tokio::test]
async fn sqlite_file_is_created_by_migrate_only() {
    let path =
        std::env::temp_dir().join(format!("dblock-cli-{}.db", uuid::Uuid::new_v4().simple()));
    let url = format!("sqlite:{}", path.display());
    let line = dblock(&["--database-url", &url, "list"], None)
        .await
        .failed(3)
        .to_owned();
    assert!(
        line.contains("no SQLite database file at") && line.contains("dblock migrate"),
        "{line}"
    );
    assert!(!line.contains("code: 14"), "{line}");
    assert!(!path.exists());
    let applied = dblock(&["--database-url", &url, "migrate"], None).await;
    assert!(applied.ok().starts_with("applied "), "{applied:#?}");
    assert!(path.exists());
    let listed = dblock(&["--database-url", &url, "list"], None).await;
    assert_eq!(listed.ok(), "KEY  OWNER  TOKEN  HELD  EXPIRES  KIND\n");
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}

/// Usage errors that need no database, and the help, which is no failure.
#[tokio::test]
async fn usage_without_a_database() {
    let no_url = dblock(&["list"], None).await;
    assert!(no_url.failed(2).contains("DATABASE_URL"));
    let scheme = dblock(&["--database-url", "redis://h/0", "list"], None).await;
    assert!(scheme.failed(2).contains("postgres://"));
    let empty = dblock(&["list"], Some("")).await;
    empty.failed(2);
    // Checked before connecting: the port refuses, yet the answer is the usage error.
    let url = format!("postgres://u@127.0.0.1:{}/test", refusing_port());
    let release = dblock(&["--database-url", &url, "release", "k"], None).await;
    assert!(release.failed(2).contains("--force"));

    // A console on a non-loopback address needs a token chosen by the operator.
    let exposed = dblock(
        &["--database-url", &url, "web", "--listen", "0.0.0.0:8080"],
        None,
    )
    .await;
    assert!(exposed.failed(2).contains("--token"), "{exposed:#?}");
    let short = dblock(&["web", "--token", "short"], None).await;
    short.failed(2);

    let help = dblock(&["--help"], None).await;
    assert!(help.ok().contains("Exit codes:"), "{help:#?}");
    assert_eq!(help.stderr, "");
    let help = dblock(&["list", "--help"], None).await;
    assert!(help.ok().contains("--held-longer-than"), "{help:#?}");
}
