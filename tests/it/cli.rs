//! End-to-end checks of the `skewsim` binary: one data-driven table of invocations, each
//! with the exit status and a piece of text it must print. Bad input must give a clear
//! message and a non-zero exit, never a panic.

use crate::common::{check, scratch, skewsim, skewsim_at, skewsim_threads, Expect};

#[test]
fn corpus_command() {
    use Expect::*;
    let dir = scratch("cli-corpus");
    let file = |name: &str, body: &str| {
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        p.to_string_lossy().into_owned()
    };
    let empty = file("empty.txt", "\n");
    let words = file("words.txt", "12\nabc\n");
    let negative = file("neg.json", "[5, -2]");
    let good = file("good.csv", "id,length\n1,100\n2,300\n");
    let cases: Vec<(Vec<&str>, Expect)> = vec![
        (
            vec!["corpus", "wlbllm", "--sequences", "8"],
            Ok("documents       99519"),
        ),
        (
            vec!["corpus", &good, "--seq-len", "400"],
            Ok("max      300"),
        ),
        (
            vec![
                "corpus",
                "fixed:100",
                "--seq-len",
                "1000",
                "--sequences",
                "4",
            ],
            Ok("CV 0.000"),
        ),
        (vec!["corpus", "nosuch"], Err("invalid corpus = nosuch")),
        (vec!["corpus", "missing.json"], Err("does not exist")),
        (vec!["corpus", &empty], Err("no document lengths")),
        (
            vec!["corpus", &words],
            Err("line 2: \"abc\" is not an integer"),
        ),
        (vec!["corpus", &negative], Err("item 1: length -2")),
        (vec!["corpus", "fixed:0"], Err("invalid fixed len = 0")),
        (vec!["corpus", "0*fixed:1+0*fixed:2"], Err("sum to 1")),
        (
            vec!["corpus", "0.7*fixed:1+0.7*fixed:2"],
            Err("invalid corpus mixture weights = sum 1.4"),
        ),
        (
            vec!["corpus", "wlbllm", "--seq-len", "0"],
            Err("0 is not a whole number in 1..=16777216"),
        ),
        (
            vec!["corpus", "wlbllm", "--packing", "greedy"],
            Err("invalid packing = greedy"),
        ),
    ];
    for (args, expect) in cases {
        check(&args, expect);
    }
}

#[test]
fn corpus_json_is_machine_readable_and_deterministic() {
    let run = || {
        skewsim(&[
            "corpus",
            "libra-256k",
            "--json",
            "--sequences",
            "64",
            "--samples",
            "5000",
        ])
    };
    let a = run();
    assert!(a.status.success());
    let v: serde_json::Value = serde_json::from_slice(&a.stdout).expect("valid JSON");
    assert_eq!(v["documents"]["count"], 5000);
    assert_eq!(v["packed"]["sequences"], 64);
    assert_eq!(a.stdout, run().stdout, "same seed, same bytes");
}

/// A small `train` experiment: 2 nodes, Ulysses CP 8 × DP 2, GA 2, libra-256k at 32K
/// tokens, with runtime variance and the flow network, so every random stream and the
/// network model are exercised.
const TRAIN: &str = r#"
kind = "train"
model = "qwen3-30b-a3b"
steps = 2
[cluster]
gpus_per_node = 8
nodes = 2
[network]
topology = "dgx-h200-roce"
model = "flow"
[variance]
persistent = { dist = "lognormal", sigma = 0.01 }
jitter = { dist = "lognormal", sigma = 0.01 }
[parallel]
dp = 2
pp = 1
cp = 8
ga = 2
[workload]
seq_len = 32768
seed = 3
corpus = "libra-256k"
[output]
trace_gpus = 0
"#;

fn run_train(dir: &std::path::Path, threads: &str, body: &str) -> std::process::Output {
    std::fs::create_dir_all(dir).unwrap();
    let file = dir.join("train.toml");
    std::fs::write(&file, body).unwrap();
    let out_dir = dir.join("out");
    skewsim_threads(
        &[
            "run",
            &file.to_string_lossy(),
            "--out",
            &out_dir.to_string_lossy(),
        ],
        Some(threads),
    )
}

