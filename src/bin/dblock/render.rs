//! How rows are shown: the aligned table of `list`, the `field: value` lines of `show`,
//! and one JSON object per row. Pure functions over [`Row`]s (what a [`LockInfo`] says);
//! every relative time is measured from the row's `read_at` (the database clock), never
//! from this machine's clock.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use dblock::LockInfo;

/// `d` in its largest whole unit, rounded down: "850 ms", "12 s", "4 min", "3 h", "2 d".
/// One number is what an operator scans a column for; the JSON has the milliseconds.
pub(crate) fn short_duration(d: Duration) -> String {
    const UNITS: [(u64, &str); 4] = [(86_400, "d"), (3_600, "h"), (60, "min"), (1, "s")];
    let secs = d.as_secs();
    for (size, unit) in UNITS {
        if secs >= size {
            return format!("{} {unit}", secs / size);
        }
    }
    format!("{} ms", d.subsec_millis())
}

/// What is shown of one row. A projection of [`LockInfo`] (which only dblock can build,
/// being `#[non_exhaustive]`), so that the rendering can be unit-tested on made-up rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Row<'a> {
    pub(crate) key: &'a str,
    /// [`LockInfo::kind`].
    pub(crate) kind: &'static str,
    pub(crate) owner: &'a str,
    pub(crate) fencing_token: i64,
    pub(crate) acquired_at: DateTime<Utc>,
    pub(crate) expires_at: DateTime<Utc>,
    pub(crate) expired: bool,
    /// The database clock when the row was read.
    pub(crate) read_at: DateTime<Utc>,
    /// [`LockInfo::held_for`].
    pub(crate) held_for: Duration,
    /// [`LockInfo::expires_in`]: zero once expired.
    pub(crate) expires_in: Duration,
}

impl<'a> From<&'a LockInfo> for Row<'a> {
    fn from(info: &'a LockInfo) -> Self {
        Row {
            key: &info.key,
            kind: info.kind(),
            owner: &info.owner,
            fencing_token: info.fencing_token,
            acquired_at: info.acquired_at,
            expires_at: info.expires_at,
            expired: info.expired,
            read_at: info.read_at,
            held_for: info.held_for(),
            expires_in: info.expires_in(),
        }
    }
}

impl Row<'_> {
    /// "held 3 h".
    fn held(&self) -> String {
        format!("held {}", short_duration(self.held_for))
    }

    /// "expires in 12 s", or "expired 5 s ago" once the lease has run out.
    fn expires(&self) -> String {
        if self.expired {
            // How long ago, by the same clock: read_at - expires_at.
            let ago = (self.read_at - self.expires_at)
                .to_std()
                .unwrap_or_default();
            format!("expired {} ago", short_duration(ago))
        } else {
            format!("expires in {}", short_duration(self.expires_in))
        }
    }
}

pub(crate) fn rfc3339(at: DateTime<Utc>) -> String {
    // Microseconds: the precision PostgreSQL and MySQL store.
    at.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// Keys and owners come from anyone who can write the table: control characters
/// (newlines, tabs, escapes) are shown escaped so that one row stays one line.
pub(crate) fn printable(text: &str) -> Cow<'_, str> {
    if text.chars().any(char::is_control) {
        Cow::Owned(
            text.chars()
                .map(|c| match c.is_control() {
                    true => c.escape_default().to_string(),
                    false => c.to_string(),
                })
                .collect(),
        )
    } else {
        Cow::Borrowed(text)
    }
}

