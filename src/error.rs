//! The library's typed errors. Every variant names what was wrong and what is allowed,
//! so the CLI can print it as is (`anyhow` lives only in the binary).

/// Result with the library's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error the core reports about its input.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum Error {
    /// A value out of its allowed range or set.
    #[error("invalid {field} = {value}: {allowed}")]
    Invalid {
        /// The parameter or field, as the user spells it (`--gbs`, `sigma`, `nodes`).
        field: String,
        /// The offending value, as given.
        value: String,
        /// What would have been accepted.
        allowed: String,
    },
    /// Text that could not be parsed.
    #[error("{context}: {message}")]
    Parse {
        /// What was being parsed (a file name, `corpus spec`, ...).
        context: String,
        /// What went wrong and where (line, field).
        message: String,
    },
}

/// Shorthand for [`Error::Invalid`].
pub fn invalid(
    field: impl Into<String>,
    value: impl ToString,
    allowed: impl Into<String>,
) -> Error {
    Error::Invalid {
        field: field.into(),
        value: value.to_string(),
        allowed: allowed.into(),
    }
}

/// Shorthand for [`Error::Parse`].
pub fn parse_error(context: impl Into<String>, message: impl Into<String>) -> Error {
    Error::Parse {
        context: context.into(),
        message: message.into(),
    }
}
