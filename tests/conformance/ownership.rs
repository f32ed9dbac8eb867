//! Who may change a row: only its owner, and only while the lease lives.

use dblock::{Error, Holder, LockGuard};

use super::{LONG, PATIENCE, SHORT};
use crate::common::{TestBackend, TestDb, wait_until};

/// Who holds a row: owner, token and whether it expired (the times are checked in
/// `admin.rs`).
type Who = Option<(String, i64, bool)>;

fn held_by<DB: TestBackend>(guard: &LockGuard<DB>) -> Who {
    Some((guard.owner().to_owned(), guard.fencing_token(), false))
}

fn who(holder: Option<Holder>) -> Who {
    holder.map(|h| (h.owner, h.fencing_token, h.expired))
}

async fn wait_expired<DB: TestBackend>(db: &TestDb<DB>, key: &str) {
    wait_until("the lease expired", PATIENCE, async || {
        let holder = db.locker.holder(key).await.unwrap();
        holder.expect("the row is still there").expired
    })
    .await;
}

/// Strangers delete nothing; a guard whose row was taken over can neither extend nor
/// release it.
pub async fn owner_checked_release_and_extend<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let key = "owned";
    let guard = db.locker.try_acquire(key, LONG).await.unwrap().unwrap();
    // Wrong values, including near misses that a padding or case-folding comparison
    // would accept.
    let owner = guard.owner().to_owned();
    for stranger in [
        "stranger".to_owned(),
        owner.to_uppercase(),
        owner[..owner.len() - 1].to_owned(),
        format!("{owner}x"),
    ] {
        assert_eq!(db.plain.delete_owned(key, &stranger).await, 0, "{stranger}");
    }
    assert_eq!(who(db.locker.holder(key).await.unwrap()), held_by(&guard));
    let before = guard.expires_at();
    let extended = guard.extend(LONG * 2).await.expect("the owner extends");
    assert!(extended > before, "{extended} > {before}");
    assert_eq!(guard.expires_at(), extended);
    guard.release().await.expect("the owner releases");
    assert_eq!(db.locker.holder(key).await.unwrap(), None);

    // An expired lease cannot be extended, even before anyone took it over.
    let old = db.locker.try_acquire(key, SHORT).await.unwrap().unwrap();
    wait_expired(&db, key).await;
    assert!(matches!(
        old.extend(LONG).await,
        Err(Error::NotHeld { ref key, ref owner }) if key == "owned" && owner == old.owner()
    ));
    assert!(db.locker.holder(key).await.unwrap().unwrap().expired);

    // Taken over: the old guard gets NotHeld and the new owner's row is untouched.
    let new = db.locker.try_acquire(key, LONG).await.unwrap().unwrap();
    let new_expiry = new.expires_at();
    assert!(matches!(old.extend(LONG).await, Err(Error::NotHeld { .. })));
    assert_eq!(who(db.locker.holder(key).await.unwrap()), held_by(&new));
    assert!(matches!(old.release().await, Err(Error::NotHeld { .. })));
    assert_eq!(who(db.locker.holder(key).await.unwrap()), held_by(&new));
    assert_eq!(new.expires_at(), new_expiry);

    // A row deleted behind the guard's back: NotHeld, and nothing reappears.
    assert_eq!(db.plain.delete(key).await, 1);
    assert!(matches!(new.extend(LONG).await, Err(Error::NotHeld { .. })));
    assert!(matches!(new.release().await, Err(Error::NotHeld { .. })));
    assert_eq!(db.locker.holder(key).await.unwrap(), None);
    assert_eq!(db.plain.row_count().await, 0);
}

