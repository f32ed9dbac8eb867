//! Section 9: the web console (`dblock::web`, cargo feature `web`; without it the section
//! says so). One cell ([`locks_page`]): the locks page over 10,000 held locks, rendered
//! through the console's Router (`oneshot`, no HTTP server, so the figure is the
//! console's own: the database read, the page's HTML, the response).

mod locks_page;

use crate::servers::{LockDb, Server};
use crate::settings::Settings;

pub const INTRO: &str = "## 9. Console: the locks page over 10,000 held locks\n\n\
    10,000 locks held through dblock (not renewed during the cell); each request renders \
    one page of 100 rows through the console's Router (`tower::ServiceExt::oneshot`: \
    the database read, the HTML, the response; no HTTP server). The pages take turns \
    within each round; `list_matching` alone (the page's read, 101 rows) is timed \
    beside them, to show what the rendering adds. Target: a page in < 1 s (p99).\n\n";

/// Section 9 on one server; its markdown.
pub async fn section<DB: LockDb>(settings: &Settings, server: &Server<DB>) -> String
where
    dblock::AnyLocker: From<dblock::Locker<DB>>,
{
    match locks_page::cell(settings, server).await {
        Ok(md) => md,
        Err(e) => format!("### {}\n\nNot measured: {e}\n\n", server.label),
    }
}
