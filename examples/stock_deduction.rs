//! Stock deduction, the job dblock is for: W workers place O orders for P products of S
//! units each, once per strategy, and the books are checked afterwards.
//!
//! ```text
//! cargo run --example stock_deduction                      # embedded SQLite, temp file
//! cargo run --example stock_deduction -- --database-url postgres://postgres@127.0.0.1/test
//! cargo run --example stock_deduction -- --database-url mysql://root@127.0.0.1/test
//! ```
//!
//! The `segmented` strategy splits each product's stock over `--segments` rows (default
//! 8), each deducted under a lease of its own; compare its orders/s with `lock-table`'s
//! one hot lease per product (`--strategy lock-table,segmented` runs just those two).
//!
//! On a server it creates the tables `stock_product`, `stock_product_segment` and
//! `stock_product_lock` (with the
//! lock table's companions: migration history, and PostgreSQL's fencing sequence or
//! MySQL's fencing counters and trigger) and drops them all at the end, unless `--keep`
//! is given; `--table` picks other names. The SQLite file is removed at the end.
//!
//! Exits with status 1 if a protected strategy oversold or lost stock (`none` is there to
//! show what happens without protection, and is never held against the run).

mod stock;

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use dblock::Locker;
use indicatif::{ProgressBar, ProgressStyle};
use sqlx::pool::PoolOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode};

use stock::{Report, Shop, StockDb, Strategy, Workload};

/// What each column of the results table means (printed under it, and by --help).
const COLUMNS: &str = "\
Columns:
  accepted     orders that got their units
  rejected     orders refused because the product was sold out (a correct answer)
  gave up      orders that never got to decide: the lock wait, row-lock wait or optimistic
               attempts ran out (the order should be retried; no stock moved)
  final stock  units left, summed over products
  oversold     units sold beyond the initial stock (must be 0 for a protected strategy)
  lost         deductions that went missing: units accepted + units left - initial units
               (a lost update; must be 0 for a protected strategy)
  retries      optimistic: version conflicts that were read again; segmented: segments
               found short under their lease (another order took the units since the
               read) and orders that had to take every segment's lease
  elapsed      wall time of the strategy's orders
  orders/s     orders (accepted, rejected or given up) per second";

/// Stock deduction under contention, with six strategies: none (no protection, to show
/// what goes wrong), lock-table (dblock's Locker, fenced with assert_held), segmented (the
/// stock split over segment rows, a lease each), for-update (RowLocker), optimistic
/// (Versioned), atomic (one conditional UPDATE).
#[derive(Parser, Debug)]
#[command(after_help = COLUMNS)]
struct Args {
    /// postgres://.. or mysql://..; default: an SQLite file in the temp directory.
    #[arg(long)]
    database_url: Option<String>,
    /// Concurrent workers.
    #[arg(long, default_value_t = 8)]
    workers: usize,
    /// Orders in all.
    #[arg(long, default_value_t = 2000)]
    orders: usize,
    /// Products; order i is for product i % products + 1.
    #[arg(long, default_value_t = 4)]
    products: usize,
    /// Initial units of each product.
    #[arg(long, default_value_t = 400)]
    stock: i64,
    /// Units per order.
    #[arg(long, default_value_t = 1)]
    quantity: i64,
    /// Attempts of the optimistic strategy before an order is given up.
    #[arg(long, default_value_t = 1000)]
    max_attempts: u32,
    /// Segments a product's stock is split over, for the segmented strategy.
    #[arg(long, default_value_t = stock::segmented::SEGMENTS)]
    segments: usize,
    /// Strategies to run (none, lock-table, segmented, for-update, optimistic, atomic);
    /// default all.
    #[arg(long, value_delimiter = ',')]
    strategy: Vec<String>,
    /// The product table (the lock table is `<table>_lock`).
    #[arg(long, default_value = "stock_product")]
    table: String,
    /// Keep the tables (and sequence, triggers) on a server database after the run.
    #[arg(long)]
    keep: bool,
}

