//! End-to-end checks of `skewsim pools`, `skewsim theory` and the `pools` experiments:
//! bad input gives a named error and a non-zero exit (no panic); output is byte-identical
//! whatever RAYON_NUM_THREADS; `--assignment` is a valid grouping that keeps the step's
//! multiset of samples; re-running an experiment reproduces its committed table.

use crate::common::{fails, scratch, skewsim, skewsim_threads};
use std::collections::BTreeMap;
use std::path::PathBuf;

fn tmp(name: &str) -> PathBuf {
    scratch(&format!("pools-{name}"))
}

#[test]
fn bad_input_is_named() {
    let out = tmp("bad");
    let o = out.to_str().unwrap();
    let base = |extra: &[&'static str]| -> Vec<String> {
        let mut v: Vec<String> = ["pools", "--corpus", "fixed:1000", "--out", o]
            .iter()
            .map(|s| s.to_string())
            .collect();
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let cases: Vec<(Vec<String>, &str)> = vec![
        (base(&["--gbs", "12", "--pool-sizes", "8"]), "P = 8 does not divide --gbs = 12"),
        (base(&["--pool-sizes", "0"]), "P = 0"),
        (base(&["--policies", "random,fastest"]), "invalid policy = \"fastest\": one of: random, production, zigzag, zigzag-swap, vrsp, lpt"),
        (base(&["--gbs", "0"]), "'--gbs <GBS>': 0 is not a whole number in 1..=65536"),
        (base(&["--gbs", "65537"]), "'--gbs <GBS>': 65537 is not a whole number in 1..=65536"),
        (base(&["--trials", "0"]), "'--trials <TRIALS>': 0 is not a whole number in 1..=1048576"),
        (base(&["--trials", "999999999999"]), "999999999999 is not a whole number in 1..=1048576"),
        (vec!["theory".into(), "--corpus".into(), "fixed:10".into(), "--trials".into(), "1048577".into()], "1048577 is not a whole number in 1..=1048576"),
        // one-token documents packed into 1M-token sequences: 200 × 128 × 1M documents
        (vec!["pools".into(), "--corpus".into(), "fixed:1".into(), "--seq-len".into(), "1048576".into(), "--out".into(), o.into()], "invalid --trials = 200: 200 trials of 128 sequences of L = 1048576 tokens from fixed:1 would draw ~2.68e10 documents; at most 8.59e9"),
        (vec!["--max-memory".into(), "64M".into(), "theory".into(), "--corpus".into(), "fixed:1".into(), "--seq-len".into(), "65536".into(), "--trials".into(), "10".into()], "--trials 10 of --gbs 128 needs ~"),
        (base(&["--seq-len", "0"]), "0 is not a whole number in 1..=16777216"),
        (base(&["--packing", "tight"]), "invalid packing = tight"),
        (vec!["pools".into(), "--corpus".into(), "no-such-corpus".into(), "--out".into(), o.into()], "no-such-corpus"),
        (vec!["pools".into(), "--corpus".into(), "wlbllm".into(), "--packed".into(), "x.json".into()], "cannot be used with"),
        (vec!["theory".into(), "--corpus".into(), "fixed:10".into(), "--seq-len".into(), "100".into(), "--gbs".into(), "10".into(), "--pool-sizes".into(), "4".into()], "P = 4 does not divide --gbs = 10"),
        (vec!["theory".into(), "--corpus".into(), "fixed:10".into(), "--target".into(), "-1".into()], "--target = -1"),
        (vec!["theory".into(), "--corpus".into(), "fixed:10".into(), "--mask".into(), "sliding:0".into()], "invalid --mask = \"sliding:0\": the window W must be an integer >= 1"),
        (vec!["theory".into(), "--corpus".into(), "fixed:10".into(), "--seq-len".into(), "100".into(), "--mask".into(), "chunked:200".into()], "invalid --mask = chunked:200: a chunk C no larger than the sequence length L = 100"),
        (vec!["bench".into(), "no-such-arm".into()], "unknown bench arm = \"no-such-arm\" (one of: vrsp-1m, fig8"),
    ];
    for (args, want) in cases {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        fails(&a, want);
    }
    // A bad --packed file: a zero-length sample, named by position.
    let f = out.join("zero.json");
    std::fs::write(&f, "[[5, 3], [4, 0]]").unwrap();
    fails(
        &[
            "pools",
            "--packed",
            f.to_str().unwrap(),
            "--gbs",
            "2",
            "--pool-sizes",
            "1",
            "--out",
            o,
        ],
        "sequence 1, sample 1: invalid length = 0",
    );
    let f = out.join("words.json");
    std::fs::write(&f, "[[5, \"x\"]]").unwrap();
    fails(
        &[
            "pools",
            "--packed",
            f.to_str().unwrap(),
            "--gbs",
            "1",
            "--pool-sizes",
            "1",
            "--out",
            o,
        ],
        "expected a JSON list of lists of sample lengths",
    );
}

#[test]
fn same_seed_same_bytes_whatever_the_thread_count() {
    let out = tmp("det");
    for cmd in [
        vec![
            "pools",
            "--corpus",
            "libra-256k",
            "--gbs",
            "64",
            "--pool-sizes",
            "4,8,16",
            "--policies",
            "random,production,zigzag-swap,vrsp",
            "--trials",
            "24",
            "--seed",
            "7",
            "--json",
        ],
        vec![
            "theory",
            "--corpus",
            "wlbllm",
            "--gbs",
            "64",
            "--pool-sizes",
            "4,8,16",
            "--trials",
            "24",
            "--seed",
            "7",
            "--json",
        ],
    ] {
        let mut args = cmd.clone();
        let o = out.join(cmd[0]);
        if cmd[0] == "pools" {
            args.extend(["--out", o.to_str().unwrap()]);
        }
        let one = skewsim_threads(&args, Some("1"));
        let four = skewsim_threads(&args, Some("4"));
        let dflt = skewsim(&args);
        assert!(
            one.status.success(),
            "{}",
            String::from_utf8_lossy(&one.stderr)
        );
        assert_eq!(
            one.stdout, four.stdout,
            "{} differs between 1 and 4 threads",
            cmd[0]
        );
        assert_eq!(
            one.stdout, dflt.stdout,
            "{} differs between 1 thread and default",
            cmd[0]
        );
        // A different seed gives different numbers (the comparison can fail).
        let mut other = args.clone();
        let i = other.iter().position(|a| *a == "7").unwrap();
        other[i] = "8";
        assert_ne!(skewsim(&other).stdout, one.stdout);
        // JSON parses and has the rows.
        let v: serde_json::Value = serde_json::from_slice(&one.stdout).unwrap();
        assert_eq!(
            v["rows"].as_array().unwrap().len(),
            if cmd[0] == "pools" { 12 } else { 3 }
        );
    }
}

#[test]
fn assignment_is_a_valid_grouping_that_keeps_the_samples() {
    let dir = tmp("assign");
    // 8 packed sequences (loads 25, 64, 1, 100, 9, 50, 4, 16), then a 9th the batch ignores.
    let packed: Vec<Vec<u32>> = vec![
        vec![3, 4],
        vec![8],
        vec![1],
        vec![6, 8],
        vec![3],
        vec![5, 5],
        vec![2],
        vec![4],
        vec![100],
    ];
    let f = dir.join("packed.json");
    std::fs::write(&f, serde_json::to_string(&packed).unwrap()).unwrap();
    let a = dir.join("out.json");
    let out = skewsim(&[
        "pools",
        "--packed",
        f.to_str().unwrap(),
        "--gbs",
        "8",
        "--pool-sizes",
        "2,4",
        "--policies",
        "random,production,zigzag,zigzag-swap,vrsp",
        "--trials",
        "3",
        "--seed",
        "1",
        "--assignment",
        a.to_str().unwrap(),
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&a).unwrap()).unwrap();
    let entries = v.as_array().unwrap();
    assert_eq!(entries.len(), 2 * 5);
    let multiset = |ix: &[usize]| {
        let mut m: Vec<u32> = ix.iter().flat_map(|&i| packed[i].clone()).collect();
        m.sort();
        m
    };
    let all: Vec<usize> = (0..8).collect();
    for e in entries {
        let p = e["pool_size"].as_u64().unwrap() as usize;
        let pools: Vec<Vec<usize>> = serde_json::from_value(e["pools"].clone()).unwrap();
        assert_eq!(pools.len(), 8 / p, "{e}");
        assert!(pools.iter().all(|q| q.len() == p), "{e}");
        let mut seen: Vec<usize> = pools.iter().flatten().copied().collect();
        seen.sort();
        assert_eq!(seen, all, "each of the first D sequences exactly once: {e}");
        assert_eq!(
            multiset(&seen),
            multiset(&all),
            "the step's samples are kept"
        );
    }
    // VRSP at P = 4 by hand: loads 25, 64, 1, 100, 9, 50, 4, 16; order 3(100), 1(64),
    // 5(50), 0(25), 7(16), 4(9), 6(4), 2(1). 3 → pool 0 (100); 1 → pool 1 (64);
    // 5 → pool 1 (114); 0 → pool 0 (125); 7 → pool 1 (130); 4 → pool 0 (134);
    // 6 → pool 1 (134), full; 2 → pool 0 (135).
    let vrsp4 = entries
        .iter()
        .find(|e| e["pool_size"] == 4 && e["policy"] == "vrsp")
        .unwrap();
    assert_eq!(
        vrsp4["pools"],
        serde_json::json!([[3, 0, 4, 2], [1, 5, 7, 6]])
    );
    // The CSV and SVG were written.
    let csv = std::fs::read_to_string(dir.join("pools.csv")).unwrap();
    assert!(csv.starts_with("P,K,policy,mean_R-1"), "{csv}");
    assert_eq!(csv.lines().count(), 1 + 2 * 5);
    let svg = std::fs::read_to_string(dir.join("pools.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    // R − 1 of VRSP at P = 4 is 135/(269/2) − 1 in every trial (deterministic policy).
    let want = 135.0 * 2.0 / 269.0 - 1.0;
    let row = csv.lines().find(|l| l.starts_with("4,2,vrsp,")).unwrap();
    let mean: f64 = row.split(',').nth(3).unwrap().parse().unwrap();
    assert!((mean - want).abs() < 1e-3 * want, "{row} vs {want}");
}

/// Rows of a results.csv keyed by (corpus, gbs, pool_size, policy).
fn rows(text: &str) -> BTreeMap<(String, String, String, String), String> {
    text.lines()
        .skip(1)
        .map(|l| {
            let c: Vec<&str> = l.split(',').collect();
            (
                (c[0].into(), c[2].into(), c[3].into(), c[5].into()),
                l.to_string(),
            )
        })
        .collect()
}

/// Re-runs `experiments/NAME.toml` for one corpus and checks every row it produces against
/// the committed `experiments/results/NAME/results.csv`, byte for byte.
fn reproduces(name: &str, corpus: &str) {
    let root = crate::common::root();
    let text = std::fs::read_to_string(root.join(format!("experiments/{name}.toml"))).unwrap();
    let mut doc: toml::Table = toml::from_str(&text).unwrap();
    let corpora = doc["corpus"].as_array().unwrap().clone();
    let kept: Vec<toml::Value> = corpora
        .into_iter()
        .filter(|c| c["name"].as_str() == Some(corpus))
        .collect();
    assert_eq!(kept.len(), 1, "{name} lists {corpus}");
    doc.insert("corpus".into(), toml::Value::Array(kept));
    // the paper's figures for the other corpora name corpora the file no longer lists
    if let Some(paper) = doc.get("paper").and_then(toml::Value::as_array) {
        let mine: Vec<toml::Value> = paper
            .iter()
            .filter(|p| p["corpus"].as_str() == Some(corpus))
            .cloned()
            .collect();
        doc.insert("paper".into(), toml::Value::Array(mine));
    }
    let dir = tmp(&format!("exp-{name}"));
    let file = dir.join(format!("{name}.toml"));
    std::fs::write(&file, toml::to_string(&doc).unwrap()).unwrap();
    let out_dir = dir.join("out");
    let out = skewsim(&[
        "run",
        file.to_str().unwrap(),
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ours = rows(&std::fs::read_to_string(out_dir.join("results.csv")).unwrap());
    let committed = rows(
        &std::fs::read_to_string(root.join(format!("experiments/results/{name}/results.csv")))
            .unwrap(),
    );
    assert!(!ours.is_empty());
    for (k, line) in &ours {
        assert_eq!(
            committed.get(k),
            Some(line),
            "{name}: row {k:?} differs from the committed table"
        );
    }
    // The summary's table for this corpus is the committed one too.
    let summary = std::fs::read_to_string(out_dir.join("summary.md")).unwrap();
    let committed_summary =
        std::fs::read_to_string(root.join(format!("experiments/results/{name}/summary.md")))
            .unwrap();
    let section = |s: &str| -> String {
        let start = s.find(&format!("## {corpus}\n")).expect("corpus section");
        let rest = &s[start..];
        let end = rest[3..].find("\n## ").map_or(rest.len(), |e| e + 3);
        rest[..end].to_string()
    };
    assert_eq!(
        section(&summary),
        section(&committed_summary),
        "{name}: {corpus} section"
    );
}

#[test]
fn experiments_reproduce_their_committed_tables() {
    // wlbllm is the real trace (the cheapest corpus to re-run); libra-256k exercises a
    // fitted corpus in Fig. 4.
    reproduces("libra-fig8", "wlbllm");
    reproduces("libra-table1", "wlbllm");
    reproduces("libra-fig4", "libra-256k");
}

/// `theory --mask`: a sliding window caps each document's load near ℓ·W, so the per-sequence
/// load varies less than Σℓ² does and the LLN bound at the same P is smaller.
#[test]
fn theory_under_a_sliding_window_has_a_smaller_cv() {
    let run = |mask: &str| -> serde_json::Value {
        let o = skewsim(&[
            "theory",
            "--corpus",
            "wlbllm",
            "--gbs",
            "32",
            "--pool-sizes",
            "4",
            "--trials",
            "4",
            "--seed",
            "3",
            "--json",
            "--mask",
            mask,
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let causal = run("causal");
    let window = run("sliding:4096");
    assert!(causal.get("mask").is_none());
    assert_eq!(window["mask"], "sliding:4096");
    let cv = |v: &serde_json::Value| v["load"]["cv"].as_f64().unwrap();
    let bound = |v: &serde_json::Value| v["rows"][0]["bound"].as_f64().unwrap();
    assert!(
        cv(&window) < cv(&causal),
        "{} vs {}",
        cv(&window),
        cv(&causal)
    );
    assert!(bound(&window) < bound(&causal));
}