/// The header and one line per row, columns aligned; an empty list is the header alone.
pub(crate) fn table(rows: &[Row<'_>]) -> String {
    const HEADER: [&str; 6] = ["KEY", "OWNER", "TOKEN", "HELD", "EXPIRES", "KIND"];
    let cells: Vec<[String; 6]> = rows
        .iter()
        .map(|row| {
            [
                printable(row.key).into_owned(),
                printable(row.owner).into_owned(),
                row.fencing_token.to_string(),
                row.held(),
                row.expires(),
                row.kind.to_owned(),
            ]
        })
        .collect();
    aligned(HEADER, &cells, 2)
}

/// `header` and one line per row of `cells`, columns aligned, the column `right`
/// right-aligned (numbers, so that their magnitudes line up).
pub(crate) fn aligned<const N: usize>(
    header: [&str; N],
    cells: &[[String; N]],
    right: usize,
) -> String {
    let mut widths = header.map(|title| title.chars().count());
    for row in cells {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header = header.map(str::to_owned);
    for row in std::iter::once(&header).chain(cells) {
        let mut line = String::new();
        for (column, (cell, width)) in row.iter().zip(widths).enumerate() {
            if column > 0 {
                line.push_str("  ");
            }
            if column == right {
                write!(line, "{cell:>width$}").unwrap();
            } else {
                write!(line, "{cell:<width$}").unwrap();
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// `show`: one `field: value` line per field.
pub(crate) fn fields(row: &Row<'_>) -> String {
    let lines = [
        ("key", printable(row.key).into_owned()),
        ("owner", printable(row.owner).into_owned()),
        ("fencing_token", row.fencing_token.to_string()),
        (
            "acquired_at",
            format!("{} ({})", rfc3339(row.acquired_at), row.held()),
        ),
        (
            "expires_at",
            format!("{} ({})", rfc3339(row.expires_at), row.expires()),
        ),
        ("expired", row.expired.to_string()),
        ("kind", row.kind.to_owned()),
    ];
    let mut out = String::new();
    for (name, value) in lines {
        writeln!(out, "{:<14} {value}", format!("{name}:")).unwrap();
    }
    out
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// One JSON object on one line. `read_at` is the database clock the durations were
/// measured from, so a script can line several reads up.
pub(crate) fn json(row: &Row<'_>) -> String {
    serde_json::json!({
        "key": row.key,
        "owner": row.owner,
        "fencing_token": row.fencing_token,
        "acquired_at": rfc3339(row.acquired_at),
        "expires_at": rfc3339(row.expires_at),
        "expired": row.expired,
        "held_ms": millis(row.held_for),
        "expires_in_ms": millis(row.expires_in),
        "read_at": rfc3339(row.read_at),
        "kind": row.kind,
    })
    .to_string()
}

/// "(owner "x", fencing token 7, held 3 h, expires in 12 s)": what `release` deleted.
pub(crate) fn summary(row: &Row<'_>) -> String {
    format!(
        "owner {:?}, fencing token {}, {}, {}",
        printable(row.owner),
        row.fencing_token,
        row.held(),
        row.expires()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_show_their_largest_whole_unit() {
        let cases = [
            (Duration::ZERO, "0 ms"),
            (Duration::from_millis(850), "850 ms"),
            (Duration::from_millis(999), "999 ms"),
            (Duration::from_secs(1), "1 s"),
            (Duration::from_millis(12_900), "12 s"),
            (Duration::from_secs(59), "59 s"),
            (Duration::from_secs(60), "1 min"),
            (Duration::from_secs(4 * 60 + 59), "4 min"),
            (Duration::from_secs(3_599), "59 min"),
            (Duration::from_secs(3 * 3_600 + 1_800), "3 h"),
            (Duration::from_secs(86_399), "23 h"),
            (Duration::from_secs(2 * 86_400 + 7), "2 d"),
            (Duration::from_secs(400 * 86_400), "400 d"),
        ];
        for (d, shown) in cases {
            assert_eq!(short_duration(d), shown, "{d:?}");
        }
    }

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text).unwrap().to_utc()
    }

    /// A row read at 10:00:00.5, held `held_secs`, expiring `expires_secs` from then.
    fn row(key: &str, token: i64, held_secs: i64, expires_secs: i64) -> Row<'_> {
        let read_at = at("2026-12-01T10:00:00.5Z");
        let expires_at = read_at + chrono::Duration::seconds(expires_secs);
        Row {
            key,
            kind: "mutex",
            owner: "node-1:abc",
            fencing_token: token,
            acquired_at: read_at - chrono::Duration::seconds(held_secs),
            expires_at,
            expired: expires_at <= read_at,
            read_at,
            held_for: Duration::from_secs(held_secs.unsigned_abs()),
            expires_in: (expires_at - read_at).to_std().unwrap_or_default(),
        }
    }

    #[test]
    fn table_columns_line_up() {
        let rows = [row("job:nightly", 7, 3 * 3_600, 12), row("k", 1234, 2, -5)];
        let text = table(&rows);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert_eq!(
            lines[0],
            "KEY          OWNER       TOKEN  HELD      EXPIRES          KIND"
        );
        assert_eq!(
            lines[1],
            "job:nightly  node-1:abc      7  held 3 h  expires in 12 s  mutex"
        );
        assert_eq!(
            lines[2],
            "k            node-1:abc   1234  held 2 s  expired 5 s ago  mutex"
        );
    }

    #[test]
    fn an_empty_table_is_its_header() {
        assert_eq!(table(&[]), "KEY  OWNER  TOKEN  HELD  EXPIRES  KIND\n");
    }

    #[test]
    fn control_characters_are_escaped() {
        let rows = [row("a\nb\tc", 1, 0, 60)];
        let text = table(&rows);
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(text.contains(r"a\nb\tc"), "{text}");
        assert!(fields(&rows[0]).contains(r"key:           a\nb\tc"));
    }

    #[test]
    fn show_lists_every_field() {
        let text = fields(&row("job:nightly", 7, 3 * 3_600, -5));
        assert_eq!(
            text,
            "key:           job:nightly\n\
             owner:         node-1:abc\n\
             fencing_token: 7\n\
             acquired_at:   2026-12-01T07:00:00.500000Z (held 3 h)\n\
             expires_at:    2026-12-01T09:59:55.500000Z (expired 5 s ago)\n\
             expired:       true\n\
             kind:          mutex\n"
        );
    }

    #[test]
    fn json_is_one_object_on_one_line() {
        let text = json(&row("k\n", 7, 90, 12));
        assert!(!text.contains('\n'), "{text}");
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            value,
            serde_json::json!({
                "key": "k\n",
                "owner": "node-1:abc",
                "fencing_token": 7,
                "acquired_at": "2026-12-01T09:58:30.500000Z",
                "expires_at": "2026-12-01T10:00:12.500000Z",
                "expired": false,
                "held_ms": 90_000,
                "expires_in_ms": 12_000,
                "read_at": "2026-12-01T10:00:00.500000Z",
                "kind": "mutex",
            })
        );
    }
}
