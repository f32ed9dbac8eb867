//! What every page shares: the frame (navigation, stylesheet, script), the response
//! headers that keep a page of lock data private to its reader, and small formatters.

use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use maud::{DOCTYPE, Markup, html};

use super::Base;
use crate::error::Error;

/// The pages in the navigation: path and title.
const NAV: &[(&str, &str)] = &[
    ("/", "Locks"),
    ("/primitives", "Primitives"),
    ("/jobs", "Jobs"),
    ("/metrics", "Metrics"),
];

/// Only this router's own script and stylesheet run; no frame may embed the console (a
/// clickjacked force-release button); forms post only back to it.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; form-action 'self'; frame-ancestors 'none'; \
                   base-uri 'none'";

/// A whole page: `title`, the table's name, the navigation and `body`, which the script
/// refreshes while JavaScript is on.
pub(super) fn page(base: &Base, table: &str, title: &str, body: Markup) -> Response {
    frame(base, table, title, body, true)
}

/// [`page`] without refreshing: the answer to a form, or an error.
pub(super) fn page_once(base: &Base, table: &str, title: &str, body: Markup) -> Response {
    frame(base, table, title, body, false)
}

fn frame(base: &Base, table: &str, title: &str, body: Markup, refresh: bool) -> Response {
    let markup = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { "dblock: " (title) " (" (table) ")" }
                link rel="stylesheet" href=(base.at("/assets/console.css"));
                script src=(base.at("/assets/console.js")) defer {}
            }
            body {
                header {
                    strong { "dblock" }
                    " table " code { (table) }
                    nav {
                        @for (path, name) in NAV {
                            a href=(base.at(path)) { (name) }
                        }
                    }
                }
                main id="live" data-refresh[refresh] { (body) }
            }
        }
    };
    respond(StatusCode::OK, markup.into_string())
}

/// `body` as HTML with the console's headers.
pub(super) fn respond(status: StatusCode, body: String) -> Response {
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    private(headers);
    response
}

/// Headers for every answer: lock data is not cached, not sniffed as another type, not
/// framed, and the URL (keys, the CLI's token) is not sent on as a referrer.
pub(super) fn private(headers: &mut axum::http::HeaderMap) {
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        // Keys travel in the pages' addresses: never to another site. Same-origin requests
        // keep their referrer and their Origin (a form post's is checked).
        HeaderValue::from_static("same-origin"),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
}

/// A failed read as a page: the error's text (dblock's errors carry keys and causes,
/// never the connection URL) with status 400 for bad input, 500 otherwise.
pub(super) fn failure(base: &Base, table: &str, err: &Error) -> Response {
    let status = match err {
        Error::InvalidKey { .. } | Error::InvalidConfig(_) | Error::InvalidDuration { .. } => {
            StatusCode::BAD_REQUEST
        }
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let mut response = page_once(
        base,
        table,
        "error",
        html! { h1 { "Cannot show this page" } p.error { (err) } },
    );
    *response.status_mut() = status;
    response
}

/// A short page with a status other than 200 (403, 404), saying why.
pub(super) fn refusal(status: StatusCode, why: &str) -> Response {
    let markup = html! {
        (DOCTYPE)
        html lang="en" { head { meta charset="utf-8"; title { "dblock: " (status) } }
            body { h1 { (status) } p { (why) } } }
    };
    respond(status, markup.into_string())
}

/// A duration as operators read it: `1.2 s`, `3 min 4 s`, `2 h 5 min`, `3 d 4 h`.
pub(super) fn duration(d: Duration) -> String {
    let secs = d.as_secs();
    match secs {
        0..60 => format!("{:.1} s", d.as_secs_f64()),
        60..3600 => format!("{} min {} s", secs / 60, secs % 60),
        3600..86400 => format!("{} h {} min", secs / 3600, secs % 3600 / 60),
        _ => format!("{} d {} h", secs / 86400, secs % 86400 / 3600),
    }
}

/// `text` percent-encoded for a URL's path segment or query value: every byte but the
/// unreserved ones (RFC 3986), so a key with `/`, `?`, `#`, `&` or `%` stays one value.
pub(super) fn encoded(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{duration, encoded};

    #[test]
    fn keys_stay_one_url_value() {
        assert_eq!(encoded("job:a"), "job%3Aa");
        assert_eq!(encoded("a/b?c#d&e%f g"), "a%2Fb%3Fc%23d%26e%25f%20g");
        assert_eq!(encoded("ключ~read-1"), "%D0%BA%D0%BB%D1%8E%D1%87~read-1");
    }

    #[test]
    fn durations_read_as_people_say_them() {
        assert_eq!(duration(Duration::from_millis(1234)), "1.2 s");
        assert_eq!(duration(Duration::from_secs(184)), "3 min 4 s");
        assert_eq!(duration(Duration::from_secs(7500)), "2 h 5 min");
        assert_eq!(
            duration(Duration::from_secs(3 * 86400 + 4 * 3600)),
            "3 d 4 h"
        );
    }
}
