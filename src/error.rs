//! The library's typed errors. Every variant names what was wrong and what is allowed,
//! so the CLI can print it as is (`anyhow` lives only in the binary).
//!
//! [`Context`] adds what the caller was doing (a file, a table, a point) to any error;
//! `bail!` refuses an experiment specification with a message that names the field and
//! what is allowed.

/// Result with the library's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error the core reports about its input.
#[derive(Debug, thiserror::Error, PartialEq)]
#[non_exhaustive]
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
    /// An experiment specification refused: the message names the file, the field, the
    /// value and what is allowed.
    #[error("{0}")]
    Spec(String),
    /// A file the specification names could not be read.
    #[error("{0}")]
    Io(String),
    /// An error with what the caller was doing when it happened.
    #[error("{context}: {cause}")]
    Context {
        /// The file, table or point being worked on.
        context: String,
        /// What went wrong there.
        cause: Box<Error>,
    },
    /// A step's op graph cannot finish: the op at the head of a GPU stream waits on
    /// something that never happens (a dependency cycle, or a collective whose parts are
    /// not all issued).
    #[error(
        "invalid op graph = op {op} ({class} mb {mb} layer {layer}) on GPU {gpu} {stream} never \
         ran: a graph whose dependencies and collectives can all be met (no deadlock)"
    )]
    Deadlock {
        /// The stuck op's id in its graph.
        op: u32,
        /// Its class (`attn_fwd`, `a2a_in`, ...).
        class: &'static str,
        /// Its micro-batch (65535 for step-level ops).
        mb: u16,
        /// Its layer (65535 for ops that are not per layer).
        layer: u16,
        /// The GPU whose stream it heads.
        gpu: u32,
        /// The stream's kind (`compute`, `cp`, ...).
        stream: &'static str,
    },
    /// A plan the checker refused: the group and what is wrong with it.
    #[error("{0}")]
    Plan(#[from] crate::plan::Violation),
    /// The caller asked a running experiment to stop (checked between sweep points).
    #[error("cancelled")]
    Cancelled,
}

impl Error {
    /// The innermost error under any [`Error::Context`]: the one that names the field.
    pub fn root(&self) -> &Error {
        match self {
            Error::Context { cause, .. } => cause.root(),
            e => e,
        }
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e.to_string())
    }
}

/// Formatting into a `String` (`write!`), which cannot fail in practice.
impl From<std::fmt::Error> for Error {
    fn from(e: std::fmt::Error) -> Self {
        Error::Io(e.to_string())
    }
}

impl From<toml::de::Error> for Error {
    fn from(e: toml::de::Error) -> Self {
        Error::Spec(e.to_string())
    }
}

impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Error::Spec(e.to_string())
    }
}

/// Adds what the caller was doing to an error, as `anyhow::Context` does in a binary.
pub trait Context<T> {
    /// Wrap the error in [`Error::Context`] with `context`.
    fn context(self, context: impl std::fmt::Display) -> Result<T>;
    /// Wrap the error in [`Error::Context`] with the context `f` builds (only on error).
    fn with_context<C: std::fmt::Display>(self, f: impl FnOnce() -> C) -> Result<T>;
}

impl<T, E: Into<Error>> Context<T> for std::result::Result<T, E> {
    fn context(self, context: impl std::fmt::Display) -> Result<T> {
        self.map_err(|e| Error::Context {
            context: context.to_string(),
            cause: Box::new(e.into()),
        })
    }
    fn with_context<C: std::fmt::Display>(self, f: impl FnOnce() -> C) -> Result<T> {
        self.map_err(|e| Error::Context {
            context: f().to_string(),
            cause: Box::new(e.into()),
        })
    }
}

impl<T> Context<T> for Option<T> {
    fn context(self, context: impl std::fmt::Display) -> Result<T> {
        self.ok_or_else(|| Error::Spec(context.to_string()))
    }
    fn with_context<C: std::fmt::Display>(self, f: impl FnOnce() -> C) -> Result<T> {
        self.ok_or_else(|| Error::Spec(f().to_string()))
    }
}

/// An [`Error::Spec`] with a formatted message.
macro_rules! spec_error {
    ($($t:tt)*) => {
        $crate::error::Error::Spec(format!($($t)*))
    };
}
pub(crate) use spec_error;

/// Return an [`Error::Spec`] with a formatted message.
macro_rules! bail {
    ($($t:tt)*) => {
        return Err($crate::error::spec_error!($($t)*))
    };
}
pub(crate) use bail;

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

/// Bytes as a person reads them (GiB, MiB, KiB).
pub fn human_bytes(bytes: f64) -> String {
    let gib = (1u64 << 30) as f64;
    if bytes >= gib {
        format!("{:.1} GiB", bytes / gib)
    } else if bytes >= (1 << 20) as f64 {
        format!("{:.1} MiB", bytes / (1 << 20) as f64)
    } else {
        format!("{:.0} KiB", bytes / 1024.0)
    }
}

/// A message as it is shown to a user: every number whose plain decimal form runs past 24
/// characters (a value of `1e300` echoes as 301 digits, from this crate's messages and from
/// the TOML and JSON parsers' alike) in the shortest scientific form of the same `f64`;
/// everything else as it is.
pub fn compact_numbers(message: &str) -> String {
    const LONGEST: usize = 24;
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(start) = rest.find(|c: char| c.is_ascii_digit()) {
        let run = rest[start..]
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .map_or(&rest[start..], |end| &rest[start..start + end]);
        // a sentence's closing full stop is not the number's
        let number = run.trim_end_matches('.');
        let len = number.len();
        out.push_str(&rest[..start]);
        match number.parse::<f64>() {
            Ok(v) if len > LONGEST && v.is_finite() => out.push_str(&format!("{v:e}")),
            _ => out.push_str(number),
        }
        rest = &rest[start + len..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_numbers_are_shown_in_scientific_form_and_the_rest_as_given() {
        let shown =
            |v: f64| compact_numbers(&invalid("sigma", v, "a number in [0, 1]").to_string());
        assert_eq!(shown(1e300), "invalid sigma = 1e300: a number in [0, 1]");
        assert_eq!(
            shown(-2.5e-300),
            "invalid sigma = -2.5e-300: a number in [0, 1]"
        );
        assert_eq!(
            compact_numbers(&format!("{} is past 1e6.", 1e30)),
            "1e30 is past 1e6."
        );
        assert_eq!(
            compact_numbers(&format!(
                "invalid type: floating point `{}`, expected u32",
                1e300
            )),
            "invalid type: floating point `1e300`, expected u32"
        );
        for given in [
            "invalid gbs = 18446744073709551615: a whole number in 1..=65536",
            "line 3, column 8: 1.5.2 and NaN or inf, -1 ... 12.",
            "a-very-long-corpus-name-with-digits-0123",
        ] {
            assert_eq!(compact_numbers(given), given);
        }
    }
}
