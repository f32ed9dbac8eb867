//! Statements that must not be lost with their caller. A statement whose caller's future
//! is dropped while it is in flight may still commit (a row, a ticket): it is boxed with
//! copies of what it sends, kept in a slot until it answers, and handed to a background
//! job if the slot still holds it when its owner is dropped. That job lets it finish and
//! undoes what it committed.

use std::future::Future;
use std::pin::Pin;

/// A statement that may have to outlive its caller: boxed, owning what it sends.
pub(crate) type Statement<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The answer of the statement kept in `slot`, which is emptied only once it answered: a
/// drop of the caller's future before that finds the statement still there, to hand it
/// over. Called once.
pub(crate) async fn answer<T>(slot: &mut Option<Statement<T>>) -> T {
    let statement = slot
        .as_mut()
        .expect("a statement in flight is awaited once");
    let answer = statement.as_mut().await;
    *slot = None;
    answer
}
