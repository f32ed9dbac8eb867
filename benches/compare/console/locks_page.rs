//! Cell 9.1: the console's locks page over 10,000 held locks: the first page, a page in
//! the middle and the last (key-order paging with `?after=`), and a prefix's first page,
//! each rendered through the Router, beside the page's database read alone.

use std::fmt::Write as _;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use dblock::{LockFilter, Locker};
use tokio::time::Instant;
use tower::ServiceExt as _;

use crate::measure::{BoxError, Samples, median};
use crate::report::{Table, count, ms, verdict};
use crate::servers::{LockDb, Server};
use crate::settings::Settings;

const TABLE: &str = "bench_lock_console";

/// Locks held while the pages are timed.
const HELD: usize = 10_000;

/// Tasks taking the locks (a pool's worth, so setting up is quick).
const TAKERS: usize = 8;

/// The pages timed: name and address.
const PAGES: [(&str, &str); 4] = [
    ("first page", "/"),
    ("a middle page (?after=)", "/?after=console%3A04999"),
    ("the last page (?after=)", "/?after=console%3A09899"),
    ("a prefix's first page", "/?prefix=console%3A07"),
];

pub async fn cell<DB: LockDb>(settings: &Settings, server: &Server<DB>) -> Result<String, BoxError>
where
    dblock::AnyLocker: From<Locker<DB>>,
{
    let lease = Duration::from_secs(3600);
    let locker = server
        .fresh_locker_with(TABLE, |b| b.auto_renew(false))
        .await?;
    eprintln!("console: {}: taking {HELD} locks", server.label);
    let taken = Instant::now();
    let mut takers = Vec::new();
    for t in 0..TAKERS {
        let locker = locker.clone();
        takers.push(tokio::spawn(async move {
            let mut guards = Vec::new();
            for i in (t..HELD).step_by(TAKERS) {
                let key = format!("console:{i:05}");
                match locker.try_acquire(&key, lease).await? {
                    Some(guard) => guards.push(guard),
                    None => return Err(format!("{key} was held already").into()),
                }
            }
            Ok::<_, BoxError>(guards)
        }));
    }
    let mut guards = Vec::new();
    for taker in takers {
        guards.extend(taker.await??);
    }
    let taking = taken.elapsed();
    let router = dblock::web::router(locker.clone());

    // Each page once, checked: 200 and its 100 rows.
    for (name, uri) in PAGES {
        let (status, body) = get(&router, uri).await?;
        let rows = body.matches("<tr").count().saturating_sub(1);
        if status != StatusCode::OK || rows != 100 {
            return Err(format!("{name}: {status}, {rows} rows instead of 100").into());
        }
    }

    let mut pages: Vec<Samples> = PAGES.iter().map(|_| Samples::default()).collect();
    let mut read = Samples::default();
    let mut per_round: Vec<f64> = Vec::new();
    let filter = LockFilter::new().limit(101);
    for round in 0..settings.rounds {
        eprintln!(
            "console: {}: round {}/{}",
            server.label,
            round + 1,
            settings.rounds
        );
        let end = Instant::now() + settings.round;
        let mut first = Samples::default();
        while Instant::now() < end {
            for (p, (_, uri)) in PAGES.iter().enumerate() {
                let t = Instant::now();
                get(&router, uri).await?;
                pages[p].push(t.elapsed());
                if p == 0 {
                    first.push(t.elapsed());
                }
            }
            let t = Instant::now();
            locker.list_matching(&filter).await?;
            read.push(t.elapsed());
        }
        per_round.push(first.percentile(50.0).as_secs_f64());
    }
    drop(guards);
    DB::drop_lock_table(&server.pool, TABLE).await?;

    let mut table =
        Table::new(&["request", "requests", "median (ms)", "p99 (ms)", "max (ms)"]).words(0);
    for ((name, _), samples) in PAGES.iter().zip(pages.iter_mut()) {
        table.row(vec![
            format!("GET {name}"),
            count(samples.nanos().len() as f64),
            ms(samples.percentile(50.0)),
            ms(samples.percentile(99.0)),
            ms(samples.max()),
        ]);
    }
    table.row(vec![
        "list_matching alone (101 rows)".to_owned(),
        count(read.nanos().len() as f64),
        ms(read.percentile(50.0)),
        ms(read.percentile(99.0)),
        ms(read.max()),
    ]);
    let worst_p99 = pages
        .iter_mut()
        .map(|samples| samples.percentile(99.0))
        .max()
        .unwrap_or_default();
    let mut out = format!("### {}\n\n", server.label);
    let _ = writeln!(
        out,
        "{HELD} locks taken in {:.1} s by {TAKERS} tasks. First page's median by round: {}.\n",
        taking.as_secs_f64(),
        per_round
            .iter()
            .map(|secs| format!("{:.1} ms", secs * 1000.0))
            .collect::<Vec<_>>()
            .join(", ")
    );
    out.push_str(&table.render());
    let _ = writeln!(
        out,
        "\n- a page of 100 rows over {HELD} held locks in < 1 s (worst page's p99 {} ms, \
         first page's median {:.1} ms): {}\n",
        ms(worst_p99),
        median(per_round.iter().copied()) * 1000.0,
        verdict(worst_p99 < Duration::from_secs(1))
    );
    Ok(out)
}

/// One request through the Router; its status and body.
async fn get(router: &axum::Router, uri: &str) -> Result<(StatusCode, String), BoxError> {
    let request = Request::get(uri).body(Body::empty())?;
    let response = router.clone().oneshot(request).await?;
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), 1 << 24).await?;
    Ok((status, String::from_utf8(body.to_vec())?))
}
