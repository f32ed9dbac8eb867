//! `dblock`, the operator CLI (cargo feature `cli`): list, show, release, reap and migrate
//! a lock table, read its history, and serve its web console (`dblock web`) on PostgreSQL,
//! MySQL/MariaDB or SQLite. A plain client of dblock's public API; `dblock --help` lists
//! the commands and exit codes.
//!
//! Scripts can rely on: the exit code (0 success, also with nothing to do; 1 not found; 2 usage,
//! 3 database), exactly one line on stderr starting with `dblock: ` for every failure,
//! and `--json` output of one object per line.

#![forbid(unsafe_code)]

mod args;
mod commands;
mod database;
mod failure;
mod history;
mod render;
mod web;

use std::io::Write as _;
use std::process::ExitCode;

use clap::Parser as _;

use args::Cli;
use failure::Failure;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // --help and --version: clap's own output on stdout, exit 0.
        Err(err) if !err.use_stderr() => {
            let _ = err.print();
            return ExitCode::SUCCESS;
        }
        Err(err) => return fail(&Failure::usage(clap_message(&err))),
    };
    // One command, one statement at a time: a single-threaded runtime is enough.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => return fail(&Failure::database(format!("cannot start: {err}"))),
    };
    let outcome = runtime.block_on(async {
        commands::check(&cli.command)?;
        database::execute(&cli).await
    });
    match outcome {
        Ok(output) => {
            if let Err(err) = std::io::stdout().lock().write_all(output.stdout.as_bytes()) {
                // A reader that stopped early (`dblock list | head`) is not a failure.
                if err.kind() != std::io::ErrorKind::BrokenPipe {
                    return fail(&Failure::database(format!(
                        "cannot write the output: {err}"
                    )));
                }
            }
            if let Some(note) = output.note {
                eprintln!("{note}");
            }
            ExitCode::SUCCESS
        }
        Err(failure) => fail(&failure),
    }
}

fn fail(failure: &Failure) -> ExitCode {
    eprintln!("dblock: {}", failure.line());
    ExitCode::from(failure.code)
}

/// clap's error as one line: its first paragraph (the error and, for a missing argument,
/// which one), without the usage block that follows; `--help` has that.
fn clap_message(err: &clap::Error) -> String {
    if err.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        // clap would print the whole help on stderr.
        return "no command given: migrate, list, show, release, reap, history or web (see --help)"
            .to_owned();
    }
    let text = err.to_string();
    let first: Vec<&str> = text
        .lines()
        .take_while(|line| !line.trim().is_empty())
        .map(str::trim)
        .collect();
    let message = first.join(" ");
    let message = message.strip_prefix("error: ").unwrap_or(&message);
    format!("{message} (see --help)")
}
