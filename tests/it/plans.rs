//! End to end: `skewsim plan --scheme S ... -o plan.json` then `skewsim check-plan
//! plan.json` for every scheme; all four plans of one step carry the same exact causal
//! FLOP total; bad scheme settings give a named error and a non-zero exit, never a panic.

use crate::common::{scratch, skewsim, skewsim_threads};
use std::path::PathBuf;

fn dir() -> PathBuf {
    scratch("plans")
}

const WORKLOAD: [&str; 10] = [
    "--corpus",
    "wlbllm",
    "--seq-len",
    "16384",
    "--gbs",
    "8",
    "--dp",
    "4",
    "--step",
    "1",
];

/// The FLOPs the verdict line reports ("… 9.2243e12 FLOPs = exact causal total …").
fn verdict_flops(stdout: &str) -> String {
    let i = stdout
        .find(" FLOPs = exact causal total")
        .expect("a verdict line");
    stdout[..i].rsplit(' ').next().unwrap().to_string()
}

#[test]
fn every_scheme_plans_and_checks() {
    let d = dir();
    let mut flops = Vec::new();
    for (scheme, extra) in [
        ("libra", vec!["--cp", "2", "--pool-size", "2"]),
        ("ulysses", vec!["--cp", "4"]),
        ("wlbllm", vec!["--cp", "2", "--sharding", "per-document"]),
        ("wlbllm", vec!["--cp", "4"]),
        // outlier delay on step 1: a different set of samples, so a different total
        (
            "wlbllm",
            vec!["--cp", "2", "--outlier-thresholds", "2048,16384"],
        ),
        ("distca", vec![]),
        ("distca", vec!["--no-ping-pong", "--epsilon", "0.05"]),
        // in-place attention servers on a CP layout
        ("distca", vec!["--cp", "4"]),
    ] {
        let file = d.join(format!("{scheme}-{}.json", extra.len()));
        let file = file.to_string_lossy().into_owned();
        let mut args = vec!["plan", "--scheme", scheme, "-o", &file];
        args.extend(WORKLOAD);
        args.extend(extra.iter().copied());
        let out = skewsim(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {stderr}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains(&format!("{scheme} step 1")), "{stdout}");

        let out = skewsim(&["check-plan", &file]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "check-plan {file}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains(": OK — "), "{stdout}");
        assert!(stdout.contains(&format!("{scheme} step 1")), "{stdout}");
        flops.push(verdict_flops(&stdout));

        // the file says which scheme made it
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(text.contains(&format!("\"scheme\": \"{scheme}\"")));

        // deterministic: the same settings on one thread write the same bytes
        let again = format!("{file}.1");
        let mut args1 = args.clone();
        args1[4] = &again;
        assert!(skewsim_threads(&args1, Some("1")).status.success());
        assert!(
            std::fs::read_to_string(&again).unwrap() == text,
            "{args1:?}"
        );
    }
    // one step, four schemes, the same exact causal total (WLB-LLM: delay off, S_max = 2L,
    // so it trains exactly the step's samples); with outlier delay (the 5th plan) it differs
    let delayed = flops.remove(4);
    assert!(flops.iter().all(|f| f == &flops[0]), "{flops:?}");
    assert_ne!(delayed, flops[0]);
}

/// Another scheme's knobs are named as not read; the plan is the one made without them.
#[test]
fn another_schemes_knobs_are_named() {
    let d = dir();
    let with = d.join("knobs-with.json").to_string_lossy().into_owned();
    let without = d.join("knobs-without.json").to_string_lossy().into_owned();
    let mut args = vec!["plan", "--scheme", "wlbllm", "-o", &with];
    args.extend(WORKLOAD);
    args.extend([
        "--epsilon",
        "0.3",
        "--tile-tokens",
        "512",
        "--sharding",
        "per-document",
    ]);
    let out = skewsim(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("--epsilon, --tile-tokens not read by scheme wlbllm"),
        "{stderr}"
    );
    let mut args = vec!["plan", "--scheme", "wlbllm", "-o", &without];
    args.extend(WORKLOAD);
    args.extend(["--sharding", "per-document"]);
    let out = skewsim(&args);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("not read"));
    assert_eq!(
        std::fs::read(&with).unwrap(),
        std::fs::read(&without).unwrap()
    );
}

