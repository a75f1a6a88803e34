//! Typed errors of the validation crate.

use thiserror::Error;

/// Everything that can go wrong in `validate`.
#[derive(Debug, Error)]
pub enum Error {
    /// No CUDA driver library (libcuda) could be loaded on this machine.
    #[error("no CUDA driver found (libcuda could not be loaded); GPU validation needs an NVIDIA GPU and driver")]
    NoDriver,
    /// The driver loaded but reports no device.
    #[error("CUDA driver found but it reports no GPU device")]
    NoDevice,
    /// NVRTC (libnvrtc) could not be loaded.
    #[error("NVRTC (libnvrtc) not found; run-time kernel compilation needs the CUDA toolkit's libnvrtc on the library path")]
    NoNvrtc,
    /// A CUDA driver call failed.
    #[error("CUDA call `{call}` failed: {msg}")]
    Cuda { call: &'static str, msg: String },
    /// NVRTC rejected a kernel.
    #[error("NVRTC could not compile kernel `{kernel}` with {options:?}: {log}")]
    Compile {
        kernel: String,
        options: Vec<String>,
        log: String,
    },
    /// A parameter is outside its allowed range.
    #[error("invalid {field} = {value}: allowed {allowed}")]
    Invalid {
        field: String,
        value: String,
        allowed: String,
    },
    /// A file could not be parsed.
    #[error("cannot parse {what}: {msg}")]
    Parse { what: String, msg: String },
    /// A correctness check failed (kernel output does not match the reference).
    #[error("check failed: {0}")]
    CheckFailed(String),
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
pub fn parse_error(what: impl Into<String>, msg: impl ToString) -> Error {
    Error::Parse {
        what: what.into(),
        msg: msg.to_string(),
    }
}
