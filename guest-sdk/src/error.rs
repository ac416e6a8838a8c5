//! The error type operators return; it crosses the boundary as the `string` of a WIT
//! `result`, and the host reports it with job, operator uid and subtask.

use std::fmt;

/// An operator error: a message for the person running the job.
///
/// Any `std::error::Error` converts into it with `?`; build one from text with
/// [`Error::msg`] or [`bail!`](crate::bail).
pub struct Error(String);

impl Error {
    /// An error with this message.
    pub fn msg(message: impl fmt::Display) -> Self {
        Error(message.to_string())
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.0
    }

    /// Prefixes the message with `context: `.
    pub fn context(self, context: impl fmt::Display) -> Self {
        Error(format!("{context}: {}", self.0))
    }
}

impl<E: std::error::Error> From<E> for Error {
    fn from(e: E) -> Self {
        Error(e.to_string())
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The result operators return.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Returns early with an [`Error`] built like `format!`.
#[macro_export]
macro_rules! bail {
    ($($arg:tt)*) => {
        return ::core::result::Result::Err($crate::Error::msg(::std::format!($($arg)*)))
    };
}