#[test]
fn a_tampered_plan_fails_check_plan() {
    let d = dir();
    let file = d.join("tamper.json").to_string_lossy().into_owned();
    let mut args = vec!["plan", "--scheme", "distca", "-o", &file, "--no-ping-pong"];
    args.extend(WORKLOAD);
    assert!(skewsim(&args).status.success());
    // drop every KV transfer: some moved unit no longer gets its keys
    let mut plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let mut dropped = 0;
    for g in plan["groups"].as_array_mut().unwrap() {
        let ts = g["transfers"].as_array_mut().unwrap();
        let before = ts.len();
        ts.retain(|t| t["carries"]["kind"] != "kv");
        dropped += before - ts.len();
    }
    assert!(dropped > 0, "DistCA moved no KV at all on this step");
    std::fs::write(&file, serde_json::to_string(&plan).unwrap()).unwrap();
    let out = skewsim(&["check-plan", &file]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("plan is wrong") && stderr.contains("never reach"),
        "{stderr}"
    );
}

/// A WLB-LLM plan all-gathers KV as one span per (sender, receiver) run: with
/// per-document sharding every rank holds two chunks of every long document, yet the KV
/// transfers number far fewer than the documents. The same plan as format version 1 (an
/// older build's) is refused, naming both versions.
#[test]
fn wlbllm_spans_and_old_format_version() {
    let d = dir();
    let file = d.join("wlb-spans.json").to_string_lossy().into_owned();
    let mut args = vec!["plan", "--scheme", "wlbllm", "-o", &file];
    args.extend(WORKLOAD);
    args.extend(["--cp", "4", "--sharding", "per-document"]);
    let out = skewsim(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&file).unwrap();
    let plan: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(plan["version"], 2);
    for g in plan["groups"].as_array().unwrap() {
        let docs = g["sequences"][0]["samples"].as_array().unwrap().len();
        let kv = g["transfers"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["carries"]["kind"] == "kv")
            .count();
        // one span per (sender, receiver): CP·(CP − 1) = 12 (these documents are all long
        // enough to reach every rank); per piece it was 21 per document (7 layout pieces
        // of a document, each sent to the 3 ranks that do not hold it)
        assert!(kv <= 12 && kv > 0, "{kv} KV transfers, {docs} docs");
    }
    let old = d.join("wlb-v1.json");
    std::fs::write(&old, text.replacen("\"version\": 2", "\"version\": 1", 1)).unwrap();
    let out = skewsim(&["check-plan", old.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("version = 1") && stderr.contains("reads only plan format version 2"),
        "{stderr}"
    );
}

#[test]
fn bad_scheme_settings_are_named() {
    let d = dir();
    let file = d.join("bad.json").to_string_lossy().into_owned();
    for (extra, want) in [
        (vec!["--scheme", "zigzag"], "invalid scheme = zigzag"),
        (vec!["--scheme", "ulysses", "--cp", "5"], "cp = 5"),
        (vec!["--scheme", "ulysses", "--cp", "5"], "32 query heads"),
        (
            vec!["--scheme", "distca", "--epsilon", "-1"],
            "epsilon = -1",
        ),
        (vec!["--scheme", "wlbllm", "--cp", "3"], "cp = 3"),
        (
            vec!["--scheme", "wlbllm", "--sharding", "diagonal"],
            "sharding = diagonal",
        ),
        (vec!["--scheme", "wlbllm", "--s-max", "992"], "s-max = 992"),
        (
            vec!["--scheme", "wlbllm", "--outlier-thresholds", "9,x"],
            "invalid outlier-thresholds = 9,x",
        ),
        (
            vec!["--scheme", "wlbllm", "--outlier-thresholds", "9,4"],
            "outlier-thresholds = [9, 4]",
        ),
        (
            vec!["--scheme", "ulysses", "--pipeline", "x.json"],
            "needs --scheme libra",
        ),
    ] {
        let mut args = vec!["plan", "-o", &file];
        args.extend(WORKLOAD);
        args.extend(extra.iter().copied());
        let out = skewsim(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
        assert!(stderr.contains(want), "{args:?}: {want:?} not in {stderr}");
    }
}