/// A live lease is never taken over; an expired one is, by exactly the next taker.
pub async fn expired_rows_are_taken_over_live_ones_never<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let live = db.locker.try_acquire("live", LONG).await.unwrap().unwrap();
    for _ in 0..10 {
        assert!(db.locker.try_acquire("live", LONG).await.unwrap().is_none());
    }
    assert_eq!(who(db.locker.holder("live").await.unwrap()), held_by(&live));

    let old = db
        .locker
        .try_acquire("short", SHORT)
        .await
        .unwrap()
        .unwrap();
    wait_expired(&db, "short").await;
    let taker = db
        .locker
        .try_acquire("short", LONG)
        .await
        .unwrap()
        .expect("an expired lease is taken over");
    assert_ne!(taker.owner(), old.owner());
    assert_eq!(
        who(db.locker.holder("short").await.unwrap()),
        held_by(&taker)
    );
    // The new lease is live again.
    assert!(
        db.locker
            .try_acquire("short", LONG)
            .await
            .unwrap()
            .is_none()
    );

    // The live lease was untouched all along.
    assert_eq!(who(db.locker.holder("live").await.unwrap()), held_by(&live));
    live.release().await.unwrap();
    taker.release().await.unwrap();
    assert!(matches!(old.release().await, Err(Error::NotHeld { .. })));
    assert_eq!(db.plain.row_count().await, 0);
}

/// Each new holder of a key gets a larger token: after a release, after a takeover of an
/// expired row, and after the row was deleted with plain SQL.
pub async fn fencing_tokens_strictly_increase<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let key = "fenced";
    let mut tokens = Vec::new();
    let mut record = async |guard: &LockGuard<DB>| {
        tokens.push(guard.fencing_token());
        assert_eq!(who(db.locker.holder(key).await.unwrap()), held_by(guard));
    };

    let first = db.locker.try_acquire(key, LONG).await.unwrap().unwrap();
    record(&first).await;
    first.release().await.unwrap();

    // Other keys in between must not disturb this key's order.
    let other = db.locker.try_acquire("other", LONG).await.unwrap().unwrap();

    let expiring = db.locker.try_acquire(key, SHORT).await.unwrap().unwrap();
    record(&expiring).await;
    wait_expired(&db, key).await;

    let taker = db.locker.try_acquire(key, LONG).await.unwrap().unwrap();
    record(&taker).await;
    assert_eq!(db.plain.delete(key).await, 1);

    let after_delete = db
        .locker
        .acquire(key, LONG, PATIENCE)
        .await
        .expect("the key is free after the delete");
    record(&after_delete).await;
    after_delete.release().await.unwrap();
    other.release().await.unwrap();

    let again = db.locker.try_acquire(key, LONG).await.unwrap().unwrap();
    record(&again).await;
    again.release().await.unwrap();

    assert!(
        tokens.windows(2).all(|pair| pair[0] < pair[1]),
        "tokens must strictly increase: {tokens:?}"
    );
    assert!(matches!(
        expiring.release().await,
        Err(Error::NotHeld { .. })
    ));
    assert!(matches!(taker.release().await, Err(Error::NotHeld { .. })));
}

/// A Locker's default owner values say where the holder runs (`<host>:<pid>:`) before
/// their random part; `owner_prefix("")` leaves the random part alone.
pub async fn default_owners_name_host_and_process<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let guard = db.locker.try_acquire("who", LONG).await.unwrap().unwrap();
    let parts: Vec<&str> = guard.owner().split(':').collect();
    assert_eq!(parts.len(), 3, "{:?}", guard.owner());
    assert!(!parts[0].is_empty(), "{:?}", guard.owner());
    assert_eq!(parts[1], std::process::id().to_string());
    assert!(parts[2].len() == 32 && parts[2].chars().all(|c| c.is_ascii_hexdigit()));
    let holder = db.locker.holder("who").await.unwrap().unwrap();
    assert_eq!(holder.owner, guard.owner(), "the row says the same");
    guard.release().await.unwrap();

    let bare = dblock::Locker::builder(db.pool.clone())
        .table(&db.table)
        .owner_prefix("")
        .build()
        .unwrap();
    let guard = bare.try_acquire("who", LONG).await.unwrap().unwrap();
    assert!(guard.owner().len() == 32 && guard.owner().chars().all(|c| c.is_ascii_hexdigit()));
    guard.release().await.unwrap();
}
