//! The `skewsim` command line: parses arguments, reads files, calls the library and prints
//! or writes what it returns. The only place `anyhow` is used.

mod cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    match cli::main() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("skewsim: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
