//! An idempotent request handler (幂等): "charge order 42 once", however often the client
//! retries, also when an attempt lost its lock half-way.
//!
//! ```text
//! cargo run --example idempotent_handler                      # embedded SQLite, temp file
//! cargo run --example idempotent_handler -- --database-url postgres://postgres@127.0.0.1/test
//! cargo run --example idempotent_handler -- --database-url mysql://root@127.0.0.1/test
//! ```
//!
//! The handler takes a dblock lease on the request key (`payment:<request id>`), then in
//! ONE transaction: `guard.assert_held(&mut tx)`, a look for the request's payment row,
//! the payment row (`request_id` is UNIQUE) and the business write (the order's `paid`
//! and `charges`), commit. The lease keeps concurrent retries from both paying; the
//! fence makes an attempt that lost its lease write nothing; the unique row makes a
//! retry after success answer "already done". (The UNIQUE constraint alone would also
//! stop a second payment row, but as a failed INSERT that every caller must tell from
//! other errors; the lease turns the race into a wait and a clean answer.)
//!
//! Four scenarios: sequential retries; rounds of concurrent retries; an attempt whose
//! lease runs out before it writes (no renewal, 1 s lease); an attempt whose lease an
//! operator force-releases while a retry takes over. The example then counts payment
//! rows and charges in the database, prints a summary, and exits 1 if any request
//! changed the database other than exactly once. On a server it creates the tables
//! `idempotent_order`, `idempotent_payment` and `idempotent_lock` (with the lock table's
//! companions) and drops them at the end unless `--keep` is given; `--table` picks
//! another prefix. The SQLite file is removed at the end.

mod idempotent;

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use dblock::{Error, Locker, SqlValue};
use sqlx::Pool;
use sqlx::pool::PoolOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode};
use tokio::sync::oneshot;

use idempotent::{Bind, PaymentDb};

/// Retries of one request, run against one database.
#[derive(Parser, Debug)]
struct Args {
    /// postgres://.. or mysql://..; default: an SQLite file in the temp directory.
    #[arg(long)]
    database_url: Option<String>,
    /// Retries of one request sent at once, in each concurrent round.
    #[arg(long, default_value_t = 5)]
    retries: usize,
    /// Concurrent rounds, each a request of its own.
    #[arg(long, default_value_t = 4)]
    rounds: usize,
    /// Prefix of the tables: `<table>_order`, `<table>_payment`, `<table>_lock`.
    #[arg(long, default_value = "idempotent")]
    table: String,
    /// Keep the tables on a server database after the run.
    #[arg(long)]
    keep: bool,
}

/// Far longer than one charge takes; renewed in the background while held.
const LEASE: Duration = Duration::from_secs(10);
/// How long a retry waits for the attempt that holds its request.
const WAIT: Duration = Duration::from_secs(30);
/// Cents charged for every request.
const AMOUNT: i64 = 4200;

