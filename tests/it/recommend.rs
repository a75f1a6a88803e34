//! `skewsim recommend`: deterministic at any thread count, its one-candidate figures equal
//! `skewsim run`'s for the winner's experiment file, the memory rule removes what cannot
//! fit, and bad input gets a named error.

use crate::common::{fails, root, scratch, skewsim_at};

/// A small search: llama3-8b cut to 2 layers, 8 H200 GPUs, the `wlbllm` corpus at 64K.
const SMALL: &[&str] = &[
    "recommend",
    "--corpus",
    "wlbllm",
    "--gpus",
    "8",
    "--seq-len",
    "65536",
    "--layers",
    "2",
    "--simulate",
    "6",
    "--top",
    "3",
];

fn run_in(name: &str, extra: &[&str], threads: &str) -> (String, std::path::PathBuf) {
    let dir = scratch(name);
    let out = dir.join("out");
    let o = out.to_string_lossy().into_owned();
    let mut args: Vec<&str> = SMALL.to_vec();
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--out", &o]);
    let r = skewsim_at(&args, Some(threads), &root());
    let err = String::from_utf8_lossy(&r.stderr).into_owned();
    assert!(r.status.success(), "{args:?}: {err}");
    (String::from_utf8_lossy(&r.stdout).into_owned(), out)
}

fn csv_rows(dir: &std::path::Path) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(dir.join("recommend.csv")).unwrap();
    text.lines()
        .skip(1)
        .map(|l| l.split(',').map(str::to_string).collect())
        .collect()
}

#[test]
fn recommend_is_byte_identical_at_any_thread_count() {
    let (s1, d1) = run_in("rec-t1", &["--seeds", "2"], "1");
    let (s3, d3) = run_in("rec-t3", &["--seeds", "2"], "3");
    // the same but for the folder it names last
    let body = |s: &str| s.rsplit_once("wrote ").map(|x| x.0.to_string());
    assert_eq!(body(&s1), body(&s3));
    for f in ["summary.md", "recommend.csv", "plot.svg", "winner.toml"] {
        let (a, b) = (
            std::fs::read(d1.join(f)).unwrap(),
            std::fs::read(d3.join(f)).unwrap(),
        );
        assert!(a == b, "{f} differs between 1 and 3 threads");
    }
    assert!(
        s1.contains("| layout |") && s1.contains("**Recommendation.**"),
        "{s1}"
    );
    // every finalist's lower bound is below its simulated iteration (the premise of the
    // `bound` rule), and ranks follow mean tokens/s
    let rows = csv_rows(&d1);
    assert!(!rows.is_empty());
    let mut last = f64::INFINITY;
    for r in &rows {
        let (tps, it, est): (f64, f64, f64) = (
            r[9].parse().unwrap(),
            r[14].parse().unwrap(),
            r[20].parse().unwrap(),
        );
        assert!(est <= it, "{r:?}: lower bound {est} ms > iteration {it} ms");
        assert!(tps <= last, "{r:?} out of order");
        last = tps;
    }
}

/// A search of 16 GPUs (2 layers, 8 simulated, 3 finalists, 2 seeds) prints, to the last
/// bit of every figure, the JSON committed in `tests/it/data/recommend-16.json`: the
/// priced launches, plans and steps the search reuses across candidates and seeds change
/// no figure.
#[test]
fn a_small_search_prints_the_committed_json() {
    let dir = scratch("rec-json");
    let o = dir.join("out").to_string_lossy().into_owned();
    let args = [
        "recommend",
        "--json",
        "--corpus",
        "wlbllm",
        "--gpus",
        "16",
        "--seq-len",
        "65536",
        "--layers",
        "2",
        "--simulate",
        "8",
        "--top",
        "3",
        "--seeds",
        "2",
        "--out",
        &o,
    ];
    let r = skewsim_at(&args, Some("2"), &root());
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let want = std::fs::read_to_string(root().join("tests/it/data/recommend-16.json")).unwrap();
    assert!(
        String::from_utf8_lossy(&r.stdout) == want,
        "the 16-GPU search's JSON differs from tests/it/data/recommend-16.json"
    );
}

