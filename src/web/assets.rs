//! The console's stylesheet and script, embedded in the library and served by its own
//! router (no CDN, nothing fetched from elsewhere: the CSP allows only 'self').

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

use super::layout;

/// Plain tables, readable without the script.
const CSS: &str = r#"body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #1b1f24; }
header { display: flex; gap: 1.5em; align-items: baseline; padding: .6em 1em;
  background: #24292f; color: #f6f8fa; }
header code { color: #f6f8fa; }
nav a { color: #9ecbff; margin-right: 1em; }
main { padding: 1em; }
h1 { font-size: 1.3em; } h2 { font-size: 1.1em; margin-top: 1.5em; }
table { border-collapse: collapse; margin: .5em 0; }
th, td { border-bottom: 1px solid #d0d7de; padding: .25em .6em; text-align: left;
  vertical-align: top; }
th { background: #f6f8fa; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.owner, code { font-family: ui-monospace, monospace; word-break: break-all; }
tr.expired { color: #8c959f; }
.note { color: #57606a; max-width: 60em; }
.warning { color: #9a6700; max-width: 60em; }
.error { color: #cf222e; }
button.danger { background: #cf222e; color: #fff; border: 0; padding: .4em .8em; }
svg.timeline { width: 100%; max-width: 900px; height: auto; border: 1px solid #d0d7de; }
"#;

/// Counts leases down between refreshes and refreshes the page's content every few
/// seconds (pages marked `data-refresh`), keeping what the reader is typing.
const JS: &str = r#""use strict";
(function () {
  var REFRESH_MS = 5000;
  var shownAt = performance.now();
  function shown(ms) {
    var s = Math.floor(ms / 1000);
    if (s < 60) return (ms / 1000).toFixed(1) + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + (s % 60) + " s";
    if (s < 86400) return Math.floor(s / 3600) + " h " + Math.floor(s % 3600 / 60) + " min";
    return Math.floor(s / 86400) + " d " + Math.floor(s % 86400 / 3600) + " h";
  }
  function tick() {
    var gone = performance.now() - shownAt;
    document.querySelectorAll("[data-left-ms]").forEach(function (cell) {
      var left = Number(cell.getAttribute("data-left-ms")) - gone;
      cell.textContent = left > 0 ? shown(left) : "ran out";
    });
  }
  function refresh() {
    var live = document.getElementById("live");
    if (!live || !live.hasAttribute("data-refresh")) return;
    if (live.contains(document.activeElement) && document.activeElement.tagName === "INPUT") return;
    fetch(location.href, { credentials: "same-origin", cache: "no-store" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (text) {
        if (!text) return;
        var fresh = new DOMParser().parseFromString(text, "text/html").getElementById("live");
        if (fresh) { live.replaceWith(document.adoptNode(fresh)); shownAt = performance.now(); }
      })
      .catch(function () {});
  }
  setInterval(tick, 250);
  setInterval(refresh, REFRESH_MS);
})();
"#;

pub(super) async fn css() -> Response {
    asset(CSS, "text/css; charset=utf-8")
}

pub(super) async fn js() -> Response {
    asset(JS, "text/javascript; charset=utf-8")
}

fn asset(body: &'static str, kind: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    layout::private(headers);
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    response
}
