//! What the test binaries that run without libtest (`harness = false`: the fault suite,
//! the nemesis) share: reading libtest's command line, and the main of a child process.

use std::future::Future;
use std::process::ExitCode;

/// The words that select what a standalone test binary named `name` runs: its arguments
/// that do not start with `-`, leaving out libtest's flags (with the values of those that
/// take one) and the binary's own name. `None` when cargo (or nextest) only asked for the
/// list of tests (`--list`): that was answered, one test, the whole binary.
pub fn selection(name: &str) -> Option<Vec<String>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list") {
        if !args.iter().any(|a| a == "--ignored") {
            println!("{name}: test");
        }
        return None;
    }
    let mut filter = Vec::new();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let takes_value = [
            "--test-threads",
            "--skip",
            "--format",
            "--color",
            "--logfile",
            "-Z",
        ];
        if takes_value.contains(&arg.as_str()) {
            args.next();
        } else if !arg.starts_with('-') && arg != name {
            filter.push(arg);
        }
    }
    Some(filter)
}

/// Runs a child process's work (`run` gets the arguments) on a one-worker runtime; an
/// error is printed as `ERROR <message>` on one line, and the exit status says failure.
pub fn child_main<F, E>(run: impl FnOnce(Vec<String>) -> F) -> ExitCode
where
    F: Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("tokio runtime");
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            println!("ERROR {}", err.to_string().replace('\n', " "));
            ExitCode::FAILURE
        }
    }
}