#[test]
fn one_candidate_reproduces_skewsim_run() {
    let (summary, dir) = run_in(
        "rec-one",
        &[
            "--schemes",
            "ulysses",
            "--tp",
            "1",
            "--cp",
            "4",
            "--seeds",
            "1",
        ],
        "2",
    );
    assert!(summary.contains("## Pruning (1 candidates)"), "{summary}");
    let rows = csv_rows(&dir);
    assert_eq!(rows.len(), 1, "{rows:?}");
    let winner = dir.join("winner.toml");
    let out = dir.join("run");
    let r = skewsim_at(
        &[
            "run",
            &winner.to_string_lossy(),
            "--out",
            &out.to_string_lossy(),
        ],
        Some("2"),
        &root(),
    );
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let points = std::fs::read_to_string(out.join("points.csv")).unwrap();
    let head: Vec<&str> = points.lines().next().unwrap().split(',').collect();
    let row: Vec<&str> = points.lines().nth(1).unwrap().split(',').collect();
    let col = |name: &str| row[head.iter().position(|h| *h == name).unwrap()];
    // tokens/s and MFU as `skewsim run` prints them
    assert_eq!(col("tokens_per_s"), rows[0][9]);
    assert_eq!(col("mfu"), rows[0][13]);
    assert_eq!(col("arm"), "ulysses");
}

#[test]
fn the_memory_rule_removes_a_layout_that_cannot_fit() {
    // Ulysses at TP 1 on 8 GPUs, all 32 layers: CP 1 needs 52.5 GiB a GPU (ZeRO 3,
    // recomputation: 64K tokens of layer inputs on each rank), CP 2 38.6 GiB; at 45 GiB
    // the memory rule removes exactly the CP 1 layout and the winner runs CP ≥ 2.
    let dir = scratch("rec-mem");
    let o = dir.join("out");
    let r = skewsim_at(
        &[
            "recommend",
            "--corpus",
            "wlbllm",
            "--gpus",
            "8",
            "--seq-len",
            "65536",
            "--schemes",
            "ulysses",
            "--tp",
            "1",
            "--memory-gib",
            "45",
            "--seeds",
            "1",
            "--simulate",
            "2",
            "--top",
            "2",
            "--out",
            &o.to_string_lossy(),
        ],
        Some("2"),
        &root(),
    );
    let out = String::from_utf8_lossy(&r.stdout);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert!(
        out.contains("| memory | a rank's peak memory (cost::memory) exceeds the memory per GPU | 1 | ulysses on TP 1 × CP 1 × DP 8 × PP 1, GA 1: 52.5 GiB per GPU > 45.0 GiB |"),
        "{out}"
    );
    for r in csv_rows(&o) {
        assert_ne!(r[4], "1", "a CP 1 finalist: {r:?}");
        assert!(r[15].parse::<f64>().unwrap() <= 45.0, "{r:?}");
    }
}

#[test]
fn bad_recommend_input_is_named() {
    let base = ["recommend", "--corpus", "wlbllm", "--seq-len", "65536"];
    let with = |extra: &[&'static str]| -> Vec<&'static str> {
        let mut v = base.to_vec();
        v.extend_from_slice(extra);
        v
    };
    fails(&with(&["--gpus", "0"]), "--gpus");
    fails(&with(&["--gpus", "20000"]), "1..=16384");
    fails(&with(&["--gpus", "8", "--seeds", "17"]), "1..=16");
    fails(&with(&["--gpus", "8", "--simulate", "0"]), "--simulate");
    fails(
        &with(&["--gpus", "8", "--schemes", "nope"]),
        "--schemes nope",
    );
    fails(&with(&["--gpus", "8", "--pp", "2"]), "invalid pp = 2");
    fails(
        &with(&["--gpus", "8", "--memory-gib", "-1"]),
        "invalid memory per GPU (GiB) = -1",
    );
    fails(
        &with(&["--gpus", "8", "--memory-gib", "1"]),
        "invalid gpus, memory per GPU = 8: a setting some layout fits; tried",
    );
    fails(
        &with(&["--gpus", "3", "--global-batch", "2", "--schemes", "ulysses"]),
        "DP 3 does not divide the global batch of 2 sequences",
    );
    fails(&with(&["--gpus", "8", "--model", "nosuch"]), "nosuch");
    fails(
        &with(&["--gpus", "8", "--topology", "nosuch.toml"]),
        "nosuch.toml",
    );
}