/// `[network] nvls = false` runs the DP all-reduce of one 8-GPU node as NCCL's ring instead
/// of NVLS (a different step time); a value that is not a boolean is named.
#[test]
fn nvls_switch_changes_the_dp_all_reduce() {
    let base = scratch("cli-nvls");
    let body = TRAIN
        .replace("nodes = 2", "nodes = 1")
        .replace("model = \"flow\"", "model = \"analytical\"")
        .replace("dp = 2\npp = 1\ncp = 8", "dp = 2\npp = 1\ncp = 4");
    let steps = |name: &str, body: &str| {
        let dir = base.join(name);
        let out = run_train(&dir, "1", body);
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).to_string(),
            dir,
        )
    };
    let (ok, err, on) = steps("on", &body);
    assert!(ok, "{err}");
    let off_body = body.replace(
        "model = \"analytical\"",
        "model = \"analytical\"\nnvls = false",
    );
    let (ok, err, off) = steps("off", &off_body);
    assert!(ok, "{err}");
    let read = |d: &std::path::Path| std::fs::read_to_string(d.join("out/steps.csv")).unwrap();
    assert_ne!(
        read(&on),
        read(&off),
        "NVLS on and off price the step alike"
    );
    let bad = body.replace(
        "model = \"analytical\"",
        "model = \"analytical\"\nnvls = \"no\"",
    );
    let (ok, err, _) = steps("bad", &bad);
    assert!(
        !ok && err.contains("nvls") && !err.contains("panicked"),
        "{err}"
    );
}

#[test]
fn train_runs_are_byte_identical_across_runs_and_thread_counts() {
    let base = scratch("cli-train");
    let runs: Vec<_> = [("a", "1"), ("b", "2"), ("c", "1")]
        .iter()
        .map(|(name, threads)| {
            let dir = base.join(name);
            let out = run_train(&dir, threads, TRAIN);
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            dir.join("out")
        })
        .collect();
    for file in ["steps.csv", "gpus.csv", "microbatches.csv", "trace.json"] {
        let first = std::fs::read(runs[0].join(file)).unwrap();
        assert!(!first.is_empty(), "{file} is empty");
        for other in &runs[1..] {
            assert_eq!(
                first,
                std::fs::read(other.join(file)).unwrap(),
                "{file} differs"
            );
        }
    }
}

#[test]
fn bad_train_files_name_the_field() {
    let base = scratch("cli-badtrain");
    let cases = [
        (
            "cp = 8",
            "cp = 3",
            "a divisor of the model's 32 query heads",
        ),
        ("nodes = 2", "nodes = 0", "nodes"),
        ("seq_len = 32768", "seq_len = 0", "seq_len"),
        (
            "corpus = \"libra-256k\"",
            "corpus = \"nope\"",
            "invalid corpus = nope",
        ),
        ("steps = 2", "steps = 2\nbogus = 1", "bogus"),
    ];
    // These cases leave the layout's coverage of the cluster aside.
    let subset = TRAIN.replace("nodes = 2", "nodes = 2\nallow_subset = true");
    for (i, (from, to, want)) in cases.iter().enumerate() {
        let out = run_train(&base.join(i.to_string()), "1", &subset.replace(from, to));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{to}: accepted");
        assert!(!stderr.contains("panicked"), "{to}: panicked: {stderr}");
        assert!(stderr.contains(want), "{to}: {want:?} not in {stderr}");
    }
}

/// The layout must cover the stated cluster: TP × CP × DP × PP = 8 of its 16 GPUs is refused
/// with the DP that would cover it and the option that allows a subset, which then runs;
/// more GPUs than the cluster has are refused even with the option.
#[test]
fn a_layout_must_cover_the_cluster_unless_a_subset_is_allowed() {
    let base = scratch("cli-cover");
    let half = TRAIN.replace("dp = 2\npp = 1", "dp = 1\npp = 1");
    let out = run_train(&base.join("half"), "1", &half);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a layout of 8 of 16 GPUs was accepted"
    );
    for want in [
        "tp × cp × dp × pp = 1 × 8 × 1 × 1 = 8 GPUs",
        "[cluster] has 2 nodes × 8 = 16",
        "exactly 16 GPUs (dp = 2 at this TP, CP and PP)",
        "allow_subset = true",
    ] {
        assert!(err.contains(want), "{want:?} not in {err}");
    }
    let allowed = half.replace("nodes = 2", "nodes = 2\nallow_subset = true");
    let out = run_train(&base.join("subset"), "1", &allowed);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let over = allowed.replace("dp = 1\npp = 1", "dp = 4\npp = 1");
    let out = run_train(&base.join("over"), "1", &over);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && !err.contains("panicked"), "{err}");
    assert!(
        err.contains("= 32 GPUs") && err.contains("dp = 2") && !err.contains("allow_subset"),
        "{err}"
    );
    // A sweep is checked point by point.
    let sweep = format!("{TRAIN}[sweep]\ndp = [1, 2]\ngbs = [4]\n");
    let out = run_train(&base.join("sweep"), "1", &sweep);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("1 × 8 × 1 × 1 = 8 GPUs"),
        "{err}"
    );
}

#[test]
fn default_job_runs() {
    let out = skewsim_at(&["--json"], None, &scratch("cli-default"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
