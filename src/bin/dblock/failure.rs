//! Why a command failed, as an exit code and the one line printed on stderr.

/// Exit code 1: the key has no row, or there was nothing to do.
pub(crate) const NOT_FOUND: u8 = 1;
/// Exit code 2: the command line or its input is wrong; nothing was changed.
pub(crate) const USAGE: u8 = 2;
/// Exit code 3: the database could not be reached, or refused or failed a statement.
pub(crate) const DATABASE: u8 = 3;

/// A failed command: its exit code and what to tell the operator.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Failure {
    pub(crate) code: u8,
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn not_found(message: String) -> Self {
        Failure {
            code: NOT_FOUND,
            message,
        }
    }

    pub(crate) fn usage(message: String) -> Self {
        Failure {
            code: USAGE,
            message,
        }
    }

    pub(crate) fn database(message: String) -> Self {
        Failure {
            code: DATABASE,
            message,
        }
    }

    /// The message as one line: database errors may carry newlines (server details).
    pub(crate) fn line(&self) -> String {
        let lines: Vec<&str> = self.message.lines().map(str::trim).collect();
        lines
            .into_iter()
            .filter(|line| !line.is_empty())
            .collect::<Vec<_>>()
            .join(" ")
    }
}

impl From<dblock::Error> for Failure {
    fn from(err: dblock::Error) -> Self {
        use dblock::Error;
        match err {
            // dblock checked the input before sending anything.
            Error::InvalidKey { .. }
            | Error::InvalidConfig(_)
            | Error::InvalidDuration { .. }
            | Error::InvalidTableName { .. } => Failure::usage(err.to_string()),
            // dblock's own text names the library call; an operator needs the command.
            Error::MissingTable { .. } => Failure::database(
                err.to_string()
                    .replace("Locker::migrate()", "`dblock migrate`"),
            ),
            err => Failure::database(err.to_string()),
        }
    }
}
