//! Section 4: stock deduction, each strategy of the stock example (`examples/stock`),
//! dblock's helper against the same SQL by hand.
//!
//! The helper side is the example's own `Shop::run`, strategies untouched: lock-table (a
//! dblock lease plus `assert_held` in the write transaction), for-update (`RowLocker`),
//! optimistic (`Versioned`). The hand-written side sends the statements those helpers
//! send, with the same retry policy and lock wait, from the same worker shape (the
//! workers as futures joined in one task, pulling order numbers from one counter). The
//! example's `atomic` and `none` strategies are plain SQL already, with no helper: they
//! run once per round, as the floor and as what no protection gives.
//!
//! One hot product (the case these strategies exist for), 8 workers, one unit per order
//! and enough stock that no order is refused, so every order does the full work. Each run
//! places a fixed number of orders, sized from a warm-up so it lasts about one round.

mod hand;

use std::fmt::Write as _;

use dblock::{Locker, SqlValue};

use crate::measure::{BoxError, median, spread, turn_order};
use crate::report::{Table, count, ratio, verdict};
use crate::servers::Server;
use crate::settings::Settings;
use crate::stock_example::{RETRY, Shop, Strategy, Workload};
use hand::{Hand, LOCK_TABLE, MAX_ATTEMPTS, PRODUCTS};

pub use hand::HandStock;

const WORKERS: usize = 8;
const WARM_UP_ORDERS: usize = 100;

/// One side of one strategy in the rounds.
#[derive(Clone, Copy)]
enum Side {
    Helper(Strategy),
    Hand(Strategy),
}

#[derive(Default)]
struct Runs {
    rates: Vec<f64>,
    problems: Vec<String>,
}

/// Runs section 4 on one server; returns its markdown.
pub async fn section<DB: HandStock>(settings: &Settings, server: &Server<DB>) -> String
where
    i64: SqlValue<DB>,
{
    match run(settings, server).await {
        Ok(md) => md,
        Err(e) => format!("### {}\n\nNot measured: {e}\n\n", server.label),
    }
}

async fn run<DB: HandStock>(settings: &Settings, server: &Server<DB>) -> Result<String, BoxError>
where
    i64: SqlValue<DB>,
{
    // The example's pool size: a worker may hold a lease attempt and a transaction at once.
    let pool = DB::dedicated_pool(&server.url, 2 * WORKERS as u32 + 2).await?;
    DB::drop_lock_table(&server.pool, LOCK_TABLE).await?;
    DB::drop_table(&server.pool, PRODUCTS).await?;
    // The lock as the example builds it (examples/stock_deduction.rs).
    let locker = Locker::builder(pool.clone())
        .table(LOCK_TABLE)
        .retry(RETRY)
        .build()?;
    let shop = Shop::open(locker, PRODUCTS).await?;
    let hand = Hand::new(pool.clone());

    let mut sides = Vec::new();
    for strategy in [
        Strategy::LockTable,
        Strategy::ForUpdate,
        Strategy::Optimistic,
    ] {
        sides.push(Side::Helper(strategy));
        sides.push(Side::Hand(strategy));
    }
    sides.push(Side::Hand(Strategy::Atomic));
    sides.push(Side::Hand(Strategy::None));
    // The seeds' segmented lock (the example's `segmented`): reported against the single
    // hot lock (lock-table's helper side); it has no hand-written twin.
    sides.push(Side::Helper(Strategy::Segmented));

    let workload = |orders: usize| Workload {
        workers: WORKERS,
        orders,
        products: 1,
        stock: i64::try_from(orders).unwrap_or(i64::MAX),
        quantity: 1,
        max_attempts: MAX_ATTEMPTS,
    };
    let place = async |side: Side, orders: usize| -> Result<(f64, Vec<String>), BoxError> {
        match side {
            Side::Helper(strategy) | Side::Hand(strategy @ (Strategy::Atomic | Strategy::None)) => {
                let report = shop.run(strategy, workload(orders), &|| {}).await?;
                Ok((report.rate(), report.violations()))
            }
            Side::Hand(strategy) => hand.run(&shop, strategy, workload(orders)).await,
        }
    };

    // Orders per run: what each side placed in one round's time in a warm-up (after a
    // first one that only warms connections and caches); the two sides of a strategy
    // place the same number, from the mean of their rates.
    let mut rates = Vec::new();
    for &side in &sides {
        place(side, WARM_UP_ORDERS / 2).await?;
        rates.push(place(side, WARM_UP_ORDERS).await?.0);
    }
    for i in (0..6).step_by(2) {
        let mean = (rates[i] + rates[i + 1]) / 2.0;
        (rates[i], rates[i + 1]) = (mean, mean);
    }
    let orders: Vec<usize> = rates
        .iter()
        .map(|rate| ((rate * settings.round.as_secs_f64()) as usize).clamp(WARM_UP_ORDERS, 50_000))
        .collect();

    let mut runs: Vec<Runs> = (0..sides.len()).map(|_| Runs::default()).collect();
    for r in 0..settings.rounds {
        eprintln!(
            "stock: {}, round {}/{}",
            server.label,
            r + 1,
            settings.rounds
        );
        for i in turn_order(sides.len(), r) {
            match place(sides[i], orders[i]).await {
                Ok((rate, violations)) => {
                    runs[i].rates.push(rate);
                    runs[i].problems.extend(violations);
                }
                Err(err) => runs[i].problems.push(format!("error: {err}")),
            }
        }
    }
    pool.close().await;
    DB::drop_lock_table(&server.pool, LOCK_TABLE).await?;
    DB::drop_table(&server.pool, PRODUCTS).await?;

    Ok(markdown(&server.label, &runs, &orders))
}

