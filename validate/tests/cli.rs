//! The `skewsim-validate` binary: clear errors and non-zero exit, never a panic; the trace
//! importer end to end on the committed H200 trace.

use std::process::Command;

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_skewsim-validate"))
        .args(args)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .output()
        .expect("binary runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn gpu_subcommands_fail_cleanly_without_a_driver_or_on_bad_variants() {
    // Without a driver: "no CUDA driver found"; with one, the bad variant is named.
    let (code, _, err) = run(&["check", "--variants", "v9w9"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("no CUDA driver found") || err.contains("kernel variant = v9w9"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn bad_subcommand_and_arguments_are_named() {
    let (code, _, err) = run(&["nope"]);
    assert_eq!(code, 1);
    assert!(err.contains("invalid subcommand = nope"), "{err}");
    let (code, _, err) = run(&["trace", "/nonexistent/trace.json"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("trace FILE = /nonexistent/trace.json"),
        "{err}"
    );
}

#[test]
fn trace_subcommand_lists_the_nine_flash_kernels() {
    let (code, out, err) = run(&["trace", "traces/h200_sdpa_flash_fwd.json"]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "kernel,op,dur_us,input_dims");
    assert_eq!(lines.len(), 10, "{out}");
    assert!(
        lines[1].contains("aten::_flash_attention_forward,33.248,"),
        "{}",
        lines[1]
    );
    assert!(lines[9].contains("[1, 8192, 32, 128]"), "{}", lines[9]);
}
