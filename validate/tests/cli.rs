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

#[test]
fn jitter_fit_reads_the_two_gpu_run_and_estimates_the_persistent_sigma() {
    let file = "validate/results/run9_jitter_raw.csv";
    let (code, out, err) = run(&["jitter-fit", file]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out.lines().filter(|l| l.starts_with("validate/")).count(),
        8,
        "{out}"
    );
    // Independent check of one persistent σ: |ln(m1/m0)|/√2 from the medians of the 300
    // launches per GPU at 32 heads × 4,096 tokens.
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/results/run9_jitter_raw.csv"
    ))
    .expect("committed results");
    let mut per_gpu = [Vec::new(), Vec::new()];
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        if f[2] == "32" && f[3] == "4096" {
            per_gpu[f[0].parse::<usize>().expect("device")].push(f[5].parse::<f64>().expect("ms"));
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v[149] + v[150]) / 2.0
    };
    let (m0, m1) = (median(&mut per_gpu[0]), median(&mut per_gpu[1]));
    let want = (m1 / m0).ln().abs() / 2f64.sqrt();
    let line = out
        .lines()
        .find(|l| l.contains("heads 32 doc_len 4096: persistent sigma"))
        .expect("persistent line");
    let got: f64 = line
        .rsplit(' ')
        .next()
        .and_then(|x| x.parse().ok())
        .expect("number");
    assert!((got - want).abs() < 5e-5, "{got} vs {want}");
}
