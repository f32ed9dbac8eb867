//! [`KeyLabel`]: whether, and how, the acquisition, hold and failure metrics name the key.

/// Whether the acquisition, hold and failure metrics carry a `key` label beside `table`
/// ([`LockerBuilder::metrics_key_label`](crate::LockerBuilder::metrics_key_label)), so
/// that an operator can see which locks are contended. Default: [`KeyLabel::Off`].
///
/// **Cardinality**: every distinct label value is one more time series in the recorder
/// (and in Prometheus) for as long as the process runs. [`KeyLabel::Prefix`] is bounded
/// by the kinds of keys an application uses (`invoice:42` and `invoice:43` are both
/// `invoice`); [`KeyLabel::Full`] grows with every key ever locked, so keep it for a
/// handful of fixed keys (a cron job's, a leader's), never for per-entity keys.
///
/// Off, metrics cost what they cost without this option: the keys of a table's metrics
/// are made once, when the Locker is built. On, each recorded acquisition, failure and
/// hold makes its metric key (an allocation) at the time.
///
/// ```
/// use dblock::KeyLabel;
///
/// assert_eq!(KeyLabel::default(), KeyLabel::Off);
/// assert_eq!(KeyLabel::Prefix.value("invoice:42"), Some("invoice"));
/// assert_eq!(KeyLabel::Prefix.value("nightly-report"), Some("nightly-report"));
/// assert_eq!(KeyLabel::Full.value("invoice:42"), Some("invoice:42"));
/// assert_eq!(KeyLabel::Off.value("invoice:42"), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum KeyLabel {
    /// No `key` label: only `table` (and each metric's own labels). The default.
    #[default]
    Off,
    /// The key up to its first `:` (`invoice:42` is `invoice`); a key without a `:` is
    /// its own prefix. The usual choice: keys named `<kind>:<id>` give one series per kind.
    Prefix,
    /// The whole key. Unbounded: see the cardinality warning above.
    Full,
}

impl KeyLabel {
    /// The `key` label's value for `key`, or `None` when there is no such label.
    pub fn value(self, key: &str) -> Option<&str> {
        match self {
            KeyLabel::Off => None,
            KeyLabel::Prefix => Some(key.split_once(':').map_or(key, |(prefix, _)| prefix)),
            KeyLabel::Full => Some(key),
        }
    }
}
