//! What the metrics cases read: one global recording recorder and one global span log,
//! installed once for the whole binary. Global, not thread-local: the lease engine records
//! from its own tasks, on other threads. Tests run in parallel, each in a lock table of its
//! own, and read only what carries their table (the `table` label, or span field).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

use metrics::Unit;
use metrics_util::MetricKind;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tracing::Subscriber;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// Installs the recorder and the span log, once; every case calls it before it records
/// anything (dblock describes its metrics to the recorder at its first one).
pub fn install() {
    snapshotter();
    static SPANS_ON: OnceLock<()> = OnceLock::new();
    SPANS_ON.get_or_init(|| {
        let subscriber = tracing_subscriber::registry().with(SpanLog);
        tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
    });
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

// --- Metrics ---------------------------------------------------------------------------

fn snapshotter() -> &'static Snapshotter {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this binary");
        snapshotter
    })
}

/// A metric's labels, by name.
type Labels = BTreeMap<String, String>;

/// Everything recorded so far. The debugging recorder's snapshots consume what they read
/// (counters and gauges go back to 0, histograms are emptied), so every read goes through
/// [`of_table`], which adds each snapshot to this store: counters and gauges as deltas
/// (right for gauges moved by increment / decrement; a gauge that is `set` would need its
/// own handling), histogram values appended.
#[derive(Default)]
struct Store {
    counters: HashMap<(String, Labels), u64>,
    gauges: HashMap<(String, Labels), f64>,
    histograms: HashMap<(String, Labels), Vec<f64>>,
    units: HashMap<String, Unit>,
}

static STORE: Mutex<Option<Store>> = Mutex::new(None);

/// The metrics recorded so far for lock table `table`.
pub fn of_table(table: &str) -> Metrics {
    let mut store = lock(&STORE);
    let store = store.get_or_insert_with(Store::default);
    for (key, unit, _, value) in snapshotter().snapshot().into_vec() {
        let (kind, key) = key.into_parts();
        let name = key.name().to_owned();
        if let Some(unit) = unit {
            store.units.insert(name.clone(), unit);
        }
        let labels: Labels = key
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        let id = (name, labels);
        match (kind, value) {
            (MetricKind::Counter, DebugValue::Counter(n)) => {
                *store.counters.entry(id).or_default() += n;
            }
            (MetricKind::Gauge, DebugValue::Gauge(v)) => {
                *store.gauges.entry(id).or_default() += v.into_inner();
            }
            (MetricKind::Histogram, DebugValue::Histogram(values)) => {
                let all = store.histograms.entry(id).or_default();
                all.extend(values.into_iter().map(|v| v.into_inner()));
            }
            (kind, value) => panic!("a {kind:?} with a value {value:?}"),
        }
    }
    let ours = |labels: &Labels| labels.get("table").map(String::as_str) == Some(table);
    let pick = |(name, labels): &(String, Labels)| {
        let mut labels = labels.clone();
        labels.remove("table");
        (name.clone(), labels)
    };
    Metrics {
        counters: (store.counters.iter())
            .filter(|(id, _)| ours(&id.1))
            .map(|(id, v)| (pick(id), *v))
            .collect(),
        gauges: (store.gauges.iter())
            .filter(|(id, _)| ours(&id.1))
            .map(|(id, v)| (pick(id), *v))
            .collect(),
        histograms: (store.histograms.iter())
            .filter(|(id, _)| ours(&id.1))
            .map(|(id, v)| (pick(id), v.clone()))
            .collect(),
        units: store.units.clone(),
        every: (store.counters.keys())
            .chain(store.gauges.keys())
            .chain(store.histograms.keys())
            .filter(|id| ours(&id.1))
            .map(|(name, labels)| (name.clone(), labels.keys().cloned().collect()))
            .collect(),
    }
}

