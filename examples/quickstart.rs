//! A first look at dblock on embedded SQLite: no server needed.
//!
//! `cargo run --example quickstart`

use std::time::Duration;

use dblock::Locker;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A lock table in a fresh SQLite file; with PostgreSQL or MySQL, pass their pool instead.
    let path = std::env::temp_dir().join(format!("dblock-quickstart-{}.db", std::process::id()));
    let options = SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true);
    let pool = SqlitePoolOptions::new().connect_with(options).await?;
    let locker = Locker::new(pool);
    let applied = locker.migrate().await?;
    println!("migrated {} (applied {applied} migration)", path.display());

    let lease = Duration::from_secs(30);
    let guard = locker
        .try_acquire("report:2026-11", lease)
        .await?
        .expect("nobody else holds this key");
    println!(
        "acquired {:?} as owner {} with fencing token {}, lease ends {} (database clock)",
        guard.key(),
        guard.owner(),
        guard.fencing_token(),
        guard.expires_at()
    );

    let rival = locker.try_acquire("report:2026-11", lease).await?;
    println!(
        "a rival's try_acquire while it is held: {}",
        if rival.is_some() {
            "GOT IT (bug!)"
        } else {
            "refused"
        }
    );
    assert!(rival.is_none());

    guard.release().await?;
    println!("released");

    // with_lock: acquire (waiting up to a second), run, release.
    let token = locker
        .with_lock(
            "report:2026-11",
            lease,
            Duration::from_secs(1),
            async |guard| Ok::<_, dblock::Error>(guard.fencing_token()),
        )
        .await?;
    println!(
        "with_lock ran under fencing token {token} (greater than the first: tokens never go backwards)"
    );

    std::fs::remove_file(&path).ok();
    Ok(())
}
