//! Force-release from the console, when the mounting code enabled it: a row's button posts
//! to a confirmation page, whose form posts the key with this console's CSRF token. Both
//! steps answer 403 when force-release is off; the second also refuses a cross-site
//! request (by `Sec-Fetch-Site` and `Origin`) and a wrong token, before anything is sent.

use axum::Form;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use maud::html;
use serde::Deserialize;
use subtle::ConstantTimeEq as _;

use super::layout::{self, duration};
use super::{Base, State};
use crate::admin::LockFilter;

/// The fields both forms post.
#[derive(Debug, Deserialize)]
pub(super) struct ReleaseForm {
    key: String,
    #[serde(default)]
    csrf: String,
}

/// A fresh CSRF token for one console: two version-4 UUIDs (244 random bits from the
/// operating system's generator), as 64 hex digits.
pub(super) fn fresh_secret() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// Step one: what would be released, and a form to confirm it. Writes nothing.
pub(super) async fn confirm(
    axum::extract::State(shared): State,
    base: Base,
    Form(form): Form<ReleaseForm>,
) -> Response {
    if shared.operator.is_none() {
        return disabled();
    }
    let locker = &shared.locker;
    // The row of exactly this key, with the database clock's times.
    let filter = LockFilter::new().prefix(form.key.as_str()).limit(1);
    let row = match locker.list_matching(&filter).await {
        Ok(rows) => rows.into_iter().find(|row| row.key == form.key),
        Err(err) => return layout::failure(&base, locker.table(), &err),
    };
    let body = html! {
        h1 { "Force-release a lock?" }
        @match &row {
            Some(row) => {
                p { "Key " code { (row.key) } " is held by " code { (row.owner) }
                    " (token " (row.fencing_token) ", held for " (duration(row.held_for())) ")." }
                p.warning {
                    "Its row is deleted whoever holds it; the holder is not asked. A renewed \
                     holder learns at its next renewal; its later writes are refused only \
                     where the resource checks fencing tokens."
                }
                form method="post" action=(base.at("/release")) {
                    input type="hidden" name="key" value=(row.key);
                    input type="hidden" name="csrf" value=(shared.csrf);
                    button.danger type="submit" { "Release " (row.key) }
                }
            }
            None => { p { "No row for key " code { (form.key) } " any more: nothing to release." } }
        }
        p { a href=(base.at("/")) { "Back to the locks" } }
    };
    layout::page_once(&base, locker.table(), "force-release", body)
}

/// Step two: the confirmed release, after the cross-site and token checks.
pub(super) async fn release(
    axum::extract::State(shared): State,
    base: Base,
    headers: HeaderMap,
    Form(form): Form<ReleaseForm>,
) -> Response {
    let Some(operator) = &shared.operator else {
        return disabled();
    };
    if let Err(why) = same_origin(&headers) {
        return layout::refusal(StatusCode::FORBIDDEN, why);
    }
    let given = form.csrf.as_bytes();
    if !bool::from(given.ct_eq(shared.csrf.as_bytes())) {
        return layout::refusal(
            StatusCode::FORBIDDEN,
            "The form's token is missing or wrong (a page from another console, or from \
             before a restart): open the locks page again.",
        );
    }
    let locker = &shared.locker;
    // Recorded in the history (whether or not this Locker records) under the operator.
    let operator = format!("console:{operator}");
    let released = match locker.force_release_by(&form.key, &operator).await {
        Ok(released) => released,
        Err(err) => return layout::failure(&base, locker.table(), &err),
    };
    let body = html! {
        h1 { "Force-release" }
        @if released {
            p { "Released " code { (form.key) } "." }
        } @else {
            p { "No row for key " code { (form.key) } " any more: nothing was deleted." }
        }
        p { a href=(base.at("/")) { "Back to the locks" } }
    };
    layout::page_once(&base, locker.table(), "force-release", body)
}

fn disabled() -> Response {
    layout::refusal(
        StatusCode::FORBIDDEN,
        "Force-release is not enabled on this console (the mounting code enables it with \
         Console::allow_force_release).",
    )
}

/// Refuses a request a browser marks as coming from another site: `Sec-Fetch-Site` other
/// than `same-origin`, or, from a browser that does not send it, an `Origin` whose host is
/// not the request's `Host`. A client that sends neither (curl, a test) is left to the CSRF
/// token. A browser's own `same-origin` decides: it is sent with an `Origin` of `null`
/// where the page's referrer policy hides the origin (Chromium does, under `no-referrer`:
/// the browser test found the console refusing its own form).
fn same_origin(headers: &HeaderMap) -> Result<(), &'static str> {
    const CROSS_SITE: &str = "A request from another site (or a page that hides its origin) \
                              cannot release locks.";
    if let Some(site) = headers.get("sec-fetch-site") {
        return match site.as_bytes() {
            b"same-origin" => Ok(()),
            _ => Err(CROSS_SITE),
        };
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let host = headers.get(header::HOST).map(|host| host.as_bytes());
        // `scheme://host[:port]`; "null" (a sandboxed or privacy-hidden origin) has none.
        let origin_host = origin
            .to_str()
            .ok()
            .and_then(|origin| origin.split_once("://"))
            .map(|(_, authority)| authority.as_bytes());
        if origin_host.is_none() || origin_host != host {
            return Err(CROSS_SITE);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use axum::http::{HeaderMap, HeaderValue};

    use super::{fresh_secret, same_origin};

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_static(value));
        }
        map
    }

    #[test]
    fn cross_site_requests_are_refused() {
        assert!(same_origin(&headers(&[])).is_ok());
        assert!(same_origin(&headers(&[("sec-fetch-site", "same-origin")])).is_ok());
        assert!(same_origin(&headers(&[("sec-fetch-site", "cross-site")])).is_err());
        // A browser's word decides, whatever the Origin its referrer policy let it send.
        let hidden = [("sec-fetch-site", "same-origin"), ("origin", "null")];
        assert!(same_origin(&headers(&hidden)).is_ok());
        assert!(same_origin(&headers(&[("origin", "null")])).is_err());
        assert!(same_origin(&headers(&[("sec-fetch-site", "same-site")])).is_err());
        let here = [
            ("host", "127.0.0.1:8080"),
            ("origin", "http://127.0.0.1:8080"),
        ];
        assert!(same_origin(&headers(&here)).is_ok());
        let there = [
            ("host", "127.0.0.1:8080"),
            ("origin", "https://evil.example"),
        ];
        assert!(same_origin(&headers(&there)).is_err());
        assert!(same_origin(&headers(&[("host", "a"), ("origin", "null")])).is_err());
        assert!(same_origin(&headers(&[("origin", "http://a")])).is_err());
    }

    #[test]
    fn secrets_are_long_and_fresh() {
        let (a, b) = (fresh_secret(), fresh_secret());
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
    }
}
