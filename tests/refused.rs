//! A server that refuses connections: the pool timeout says what is likely wrong (sqlx
//! retries refused connections silently until its acquire timeout and keeps the cause).
//! Needs no server: it dials a loopback port nobody listens on.

use std::time::Duration;

use dblock::{Error, Locker};

/// A loopback port that refuses connections: bound, then closed again.
fn refusing_port() -> u16 {
    let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    socket.local_addr().unwrap().port()
}

fn assert_says_refused<T: std::fmt::Debug>(outcome: dblock::Result<T>) {
    match outcome {
        Err(
            err @ Error::PoolTimeout {
                open_connections: 0,
                ..
            },
        ) => {
            let text = err.to_string();
            assert!(text.contains("host") && text.contains("port"), "{text}");
            assert!(err.is_retryable());
        }
        other => panic!("expected PoolTimeout with no connection open, got {other:?}"),
    }
}

/// A locker on `scheme://user@127.0.0.1:<refusing port>/test`, giving up after 300 ms.
fn refused_locker<DB: dblock::Backend>(scheme_and_user: &str) -> Locker<DB> {
    let url = format!("{scheme_and_user}@127.0.0.1:{}/test", refusing_port());
    let pool = sqlx::pool::PoolOptions::<DB>::new()
        .acquire_timeout(Duration::from_millis(300))
        .connect_lazy(&url)
        .unwrap();
    Locker::new(pool)
}

#[tokio::test]
async fn postgres_refused() {
    let locker = refused_locker::<sqlx::Postgres>("postgres://postgres");
    assert_says_refused(locker.try_acquire("k", Duration::from_secs(5)).await);
}

#[tokio::test]
async fn mysql_refused() {
    let locker = refused_locker::<sqlx::MySql>("mysql://root");
    assert_says_refused(locker.try_acquire("k", Duration::from_secs(5)).await);
}
