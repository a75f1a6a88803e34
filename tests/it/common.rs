//! What every end-to-end test needs: run the binary, a scratch folder, and the one
//! `check(args, expected)` helper for data-driven tables of invocations.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository root (experiment files, topologies and committed results live here).
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Run `skewsim args` in `dir`, with `RAYON_NUM_THREADS = threads` when given.
pub fn skewsim_at(args: &[&str], threads: Option<&str>, dir: &Path) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_skewsim"));
    c.args(args).current_dir(dir);
    if let Some(t) = threads {
        c.env("RAYON_NUM_THREADS", t);
    }
    c.output().expect("the skewsim binary runs")
}

/// Run `skewsim args` in the repository root.
pub fn skewsim(args: &[&str]) -> Output {
    skewsim_at(args, None, &root())
}

/// Run `skewsim args` in the repository root with `RAYON_NUM_THREADS = threads`.
pub fn skewsim_threads(args: &[&str], threads: Option<&str>) -> Output {
    skewsim_at(args, threads, &root())
}

/// A scratch folder for `name`, private to this test process (created, never cleared:
/// give each test its own name).
pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir()
        .join(format!("skewsim-it-{}", std::process::id()))
        .join(name);
    std::fs::create_dir_all(&d).expect("a scratch folder");
    d
}

/// What an invocation must do.
pub enum Expect {
    /// Exit 0 and print this on stdout.
    Ok(&'static str),
    /// Exit non-zero (not a panic) and print this on stderr.
    Err(&'static str),
}

/// Run `skewsim args` in the repository root and check it against `expect`.
pub fn check(args: &[&str], expect: Expect) {
    let out = skewsim(args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
    match expect {
        Expect::Ok(want) => {
            assert!(out.status.success(), "{args:?} failed: {stderr}");
            assert!(
                stdout.contains(want),
                "{args:?}: {want:?} not in stdout:\n{stdout}"
            );
        }
        Expect::Err(want) => {
            assert!(!out.status.success(), "{args:?} succeeded: {stdout}");
            assert!(
                stderr.contains(want),
                "{args:?}: {want:?} not in stderr:\n{stderr}"
            );
        }
    }
}

/// `skewsim args` must fail (not panic) with `want` on stderr.
pub fn fails(args: &[&str], want: &'static str) {
    check(args, Expect::Err(want))
}
