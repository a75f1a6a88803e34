//! GPUs as data: a run names its GPU (a topology's `gpu`, `[cluster] gpu`), is priced and
//! memory-checked on it, and its summary says which figures are derived.

use std::path::Path;

use crate::common::{root, scratch, skewsim};

/// A one-node `train` experiment of llama3-8b at CP 8 on `topology`, with `cluster` and
/// `parallel` lines added.
fn experiment(dir: &Path, topology: &str, cluster: &str, parallel: &str) -> String {
    let topo = root().join("topologies").join(topology);
    let text = format!(
        r#"kind = "train"
model = "llama3-8b"
steps = 1

[cluster]
gpus_per_node = 8
nodes = 1
{cluster}

[network]
topology = "{}"
model = "analytical"

[parallel]
dp = 1
pp = 1
cp = 8
ga = 2
recompute = true
{parallel}

[workload]
seed = 1
corpus = "libra-256k"
seq_len = 16384
"#,
        topo.display()
    );
    let f = dir.join("gpu.toml");
    std::fs::write(&f, text).expect("the experiment file");
    f.display().to_string()
}

fn run(file: &str, out: &Path) -> (bool, String, String) {
    let o = skewsim(&["run", file, "--out", out.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!stderr.contains("panicked"), "{stderr}");
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap_or_default();
    (o.status.success(), summary, stderr)
}

#[test]
fn a_topologys_gpu_prices_the_run_and_the_summary_says_so() {
    let d = scratch("gpu-topology");
    let (ok, b200, err) = run(&experiment(&d, "dgx-b200-ib.toml", "", ""), &d.join("b"));
    assert!(ok, "{err}");
    assert!(
        b200.contains("GPU b200") && b200.contains("derived from the H200 measurements"),
        "{b200}"
    );
    // The same run on the H200: no GPU line, and slower.
    let (ok, h200, err) = run(
        &experiment(&d, "dgx-b200-ib.toml", r#"gpu = "h200""#, ""),
        &d.join("h"),
    );
    assert!(ok, "{err}");
    assert!(!h200.contains("GPU h200"), "{h200}");
    let (ok, fp8, err) = run(
        &experiment(&d, "dgx-b200-ib.toml", "", r#"precision = "fp8""#),
        &d.join("f"),
    );
    assert!(ok, "{err}");
    assert!(fp8.contains("Linear layers in FP8"), "{fp8}");
}

#[test]
fn unknown_gpus_and_fp8_without_it_are_refused_by_name() {
    let d = scratch("gpu-errors");
    let (ok, _, err) = run(
        &experiment(&d, "dgx-h200-ib.toml", r#"gpu = "h300""#, ""),
        &d.join("u"),
    );
    assert!(!ok);
    assert!(
        err.contains("[cluster] gpu = h300") && err.contains("b200") && err.contains("gb300"),
        "{err}"
    );
    let (ok, _, err) = run(
        &experiment(
            &d,
            "dgx-h200-ib.toml",
            r#"gpu = "a100""#,
            r#"precision = "fp8""#,
        ),
        &d.join("a"),
    );
    assert!(!ok);
    assert!(
        err.contains("[parallel] precision = fp8") && err.contains("a100"),
        "{err}"
    );
    let (ok, _, err) = run(
        &experiment(&d, "dgx-h200-ib.toml", "", r#"precision = "fp4""#),
        &d.join("p"),
    );
    assert!(!ok);
    assert!(err.contains("fp4"), "{err}");
    // A GPU file by path: its errors name the file and the field.
    let g = d.join("bad.toml");
    let text = std::fs::read_to_string(root().join("gpus/b200.toml")).unwrap();
    std::fs::write(&g, text.replace("sms = 148", "sms = 0")).unwrap();
    let (ok, _, err) = run(
        &experiment(
            &d,
            "dgx-h200-ib.toml",
            &format!("gpu = {:?}", g.display().to_string()),
            "",
        ),
        &d.join("g"),
    );
    assert!(!ok);
    assert!(err.contains("bad.toml: sms = 0"), "{err}");
}
