//! `dblock web`: the library's console (`dblock::web`) served over HTTP, behind a token.
//! Every request must carry it, as `Authorization: Bearer <token>`, as the cookie a first
//! `?token=` visit sets (HttpOnly, SameSite=Strict), or as that `?token=` itself on a GET;
//! anything else is answered 401. Loopback unless --listen says otherwise, and then only
//! with an explicit --token.

use std::io::Write as _;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use dblock::web::Console;
use dblock::{AnyLocker, Backend, Locker};
use subtle::ConstantTimeEq as _;

use crate::args::WebArgs;
use crate::commands::Output;
use crate::failure::Failure;

/// The cookie that carries the token after a first `?token=` visit.
const COOKIE: &str = "dblock_token";

/// Refuses a non-loopback address without an explicit token (before anything connects):
/// a token printed on a terminal is no secret worth exposing to a network.
pub(crate) fn check(args: &WebArgs) -> Result<(), Failure> {
    if !args.listen.ip().is_loopback() && args.token.is_none() {
        return Err(Failure::usage(format!(
            "--listen {} is not a loopback address: give --token (and put TLS in front)",
            args.listen
        )));
    }
    Ok(())
}

/// Serves the console of `locker`'s table until Ctrl-C.
pub(crate) async fn serve<DB: Backend>(
    locker: Locker<DB>,
    args: &WebArgs,
) -> Result<Output, Failure>
where
    AnyLocker: From<Locker<DB>>,
{
    let table = locker.table().to_owned();
    let mut console = Console::new(locker);
    if args.allow_force_release {
        let user = std::env::var("USER").unwrap_or_else(|_| "dblock-web".to_owned());
        console = console.allow_force_release(user);
    }
    let token: Arc<str> = match &args.token {
        Some(token) => token.as_str().into(),
        None => fresh_token().into(),
    };
    let app = console
        .router()
        .layer(middleware::from_fn_with_state(token.clone(), authorize));
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|err| Failure::usage(format!("cannot listen on {}: {err}", args.listen)))?;
    let at = listener
        .local_addr()
        .map_err(|err| Failure::usage(format!("cannot listen on {}: {err}", args.listen)))?;
    // The first line says where (and, for a generated token, with what) to connect; a
    // script reads it before its first request.
    let shown = match args.token {
        Some(_) => format!("http://{at}/ (with the token given by --token)"),
        None => format!("http://{at}/?token={token}"),
    };
    let mut stdout = std::io::stdout().lock();
    let printed = writeln!(stdout, "dblock web: console of table {table:?} at {shown}")
        .and_then(|()| stdout.flush());
    drop(stdout);
    printed.map_err(|err| Failure::usage(format!("cannot write the address: {err}")))?;
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .map_err(|err| Failure::database(format!("the console's server failed: {err}")))?;
    Ok(Output::default())
}

/// A fresh token: 32 hex digits from a version-4 UUID (122 random bits).
fn fresh_token() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// Lets a request through with the token; trades a GET's `?token=` for the cookie (a
/// redirect to the same address without it, so it leaves the address bar and history).
async fn authorize(State(token): State<Arc<str>>, request: Request, next: Next) -> Response {
    let headers = request.headers();
    let carried = [bearer(headers), cookie(headers)];
    if carried
        .into_iter()
        .flatten()
        .any(|given| same(given, &token))
    {
        return next.run(request).await;
    }
    if request.method() == Method::GET
        && let Some((given, rest)) = query_token(request.uri())
        && same(&given, &token)
    {
        let path = request.uri().path();
        let location = match rest.is_empty() {
            true => path.to_owned(),
            false => format!("{path}?{rest}"),
        };
        let cookie = format!("{COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/");
        let mut response = StatusCode::SEE_OTHER.into_response();
        let headers = response.headers_mut();
        if let (Ok(location), Ok(cookie)) = (
            HeaderValue::from_str(&location),
            HeaderValue::from_str(&cookie),
        ) {
            headers.insert(header::LOCATION, location);
            headers.insert(header::SET_COOKIE, cookie);
            return response;
        }
    }
    let mut response = (
        StatusCode::UNAUTHORIZED,
        "dblock web: this console needs its token (the address `dblock web` printed)\n",
    )
        .into_response();
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

/// Compared in constant time: the token's bytes must not leak through response times.
fn same(given: &str, token: &str) -> bool {
    bool::from(given.as_bytes().ct_eq(token.as_bytes()))
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    value.strip_prefix("Bearer ")
}

fn cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .find_map(|pair| pair.trim().strip_prefix(COOKIE)?.strip_prefix('='))
}

/// The `token` query parameter, and the rest of the query without it.
fn query_token(uri: &axum::http::Uri) -> Option<(String, String)> {
    let query = uri.query()?;
    let mut found = None;
    let mut rest = Vec::new();
    for pair in query.split('&') {
        match pair.strip_prefix("token=") {
            Some(value) if found.is_none() => found = Some(value.to_owned()),
            _ => rest.push(pair),
        }
    }
    Some((found?, rest.join("&")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_read_where_it_may_travel() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer abc"),
        );
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; dblock_token=xyz; b=2"),
        );
        assert_eq!(bearer(&headers), Some("abc"));
        assert_eq!(cookie(&headers), Some("xyz"));
        let uri: axum::http::Uri = "/key/a?prefix=p&token=t0k&after=x".parse().unwrap();
        assert_eq!(
            query_token(&uri),
            Some(("t0k".to_owned(), "prefix=p&after=x".to_owned()))
        );
        assert_eq!(query_token(&"/?prefix=p".parse().unwrap()), None);
        assert!(same("abc", "abc") && !same("abd", "abc") && !same("ab", "abc"));
    }
}