#[tokio::main]
async fn main() -> Result<ExitCode, Box<dyn std::error::Error>> {
    let args = Args::parse();
    // Each retry may hold two connections at once (a lease attempt and its transaction).
    let connections = u32::try_from(2 * args.retries + 2)?;
    let summary = match args.database_url.as_deref() {
        Some(url) if url.starts_with("postgres") => {
            let pool = PoolOptions::<sqlx::Postgres>::new()
                .max_connections(connections)
                .connect(url)
                .await?;
            run(pool, &args, args.keep).await?
        }
        Some(url) if url.starts_with("mysql") || url.starts_with("mariadb") => {
            let pool = PoolOptions::<sqlx::MySql>::new()
                .max_connections(connections)
                .connect(url)
                .await?;
            run(pool, &args, args.keep).await?
        }
        Some(url) => return Err(format!("unsupported database URL {url:?}").into()),
        None => {
            let path = std::env::temp_dir().join(format!("dblock-idem-{}.db", std::process::id()));
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
            let summary = run(pool.clone(), &args, true).await;
            pool.close().await;
            remove_sqlite_files(&path);
            summary?
        }
    };
    let failures = summary.print();
    Ok(if failures == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

type BoxError = Box<dyn std::error::Error>;

async fn run<DB: PaymentDb>(pool: Pool<DB>, args: &Args, keep: bool) -> Result<Summary, BoxError>
where
    i64: SqlValue<DB>,
{
    let locker = Locker::builder(pool)
        .table(format!("{}_lock", args.table))
        .build()?;
    let payments = Payments::open(locker, &args.table).await?;
    println!(
        "{}: {} concurrent retries x {} rounds, {AMOUNT} cents a request",
        <DB as sqlx::Database>::NAME,
        args.retries,
        args.rounds
    );
    let summary = scenarios(&payments, args).await;
    if !keep {
        payments.remove().await?;
    }
    summary
}

// ---- the handler ---------------------------------------------------------------------

/// What a request got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// This attempt charged the order.
    Charged,
    /// An earlier attempt had: nothing was written.
    AlreadyDone,
}

/// The handler's tables and statements.
struct Payments<DB: PaymentDb> {
    locker: Locker<DB>,
    lease: Duration,
    orders: String,
    payments: String,
    find: String,
    pay: String,
    charge: String,
}

impl<DB: PaymentDb> Payments<DB>
where
    i64: SqlValue<DB>,
{
    /// Migrates the lock table and creates the order and payment tables, empty.
    async fn open(locker: Locker<DB>, prefix: &str) -> Result<Self, Error> {
        locker.migrate().await?;
        let (orders, payments) = (format!("{prefix}_order"), format!("{prefix}_payment"));
        let mut conn = locker.pool().acquire().await?;
        for statement in [
            format!(
                "CREATE TABLE IF NOT EXISTS {orders} \
                 (id BIGINT PRIMARY KEY, paid BIGINT NOT NULL, charges BIGINT NOT NULL)"
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {payments} (request_id VARCHAR(64) NOT NULL UNIQUE, \
                 order_id BIGINT NOT NULL, amount BIGINT NOT NULL)"
            ),
            // A fresh start if --keep left rows behind.
            format!("DELETE FROM {orders}"),
            format!("DELETE FROM {payments}"),
        ] {
            DB::execute(&mut conn, &statement, &[]).await?;
        }
        Ok(Payments {
            find: DB::sql(&format!(
                "SELECT order_id FROM {payments} WHERE request_id = ?"
            )),
            pay: DB::sql(&format!(
                "INSERT INTO {payments} (request_id, order_id, amount) VALUES (?, ?, ?)"
            )),
            charge: DB::sql(&format!(
                "UPDATE {orders} SET paid = paid + ?, charges = charges + 1 WHERE id = ?"
            )),
            lease: LEASE,
            locker,
            orders,
            payments,
        })
    }

    /// The same handler on a lease of `lease` that is not renewed: it runs out while the
    /// attempt is slow.
    fn without_renewal(&self, lease: Duration) -> Self {
        Payments {
            locker: self.locker.auto_renew(false),
            lease,
            orders: self.orders.clone(),
            payments: self.payments.clone(),
            find: self.find.clone(),
            pay: self.pay.clone(),
            charge: self.charge.clone(),
        }
    }

    /// Charges `AMOUNT` to `order` for `request`, once however often it is called.
    /// `slow_step` runs between taking the lease and writing, where a real handler would
    /// call the payment provider: the scenarios lose the lease there.
    async fn charge(
        &self,
        request: &str,
        order: i64,
        slow_step: impl AsyncFnOnce(),
    ) -> Result<Answer, Error> {
        let guard = self
            .locker
            .acquire(&lock_key(request), self.lease, WAIT)
            .await?;
        slow_step().await;
        let answer = async {
            let mut tx = self.locker.pool().begin().await?;
            // Fenced: everything below commits only if the lease is still ours. A lost
            // lease is Error::NotHeld, and dropping `tx` writes nothing.
            guard.assert_held(&mut tx).await?;
            if DB::fetch_i64(&mut tx, &self.find, &[Bind::Text(request)])
                .await?
                .is_some()
            {
                return Ok(Answer::AlreadyDone);
            }
            let payment = [Bind::Text(request), Bind::Int(order), Bind::Int(AMOUNT)];
            match DB::execute(&mut tx, &self.pay, &payment).await {
                // Only a writer that skips the lease gets here: the constraint still holds.
                Err(sqlx::Error::Database(err)) if err.is_unique_violation() => {
                    return Ok(Answer::AlreadyDone);
                }
                inserted => inserted?,
            };
            DB::execute(
                &mut tx,
                &self.charge,
                &[Bind::Int(AMOUNT), Bind::Int(order)],
            )
            .await?;
            tx.commit().await?;
            Ok::<_, Error>(Answer::Charged)
        }
        .await;
        // The answer was settled by the commit (or its absence): a failed release changes
        // nothing, and the lease ends anyway.
        let _ = guard.release().await;
        answer
    }

    async fn open_order(&self, order: i64) -> Result<(), Error> {
        let sql = DB::sql(&format!(
            "INSERT INTO {} (id, paid, charges) VALUES (?, 0, 0)",
            self.orders
        ));
        let mut conn = self.locker.pool().acquire().await?;
        DB::execute(&mut conn, &sql, &[Bind::Int(order)]).await?;
        Ok(())
    }

    /// What the database says happened to `order`: payment rows, charges, cents paid.
    async fn books(&self, order: i64) -> Result<Books, Error> {
        let mut conn = self.locker.pool().acquire().await?;
        let mut read = async |sql: String| {
            let value = DB::fetch_i64(&mut conn, &DB::sql(&sql), &[Bind::Int(order)]).await?;
            Ok::<_, Error>(value.ok_or(sqlx::Error::RowNotFound)?)
        };
        let (payments, orders) = (&self.payments, &self.orders);
        Ok(Books {
            payments: read(format!(
                "SELECT COUNT(*) FROM {payments} WHERE order_id = ?"
            ))
            .await?,
            charges: read(format!("SELECT charges FROM {orders} WHERE id = ?")).await?,
            paid: read(format!("SELECT paid FROM {orders} WHERE id = ?")).await?,
        })
    }

    async fn remove(&self) -> Result<(), Error> {
        self.locker.shutdown().await;
        let mut conn = self.locker.pool().acquire().await?;
        let tables = [self.orders.as_str(), self.payments.as_str()];
        for statement in DB::drop_statements(&tables, self.locker.table()) {
            DB::execute(&mut conn, &statement, &[]).await?;
        }
        Ok(())
    }
}

fn lock_key(request: &str) -> String {
    format!("payment:{request}")
}

// ---- the scenarios -------------------------------------------------------------------

/// One scenario's requests, the answers its attempts got, and what the database says.
struct Outcome {
    name: String,
    requests: i64,
    charged: usize,
    already_done: usize,
    not_held: usize,
    /// Attempts that lose their lease on purpose: each must be refused by its fence.
    stalled: usize,
    books: Books,
}

#[derive(Default)]
struct Books {
    payments: i64,
    charges: i64,
    paid: i64,
}

impl Outcome {
    /// Tallies `answers` (of which `stalled` lost their lease on purpose) and reads the
    /// books of `orders`, one request each.
    async fn new<DB: PaymentDb>(
        name: String,
        payments: &Payments<DB>,
        orders: &[i64],
        answers: &[Result<Answer, Error>],
        stalled: usize,
    ) -> Result<Self, BoxError>
    where
        i64: SqlValue<DB>,
    {
        let mut outcome = Outcome {
            name,
            requests: orders.len() as i64,
            charged: 0,
            already_done: 0,
            not_held: 0,
            stalled,
            books: Books::default(),
        };
        for answer in answers {
            match answer {
                Ok(Answer::Charged) => outcome.charged += 1,
                Ok(Answer::AlreadyDone) => outcome.already_done += 1,
                Err(Error::NotHeld { .. }) => outcome.not_held += 1,
                Err(err) => return Err(format!("{}: unexpected error: {err}", outcome.name).into()),
            }
        }
        for &order in orders {
            let books = payments.books(order).await?;
            outcome.books.payments += books.payments;
            outcome.books.charges += books.charges;
            outcome.books.paid += books.paid;
        }
        Ok(outcome)
    }

    /// What is wrong: each request must have changed the database exactly once.
    fn violations(&self) -> Vec<String> {
        let n = self.requests;
        let mut found = Vec::new();
        let mut expect = |what: &str, got: i64, want: i64| {
            if got != want {
                found.push(format!("{}: {what} {got}, expected {want}", self.name));
            }
        };
        expect("answers 'charged'", self.charged as i64, n);
        expect(
            "attempts refused by the fence",
            self.not_held as i64,
            self.stalled as i64,
        );
        expect("payment rows", self.books.payments, n);
        expect("order charges", self.books.charges, n);
        expect("cents paid", self.books.paid, n * AMOUNT);
        found
    }
}

async fn scenarios<DB: PaymentDb>(payments: &Payments<DB>, args: &Args) -> Result<Summary, BoxError>
where
    i64: SqlValue<DB>,
{
    let nothing = async || {};
    let mut outcomes = Vec::new();
    let mut violations = Vec::new();

    // 1. The client retries one after another (a timeout, a reload).
    let order = 42;
    payments.open_order(order).await?;
    let mut answers = Vec::new();
    for _ in 0..args.retries {
        answers.push(payments.charge("order-42-charge", order, nothing).await);
    }
    let name = format!("sequential retries (1 x {})", args.retries);
    outcomes.push(Outcome::new(name, payments, &[order], &answers, 0).await?);

    // 2. Retries of one request at once (a double click, a retrying proxy), per round.
    let orders: Vec<i64> = (0..args.rounds as i64).map(|round| 100 + round).collect();
    let mut answers = Vec::new();
    for &order in &orders {
        payments.open_order(order).await?;
        let request = format!("order-{order}-charge");
        let retries = (0..args.retries).map(|_| payments.charge(&request, order, nothing));
        answers.extend(futures::future::join_all(retries).await);
    }
    let name = format!("concurrent retries ({} x {})", args.rounds, args.retries);
    outcomes.push(Outcome::new(name, payments, &orders, &answers, 0).await?);

    // 3. The first attempt stalls past its lease (not renewed, 1 s) before it writes.
    let (order, request) = (7, "order-7-charge");
    payments.open_order(order).await?;
    let stalls = payments.without_renewal(Duration::from_secs(1));
    let locker = &payments.locker;
    let mut answers = vec![
        stalls
            .charge(request, order, async || {
                lease_runs_out(locker, request).await
            })
            .await,
    ];
    let books = payments.books(order).await?;
    if (books.payments, books.charges) != (0, 0) {
        violations.push(format!(
            "the attempt whose lease ran out wrote: {} payment row(s), {} charge(s)",
            books.payments, books.charges
        ));
    }
    for _ in 0..2 {
        answers.push(payments.charge(request, order, nothing).await);
    }
    let name = "lease ran out mid-way, 2 retries".to_owned();
    outcomes.push(Outcome::new(name, payments, &[order], &answers, 1).await?);

    // 4. An operator force-releases the first attempt's key while it stalls; a retry
    // takes the key and charges; then the first attempt goes on.
    let (order, request) = (8, "order-8-charge");
    payments.open_order(order).await?;
    let (stalled_tx, stalled_rx) = oneshot::channel();
    let (resume_tx, resume_rx) = oneshot::channel::<()>();
    let first = payments.charge(request, order, async move || {
        stalled_tx.send(()).expect("the operator waits");
        resume_rx.await.expect("the operator lets it go on");
    });
    let operator = async {
        stalled_rx.await.expect("the first attempt stalls");
        let released = locker.force_release(&lock_key(request)).await?;
        assert!(released, "the first attempt's row was there to delete");
        let retry = payments.charge(request, order, nothing).await;
        resume_tx.send(()).expect("the first attempt waits");
        Ok::<_, Error>(retry)
    };
    let (first, retry) = tokio::join!(first, operator);
    let last = payments.charge(request, order, nothing).await;
    let answers = [first, retry?, last];
    let name = "force-released mid-way, 2 retries".to_owned();
    outcomes.push(Outcome::new(name, payments, &[order], &answers, 1).await?);

    violations.extend(outcomes.iter().flat_map(Outcome::violations));
    Ok(Summary {
        outcomes,
        violations,
    })
}

/// Waits until the database says the lease of `request` ran out: the row is still there,
/// expired by the database clock (polled; nothing is concluded from the time waited).
async fn lease_runs_out<DB: PaymentDb>(locker: &Locker<DB>, request: &str) {
    loop {
        let holder = locker.holder(&lock_key(request)).await;
        match holder.expect("the lock table answers") {
            Some(holder) if holder.expired => return,
            Some(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            None => panic!("the stalled attempt's row vanished"),
        }
    }
}

struct Summary {
    outcomes: Vec<Outcome>,
    violations: Vec<String>,
}

impl Summary {
    /// Prints the table and any violation; returns how many there were.
    fn print(&self) -> usize {
        println!(
            "{:<36} {:>8} {:>8} {:>12} {:>8} {:>8} {:>7}",
            "scenario", "requests", "charged", "already done", "not held", "payments", "charges"
        );
        for o in &self.outcomes {
            println!(
                "{:<36} {:>8} {:>8} {:>12} {:>8} {:>8} {:>7}",
                o.name,
                o.requests,
                o.charged,
                o.already_done,
                o.not_held,
                o.books.payments,
                o.books.charges
            );
        }
        println!(
            "\nEach request must change the database exactly once: one payment row and one \
             charge per request,\nhowever many attempts; 'not held' attempts lost their lease \
             before writing and wrote nothing."
        );
        for violation in &self.violations {
            eprintln!("VIOLATION {violation}");
        }
        self.violations.len()
    }
}

fn remove_sqlite_files(path: &Path) {
    for suffix in ["", "-wal", "-shm"] {
        let mut file = path.as_os_str().to_owned();
        file.push(suffix);
        let _ = std::fs::remove_file(file);
    }
}