#[tokio::main]
async fn main() -> Result<ExitCode, Box<dyn std::error::Error>> {
    let args = Args::parse();
    let strategies = pick(&args.strategy)?;
    if args.segments == 0 {
        return Err("--segments must be at least 1".into());
    }
    let workload = Workload {
        workers: args.workers,
        orders: args.orders,
        products: args.products,
        stock: args.stock,
        quantity: args.quantity,
        max_attempts: args.max_attempts,
    };
    // Each worker may hold two connections at once (a lease attempt and its transaction).
    let connections = u32::try_from(2 * args.workers + 2)?;
    let reports = match args.database_url.as_deref() {
        Some(url) if url.starts_with("postgres") => {
            let pool = PoolOptions::<sqlx::Postgres>::new()
                .max_connections(connections)
                .connect(url)
                .await?;
            run(pool, &args, &strategies, workload).await?
        }
        Some(url) if url.starts_with("mysql") || url.starts_with("mariadb") => {
            let pool = PoolOptions::<sqlx::MySql>::new()
                .max_connections(connections)
                .connect(url)
                .await?;
            run(pool, &args, &strategies, workload).await?
        }
        Some(url) => return Err(format!("unsupported database URL {url:?}").into()),
        None => {
            let path = std::env::temp_dir().join(format!("dblock-stock-{}.db", std::process::id()));
            let options = SqliteConnectOptions::new()
                .filename(&path)
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                // Every writer queues for SQLite's one write lock.
                .busy_timeout(Duration::from_secs(30));
            let pool = PoolOptions::<sqlx::Sqlite>::new()
                .max_connections(connections)
                .connect_with(options)
                .await?;
            println!("SQLite file {}", path.display());
            // The file is removed below, tables and all.
            let keep_all = Args { keep: true, ..args };
            let reports = run(pool.clone(), &keep_all, &strategies, workload).await;
            pool.close().await;
            remove_sqlite_files(&path);
            reports?
        }
    };
    let failed: Vec<&Report> = reports
        .iter()
        .filter(|r| r.strategy.is_protected() && !r.violations().is_empty())
        .collect();
    for report in &failed {
        eprintln!("{} broke the books:", report.strategy.name());
        for violation in report.violations() {
            eprintln!("  {violation}");
        }
    }
    Ok(if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

async fn run<DB: StockDb>(
    pool: sqlx::Pool<DB>,
    args: &Args,
    strategies: &[Strategy],
    workload: Workload,
) -> Result<Vec<Report>, dblock::Error>
where
    i64: dblock::SqlValue<DB>,
{
    let locker = Locker::builder(pool)
        .table(format!("{}_lock", args.table))
        .retry(stock::RETRY)
        .build()?;
    let shop = Shop::open(locker, &args.table)
        .await?
        .with_segments(args.segments);
    println!(
        "{}: {} workers, {} orders of {} unit(s), {} products x {} units \
         (segmented: {} segments a product)",
        <DB as sqlx::Database>::NAME,
        workload.workers,
        workload.orders,
        workload.quantity,
        workload.products,
        workload.stock,
        shop.segment_count()
    );
    let reports = place_orders(&shop, strategies, workload).await;
    if !args.keep {
        shop.remove().await?;
    }
    let reports = reports?;
    print_table(&reports);
    Ok(reports)
}

async fn place_orders<DB: StockDb>(
    shop: &Shop<DB>,
    strategies: &[Strategy],
    workload: Workload,
) -> Result<Vec<Report>, dblock::Error>
where
    i64: dblock::SqlValue<DB>,
{
    let mut reports = Vec::new();
    for &strategy in strategies {
        let bar = ProgressBar::new(workload.orders as u64).with_style(
            ProgressStyle::with_template("{prefix:>10} [{bar:40}] {pos}/{len} {per_sec}")
                .expect("a valid template")
                .progress_chars("=> "),
        );
        bar.set_prefix(strategy.name());
        let report = shop.run(strategy, workload, &|| bar.inc(1)).await?;
        bar.finish_and_clear();
        reports.push(report);
    }
    Ok(reports)
}

fn print_table(reports: &[Report]) {
    println!(
        "{:<11} {:>8} {:>8} {:>7} {:>11} {:>8} {:>6} {:>8} {:>9} {:>9}",
        "strategy",
        "accepted",
        "rejected",
        "gave up",
        "final stock",
        "oversold",
        "lost",
        "retries",
        "elapsed",
        "orders/s"
    );
    for r in reports {
        let retries = r.retries.map_or("-".to_owned(), |n| n.to_string());
        println!(
            "{:<11} {:>8} {:>8} {:>7} {:>11} {:>8} {:>6} {:>8} {:>8.2}s {:>9.0}",
            r.strategy.name(),
            r.accepted_orders(),
            r.rejected,
            r.gave_up,
            r.final_stock.iter().sum::<i64>(),
            r.oversold(),
            r.lost(),
            retries,
            r.elapsed.as_secs_f64(),
            r.rate()
        );
    }
    println!("\n{COLUMNS}");
    for r in reports.iter().filter(|r| r.failed_releases > 0) {
        println!(
            "{}: {} lease releases failed (database error) and were left to the guard's \
             background release",
            r.strategy.name(),
            r.failed_releases
        );
    }
}

fn pick(names: &[String]) -> Result<Vec<Strategy>, String> {
    if names.is_empty() {
        return Ok(Strategy::ALL.to_vec());
    }
    names
        .iter()
        .map(|name| {
            Strategy::ALL
                .into_iter()
                .find(|s| s.name() == name)
                .ok_or_else(|| format!("unknown strategy {name:?}"))
        })
        .collect()
}

fn remove_sqlite_files(path: &Path) {
    for suffix in ["", "-wal", "-shm"] {
        let mut file = path.as_os_str().to_owned();
        file.push(suffix);
        let _ = std::fs::remove_file(file);
    }
}
