//! Scenario 7: hostile input. Keys with quotes, backslashes, SQL, control characters,
//! emoji and lengths at the 128-byte boundary either round-trip exactly (acquire, the row
//! names the owner, a rival is refused, release) or fail with a typed `InvalidKey`;
//! hostile table names fail with `InvalidTableName` or work as a table. Nothing else is
//! written: the row counts and the list of tables, indexes and triggers say so.

use std::collections::BTreeSet;
use std::time::Duration;

use dblock::{Error, Locker};

use crate::db::FaultDb;
use crate::{Ctx, Res};

pub const NAME: &str = "7 hostile keys and table names";

const TABLE: &str = "abuse_lock";
/// The table a hostile name would like to drop.
const CANARY: &str = "y";
const LEASE: Duration = Duration::from_secs(30);

/// Keys that must work, all held at the same time: distinct keys are distinct locks,
/// byte for byte (case, trailing spaces, Unicode normalization).
fn good_keys() -> Vec<String> {
    let mut keys: Vec<String> = [
        "it's",
        "say \"hi\"",
        "back\\slash",
        "\\",
        "\\'",
        "'; DROP TABLE y; --",
        "\"; DROP TABLE y; --",
        "`; DROP TABLE y; --",
        "%",
        "_",
        "*?[]",
        "🔒 key 🗝️",
        "tab\there\nnewline\r",
        "\u{1}\u{7f}",
        "pad",
        "pad ",
        " pad",
        "Case",
        "case",
        "\u{e9}",   // é, composed
        "e\u{301}", // é, decomposed
        "\u{feff}bom",
        "ǅ",
    ]
    .iter()
    .map(|k| (*k).to_owned())
    .collect();
    keys.push("k".repeat(128));
    keys.push("🔒".repeat(32)); // 128 bytes in 32 characters
    keys.push("é".repeat(64)); // 128 bytes in 64 characters
    keys
}

/// Keys that must be refused with `InvalidKey` before anything is sent.
fn bad_keys() -> Vec<String> {
    vec![
        String::new(),
        "a\0b".to_owned(),
        "\0".to_owned(),
        "k".repeat(129),
        "🔒".repeat(33),
        format!("{}é", "k".repeat(127)), // 129 bytes: the last character straddles
    ]
}

/// Table names that must be refused with `InvalidTableName`.
fn bad_tables() -> Vec<String> {
    let mut names: Vec<String> = [
        "x; DROP TABLE y",
        "x\"",
        "x\"; DROP TABLE y; --",
        "x`",
        "`x`",
        "x'",
        "tàble",
        "表",
        "",
        "1x",
        "x y",
        "x-y",
        // `x.y` names schema x's table on PostgreSQL (refused elsewhere); these are
        // refused everywhere.
        "x.y.z",
        ".x",
        "x.",
        "pg_catalog.x",
        "y\0",
        "x\n",
        // Plain identifiers, but reserved words on at least one backend: migrate() would
        // fail half-way (after creating the history table) on that backend.
        "order",
        "SELECT",
        "user",
        "key",
        "lock",
        "sqlite_master",
    ]
    .iter()
    .map(|n| (*n).to_owned())
    .collect();
    names.push("a".repeat(41));
    names
}

/// Table names that must work end to end.
fn good_tables() -> Vec<String> {
    vec!["a".repeat(40), "Mixed_Case_9".to_owned(), "_x".to_owned()]
}