fn markdown(label: &str, runs: &[Runs], orders: &[usize]) -> String {
    let books = |r: &Runs| match r.problems.first() {
        None => "ok".to_owned(),
        Some(p) => format!("{} problem(s), first: {p}", r.problems.len()),
    };
    let mut table = Table::new(&[
        "strategy",
        "orders per run",
        "helper orders/s",
        "hand-written orders/s",
        "helper / hand-written",
        "books (helper; hand-written)",
    ])
    .words(5);
    let mut targets = Vec::new();
    for (i, (name, helper)) in [
        ("lock-table: dblock lease + assert_held", "Locker"),
        ("for-update: SELECT .. FOR UPDATE", "RowLocker"),
        ("optimistic: version column", "Versioned"),
    ]
    .into_iter()
    .enumerate()
    {
        let (h, s) = (&runs[2 * i], &runs[2 * i + 1]);
        let per_round: Vec<f64> = h.rates.iter().zip(&s.rates).map(|(a, b)| a / b).collect();
        let m = median(per_round.iter().copied());
        table.row(vec![
            name.to_owned(),
            count(orders[2 * i] as f64),
            count(median(h.rates.iter().copied())),
            count(median(s.rates.iter().copied())),
            ratio(m, spread(per_round)),
            format!("{}; {}", books(h), books(s)),
        ]);
        targets.push(format!(
            "- {helper} / hand-written = {m:.2}x -> {}",
            verdict(m >= 0.9)
        ));
    }
    for (i, name, expected) in [
        (6, "atomic: one conditional UPDATE (no helper)", ""),
        (
            7,
            "none: read, then write, unprotected (no helper)",
            " (expected: lost updates)",
        ),
    ] {
        table.row(vec![
            name.to_owned(),
            count(orders[i] as f64),
            "-".to_owned(),
            count(median(runs[i].rates.iter().copied())),
            "-".to_owned(),
            format!("-; {}{expected}", books(&runs[i])),
        ]);
    }
    let (segmented, single) = (&runs[8], &runs[0]);
    let per_round: Vec<f64> = (segmented.rates.iter())
        .zip(&single.rates)
        .map(|(a, b)| a / b)
        .collect();
    let versus_single = ratio(median(per_round.iter().copied()), spread(per_round));
    table.row(vec![
        "segmented: 8 segment rows, a lease each (no hand-written twin)".to_owned(),
        count(orders[8] as f64),
        count(median(segmented.rates.iter().copied())),
        "-".to_owned(),
        format!("{versus_single} of lock-table"),
        format!("{}; -", books(segmented)),
    ]);
    let mut out = format!("### {label}\n\n{}", table.render());
    out.push_str("\nTarget: helper >= 0.9x the same strategy by hand.\n\n");
    for t in targets {
        let _ = writeln!(out, "{t}");
    }
    let _ = writeln!(
        out,
        "- segmented / the single hot lock (lock-table, helper side) = {versus_single} (report)"
    );
    out.push('\n');
    out
}
