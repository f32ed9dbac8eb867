//! `dblock history`: the lock history's events (`<table>_events`), newest first, as an
//! aligned table or one JSON object per line. Times are the database clock's.

use dblock::{Backend, EventKind, HistoryFilter, LockEvent, Locker};

use crate::args::HistoryArgs;
use crate::commands::Output;
use crate::failure::Failure;
use crate::render::{aligned, printable, rfc3339};

/// What `dblock release --force` records as the operator without `--operator`:
/// `cli:<user>` (`$USER`, else `$USERNAME`, else `unknown`).
pub(crate) fn default_operator() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("USERNAME"))
        .unwrap_or_else(|_| "unknown".to_owned());
    format!("cli:{user}")
}

/// The filter `args` ask for: `KEY` exactly, or `PREFIX*` (a trailing `*`) as a prefix.
pub(crate) fn filter(args: &HistoryArgs) -> HistoryFilter {
    let mut filter = HistoryFilter::new().limit(args.limit);
    match args.key.as_deref().map(|key| (key, key.strip_suffix('*'))) {
        Some((_, Some(prefix))) => filter = filter.prefix(prefix),
        Some((key, None)) => filter = filter.key(key),
        None => {}
    }
    if let Some(since) = args.since {
        filter = filter.within(since);
    }
    if !args.kind.is_empty() {
        filter = filter.kinds(args.kind.iter().copied());
    }
    if let Some(owner) = &args.owner {
        filter = filter.owner(owner);
    }
    filter
}

pub(crate) async fn history<DB: Backend>(
    locker: &Locker<DB>,
    args: &HistoryArgs,
) -> Result<Output, Failure> {
    let events = locker.history(&filter(args)).await?;
    let stdout = if args.json {
        events.iter().map(|event| json(event) + "\n").collect()
    } else {
        table(&events)
    };
    Ok(Output { stdout, note: None })
}

/// The header and one line per event.
pub(crate) fn table(events: &[LockEvent]) -> String {
    const HEADER: [&str; 6] = ["AT", "KIND", "KEY", "OWNER", "TOKEN", "DETAIL"];
    let cells: Vec<[String; 6]> = events
        .iter()
        .map(|event| {
            [
                rfc3339(event.at),
                event.kind.as_str().to_owned(),
                printable(&event.key).into_owned(),
                printable(&event.owner).into_owned(),
                event
                    .fencing_token
                    .map(|t| t.to_string())
                    .unwrap_or_default(),
                printable(event.detail.as_deref().unwrap_or_default()).into_owned(),
            ]
        })
        .collect();
    aligned(HEADER, &cells, 4)
}

/// One event as one JSON object on one line.
pub(crate) fn json(event: &LockEvent) -> String {
    serde_json::json!({
        "id": event.id,
        "at": rfc3339(event.at),
        "kind": event.kind.as_str(),
        "key": event.key,
        "row_kind": event.row_kind(),
        "owner": event.owner,
        "fencing_token": event.fencing_token,
        "detail": event.detail,
    })
    .to_string()
}

/// A `--kind` value: one of [`EventKind::as_str`]'s names.
pub(crate) fn kind(text: &str) -> Result<EventKind, String> {
    text.parse().map_err(|err: dblock::Error| err.to_string())
}