pub async fn run<DB: FaultDb>(ctx: &mut Ctx<DB>) -> Res<String> {
    let pool = &ctx.pool;
    DB::create_canary(pool, CANARY).await?;
    let locker = Locker::builder(pool.clone()).table(TABLE).build()?;
    locker.migrate().await?;
    let rival = Locker::builder(pool.clone()).table(TABLE).build()?;
    let objects_before = DB::objects(pool).await?;
    ensure!(
        DB::count(pool, TABLE).await? == 0,
        "{TABLE} is not empty at the start"
    );

    // Every good key at once.
    let keys = good_keys();
    let mut guards = Vec::new();
    for key in &keys {
        let guard = locker.try_acquire(key, LEASE).await?.ok_or_else(|| {
            format!("{key:?} was refused while nobody held it: it collides with another key")
        })?;
        guards.push(guard);
    }
    for (key, guard) in keys.iter().zip(&guards) {
        let row = locker
            .holder(key)
            .await?
            .ok_or_else(|| format!("no row for {key:?}"))?;
        ensure!(
            row.owner == guard.owner() && row.fencing_token == guard.fencing_token(),
            "{key:?}: the row {row:?} is not its guard's"
        );
        ensure!(
            rival.try_acquire(key, LEASE).await?.is_none(),
            "{key:?}: a rival got it while held"
        );
    }
    let held_rows = DB::count(pool, TABLE).await?;
    ensure!(
        held_rows == keys.len() as i64,
        "{} keys held, {held_rows} rows",
        keys.len()
    );
    for guard in guards {
        let key = guard.key().to_owned();
        guard
            .release()
            .await
            .map_err(|e| format!("releasing {key:?}: {e}"))?;
    }
    ensure!(
        DB::count(pool, TABLE).await? == 0,
        "rows left after releasing every key"
    );

    // Bad keys, through every entry point.
    let bad = bad_keys();
    for key in &bad {
        let outcomes = [
            locker.try_acquire(key, LEASE).await.map(|_| ()),
            locker.acquire(key, LEASE, Duration::ZERO).await.map(|_| ()),
            locker.holder(key).await.map(|_| ()),
            locker
                .with_lock(key, LEASE, Duration::ZERO, async |_| Ok::<_, Error>(()))
                .await,
        ];
        for outcome in outcomes {
            ensure!(
                matches!(outcome, Err(Error::InvalidKey { .. })),
                "key {key:?} gave {outcome:?}, expected InvalidKey"
            );
        }
    }

    // Bad table names are refused when the locker is built.
    let bad_names = bad_tables();
    for name in &bad_names {
        let built = Locker::builder(pool.clone()).table(name.as_str()).build();
        ensure!(
            matches!(built, Err(Error::InvalidTableName { .. })),
            "table name {name:?} gave {:?}, expected InvalidTableName",
            built.map(|_| ())
        );
    }

    // Good table names work end to end.
    let tables = good_tables();
    for name in &tables {
        let custom = Locker::builder(pool.clone()).table(name.as_str()).build()?;
        custom
            .migrate()
            .await
            .map_err(|e| format!("migrating table {name:?}: {e}"))?;
        let guard = custom
            .try_acquire("it's", LEASE)
            .await?
            .ok_or("fresh table, key held")?;
        let row = custom.holder("it's").await?.ok_or("no row")?;
        ensure!(row.owner == guard.owner(), "table {name:?}: row {row:?}");
        guard.release().await?;
        ensure!(
            custom.holder("it's").await?.is_none(),
            "table {name:?}: row left after release"
        );
    }

    // Nothing else was written: same rows, and every new object belongs to a good table.
    ensure!(
        DB::count(pool, TABLE).await? == 0,
        "rows appeared in {TABLE}"
    );
    ensure!(
        DB::count(pool, CANARY).await? == 0,
        "rows appeared in the canary table"
    );
    let objects_after = DB::objects(pool).await?;
    ensure!(
        objects_after.contains(CANARY),
        "the canary table {CANARY:?} is gone"
    );
    let unexpected: BTreeSet<&String> = objects_after
        .difference(&objects_before)
        .filter(|object| {
            !tables
                .iter()
                .any(|t| object.to_lowercase().starts_with(&t.to_lowercase()))
        })
        .collect();
    ensure!(
        unexpected.is_empty(),
        "objects created that belong to no accepted table: {unexpected:?}"
    );
    let missing: Vec<&String> = objects_before.difference(&objects_after).collect();
    ensure!(missing.is_empty(), "objects disappeared: {missing:?}");
    Ok(format!(
        "{} keys round-tripped at once (128-byte ASCII/emoji/é, quotes, SQL, NUL-free controls, \
         pad/case/normalization twins); {} keys InvalidKey x4 entry points; \
         {} table names InvalidTableName, {} round-tripped; nothing else written",
        keys.len(),
        bad.len(),
        bad_names.len(),
        tables.len()
    ))
}
