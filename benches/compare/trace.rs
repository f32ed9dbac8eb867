//! A minimal `tracing` subscriber that keeps the first few of dblock's "renewal failed"
//! events (the engine logs each failed batch at debug level, with its error), so the
//! renewal section can say why a batch failed instead of only counting failures.

use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// How many failure messages are kept.
const KEEP: usize = 3;

static FAILURES: Mutex<Vec<String>> = Mutex::new(Vec::new());
static NEXT_SPAN: AtomicU64 = AtomicU64::new(1);

/// Installs the subscriber for the whole process (once, at start-up).
pub fn install() {
    let _ = tracing::subscriber::set_global_default(RenewalFailures);
}

/// Takes the failure messages kept so far.
pub fn take_failures() -> Vec<String> {
    std::mem::take(&mut *FAILURES.lock().unwrap_or_else(|e| e.into_inner()))
}

struct RenewalFailures;

struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, "{}={value:?} ", field.name());
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        let _ = write!(self.0, "{}={value} ", field.name());
    }
}

impl Subscriber for RenewalFailures {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        // Only the failed-batch event (it alone has both fields), decided once per
        // callsite, so every other event of dblock's costs nothing while measuring.
        let fields = metadata.fields();
        metadata.target().starts_with("dblock::engine")
            && fields.field("leases").is_some()
            && fields.field("error").is_some()
    }

    fn new_span(&self, _span: &Attributes<'_>) -> Id {
        Id::from_u64(NEXT_SPAN.fetch_add(1, Ordering::Relaxed))
    }

    fn record(&self, _span: &Id, _values: &Record<'_>) {}

    fn record_follows_from(&self, _span: &Id, _follows: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        if !fields.0.contains("renewal failed") {
            return;
        }
        let mut kept = FAILURES.lock().unwrap_or_else(|e| e.into_inner());
        if kept.len() < KEEP {
            kept.push(fields.0.trim().to_owned());
        }
    }

    fn enter(&self, _span: &Id) {}

    fn exit(&self, _span: &Id) {}
}