/// One table's metrics; labels are given without `table`, and must match exactly.
#[derive(Debug)]
pub struct Metrics {
    counters: HashMap<(String, Labels), u64>,
    gauges: HashMap<(String, Labels), f64>,
    histograms: HashMap<(String, Labels), Vec<f64>>,
    units: HashMap<String, Unit>,
    /// Every metric of the table: its name and the names of all its labels.
    every: Vec<(String, Vec<String>)>,
}

fn id(name: &str, labels: &[(&str, &str)]) -> (String, Labels) {
    let labels = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    (name.to_owned(), labels)
}

impl Metrics {
    /// A counter's value; 0 when it was never recorded.
    pub fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.counters.get(&id(name, labels)).copied().unwrap_or(0)
    }

    /// A gauge's value; 0 when it was never recorded.
    pub fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.gauges.get(&id(name, labels)).copied().unwrap_or(0.0)
    }

    /// A histogram's values, in the order recorded; empty when it was never recorded.
    pub fn histogram(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        self.histograms
            .get(&id(name, labels))
            .cloned()
            .unwrap_or_default()
    }

    /// The `(label, value)` pairs a counter was recorded with (besides `table`), each with
    /// its value.
    pub fn counters_named(&self, name: &str) -> BTreeMap<Labels, u64> {
        (self.counters.iter())
            .filter(|((n, _), _)| n == name)
            .map(|((_, labels), v)| (labels.clone(), *v))
            .collect()
    }

    /// How many values a histogram got, by its labels (besides `table`).
    pub fn histogram_counts(&self, name: &str) -> BTreeMap<Labels, usize> {
        (self.histograms.iter())
            .filter(|((n, _), _)| n == name)
            .map(|((_, labels), v)| (labels.clone(), v.len()))
            .collect()
    }

    /// The unit the crate described a metric with.
    pub fn unit(&self, name: &str) -> Option<Unit> {
        self.units.get(name).copied()
    }

    /// Every metric recorded for the table, with the names of its labels (`table`
    /// included), sorted.
    pub fn label_names(&self) -> Vec<(String, Vec<String>)> {
        let mut every = self.every.clone();
        every.sort();
        every.dedup();
        every
    }
}

/// Labels for [`Metrics::counters_named`] and [`Metrics::histogram_counts`] comparisons.
pub fn labels(pairs: &[(&str, &str)]) -> Labels {
    id("", pairs).1
}

// --- Spans -----------------------------------------------------------------------------

/// A span as the log saw it.
#[derive(Debug, Clone)]
pub struct SpanRecord {
    pub name: &'static str,
    pub fields: BTreeMap<String, String>,
    /// Its parent's index in the log.
    pub parent: Option<usize>,
}

static SPANS: Mutex<Vec<SpanRecord>> = Mutex::new(Vec::new());

/// Every span recorded so far, by index (parents point into it).
pub fn spans() -> Vec<SpanRecord> {
    lock(&SPANS).clone()
}

/// A span's place in [`SPANS`], kept in the span's extensions.
struct Index(usize);

/// Records every span: name, fields (also those recorded later) and parent.
struct SpanLog;

impl<S> Layer<S> for SpanLog
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let span = ctx.span(id).expect("a new span is registered");
        let parent = span
            .parent()
            .and_then(|parent| parent.extensions().get::<Index>().map(|i| i.0));
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        let mut spans = lock(&SPANS);
        spans.push(SpanRecord {
            name: attrs.metadata().name(),
            fields: fields.0,
            parent,
        });
        span.extensions_mut().insert(Index(spans.len() - 1));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let span = ctx.span(id).expect("a recorded span is registered");
        let Some(index) = span.extensions().get::<Index>().map(|i| i.0) else {
            return;
        };
        let mut fields = Fields::default();
        values.record(&mut fields);
        lock(&SPANS)[index].fields.extend(fields.0);
    }
}

#[derive(Default)]
struct Fields(BTreeMap<String, String>);

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}
