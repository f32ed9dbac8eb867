use dblock::*;
use std::time::Duration;
#[tokio::main]
async fn main() -> Result<()> {
    let pg = sqlx::PgPool::connect("postgres://postgres@127.0.0.1:5432/test").await?;
    run(Locker::builder(pg).table("smoke_lock").build()?).await?;
    let my = sqlx::MySqlPool::connect("mysql://root@127.0.0.1:3306/test").await?;
    run(Locker::builder(my).table("smoke_lock").build()?).await?;
    let opts = sqlx::sqlite::SqliteConnectOptions::new()
        .filename("/tmp/smoke.db")
        .create_if_missing(true);
    let lite = sqlx::SqlitePool::connect_with(opts).await?;
    run(Locker::builder(lite).table("smoke_lock").build()?).await?;
    Ok(())
}
async fn run<DB: Backend>(l: Locker<DB>) -> Result<()> {
    println!("migrate {:?}: {}", l, l.migrate().await?);
    println!("migrate again: {}", l.migrate().await?);
    let g = l
        .try_acquire("k1", Duration::from_secs(5))
        .await?
        .expect("first");
    println!("got {:?}", g);
    println!(
        "rival: {:?}",
        l.try_acquire("k1", Duration::from_secs(5)).await?.is_some()
    );
    let e = g.extend(Duration::from_secs(60)).await?;
    println!("extended to {e} ; now {}", chrono::Utc::now());
    println!("holder {:?}", l.holder("k1").await?);
    g.release().await?;
    let g2 = l
        .try_acquire("k1", Duration::from_millis(50))
        .await?
        .expect("after release");
    println!("token after release {}", g2.fencing_token());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let g3 = l
        .try_acquire("k1", Duration::from_secs(1))
        .await?
        .expect("takeover");
    println!("token after takeover {}", g3.fencing_token());
    println!("stale release: {:?}", g2.release().await);
    g3.release().await?;
    Ok(())
}
