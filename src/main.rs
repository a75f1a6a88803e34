//! The `skewsim` command line: parses arguments, reads files, calls the library and prints
//! or writes what it returns. The only place `anyhow` is used.

mod cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    keep_freed_memory();
    match cli::main() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
                "skewsim: error: {}",
                skewsim::error::compact_numbers(&format!("{e:#}"))
            );
            ExitCode::FAILURE
        }
    }
}

/// glibc's allocator keeps freed memory for the next allocation instead of handing it back:
/// large blocks come from the heap, not from a fresh mapping each, and free space at the
/// heap's top is not trimmed. A run builds, times and drops large graphs one after another;
/// from fresh mappings the kernel would fault in and zero every page of each again.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn keep_freed_memory() {
    // SAFETY: `mallopt` only sets allocator parameters; it runs before any other thread.
    unsafe {
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, libc::c_int::MAX);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn keep_freed_memory() {}
