//! The four-scheme comparison experiments end to end: re-running them reproduces the
//! committed `experiments/results/NAME/` byte for byte (a slice for the larger one), on one
//! thread as on many; the default command prints the four-way table; bad settings are
//! named.

use crate::common::{root, scratch, skewsim_at};
use std::path::{Path, PathBuf};

fn tmp(name: &str) -> PathBuf {
    scratch(&format!("schemes-{name}"))
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Run `experiments/NAME.toml` and compare every output file with the committed one.
fn reproduces(name: &str, threads: Option<&str>) {
    let out = tmp(name);
    let file = root().join(format!("experiments/{name}.toml"));
    let o = skewsim_at(
        &[
            "run",
            file.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
        threads,
        &root(),
    );
    assert!(
        o.status.success(),
        "{name}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    for f in ["summary.md", "points.csv", "plot.svg"] {
        let ours = read(&out.join(f));
        let committed = read(&root().join(format!("experiments/results/{name}/{f}")));
        assert!(
            ours == committed,
            "{name}/{f} differs from the committed result"
        );
    }
    std::fs::remove_dir_all(&out).ok();
}

#[test]
fn four_way_reproduces_on_one_thread() {
    reproduces("four-way", Some("1"));
}

/// The committed four-way plot tells corpora and topologies apart: one panel per
/// (topology, corpus), each with all four schemes (the baseline as its flat line at 1),
/// titled, with axis labels that give units.
#[test]
fn four_way_plot_has_a_panel_per_corpus_and_topology() {
    let svg = read(&root().join("experiments/results/four-way/plot.svg"));
    let panels: Vec<&str> = svg.split("<g transform=\"translate(").skip(1).collect();
    assert_eq!(panels.len(), 4);
    let mut titles = Vec::new();
    for p in &panels {
        let t = p.split("font-size=\"15\">").nth(1).unwrap();
        titles.push(t.split('<').next().unwrap().to_string());
        for s in ["ulysses (baseline = 1)", "wlbllm", "distca", "libra"] {
            assert!(p.contains(&format!("data-series=\"{s}\"")), "{s} missing");
        }
        assert!(p.contains(">GPUs (DP × CP 8; log scale)</text>"));
        assert!(p.contains(">speedup over ulysses (tokens/s ratio, ×)</text>"));
    }
    titles.sort();
    assert_eq!(
        titles,
        [
            "corpus libra-256k · topology nvl72",
            "corpus libra-256k · topology roce",
            "corpus wlbllm · topology nvl72",
            "corpus wlbllm · topology roce",
        ]
    );
    assert!(svg.contains("four-way: speedup over ulysses in training tokens/s"));
}

#[test]
fn attention_microbench_and_distca_4d_reproduce() {
    reproduces("attention-microbench", None);
    reproduces("distca-4d", None);
}

/// Sliding-window layer mixes (model files with an `attention` pattern) reproduce.
#[test]
fn masks_reproduces() {
    reproduces("masks", Some("1"));
}

#[test]
fn four_way_tp_reproduces() {
    reproduces("four-way-tp", None);
}

#[test]
fn megatron_dcp_blog_reproduces() {
    reproduces("megatron-dcp-blog", Some("1"));
}

#[test]
fn a_slice_of_distca_3d_reproduces_its_committed_rows() {
    // llama3-8b, 64 GPUs, 128K only (the first layout): the same rows as the committed
    // points.csv.
    let text = read(&root().join("experiments/distca-3d.toml"));
    let mut parts = text.split("[[sweep.layout]]");
    let sliced = format!(
        "{}[[sweep.layout]]{}",
        parts.next().unwrap(),
        parts.next().unwrap()
    )
    .replace(
        "model = [\"llama3-8b\", \"llama-34b\"]",
        "model = [\"llama3-8b\"]",
    )
    .replace("seq_len = [131072, 524288]", "seq_len = [131072]");
    assert!(sliced.contains("seq_len = 131072\ndp = 4\ncp = 2\nga = 1"));
    assert_ne!(sliced, text, "the slice must change the sweep");
    let dir = tmp("distca-3d-slice");
    // its topology is the built-in dgx-h200-roce, so the file may live anywhere
    let file = dir.join("distca-3d-slice.toml");
    std::fs::write(&file, sliced).unwrap();
    let o = skewsim_at(
        &[
            "run",
            file.to_str().unwrap(),
            "--out",
            dir.to_str().unwrap(),
        ],
        None,
        &root(),
    );
    std::fs::remove_file(&file).ok();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let ours = read(&dir.join("points.csv"));
    let committed = read(&root().join("experiments/results/distca-3d/points.csv"));
    let rows: Vec<&str> = ours.lines().skip(1).collect();
    assert_eq!(rows.len(), 6, "six arms at one point");
    for r in rows {
        assert!(committed.lines().any(|c| c == r), "row not committed: {r}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn default_command_prints_the_four_way_table() {
    let dir = tmp("default");
    let o = skewsim_at(&[], None, &dir);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s = String::from_utf8_lossy(&o.stdout);
    for arm in ["ulysses", "wlbllm", "distca", "libra"] {
        for (dp, gpus) in [(2, 8), (4, 16)] {
            let row = format!("| {dp} | {gpus} | {arm} |");
            assert_eq!(s.matches(&row).count(), 1, "{row}:\n{s}");
        }
    }
    assert!(s.contains("speedup vs ulysses"));
    assert!(dir.join("runs/default/points.csv").exists());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_settings_are_named() {
    let base = read(&root().join("experiments/distca-4d.toml"));
    let cases: &[(&str, &str, &str)] = &[
        ("epsilon = 0.10", "epsilon = -0.5", "epsilon = -0.5"),
        (
            "\"distca:eps=0\"",
            "\"distca:warp\"",
            "invalid tweak = \"warp\"",
        ),
        (
            "\"wlbllm\", \"distca\"",
            "\"pipedream\", \"distca\"",
            "scheme = pipedream",
        ),
        (
            "model = \"llama3-8b\"\nsteps",
            "model = \"llama3-8b\"\nlayers = 99\nsteps",
            "layers = 99",
        ),
        // GA 3 is fine now that DistCA keeps the baseline's GA; GA 0 is not
        ("ga = 8", "ga = 0", "ga = 0: a degree ≥ 1"),
        (
            "topology = \"dgx-h200-roce\"",
            "alpha = 1",
            "unknown field `alpha`",
        ),
        ("topology = \"dgx-h200-roce\"\n", "", "topology is required"),
        (
            "\"distca:eps=0\"",
            "\"wlbllm:cp=0\"",
            "invalid cp = \"0\": a degree ≥ 1",
        ),
        (
            "\"distca:eps=0\"",
            "\"wlbllm:cp=3\"",
            "invalid cp = 3: a divisor of the point's DP × CP = 1 × 2 = 2 ranks",
        ),
        (
            "seq_len = [131072, 524288]",
            "seq_len = [131072]\n[[sweep.layout]]\ndp = 1\ncp = 2\nga = 1",
            "[[sweep.layout]] gives each point its DP",
        ),
        (
            "dp = [1, 8]\nseq_len = [131072, 524288]",
            "seq_len = [131072, 524288]\n[[sweep.layout]]\nmodel = \"llama-34b\"\ndp = 1\ncp = 2\nga = 8",
            "model = \"llama-34b\": one of the file's models",
        ),
    ];
    let dir = tmp("bad");
    for (i, (from, to, want)) in cases.iter().enumerate() {
        assert!(base.contains(from), "{from}");
        let file = dir.join(format!("bad-{i}.toml"));
        std::fs::write(&file, base.replacen(from, to, 1)).unwrap();
        let o = skewsim_at(
            &[
                "run",
                file.to_str().unwrap(),
                "--out",
                dir.to_str().unwrap(),
            ],
            None,
            &root(),
        );
        std::fs::remove_file(&file).ok();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "case {i} succeeded");
        assert!(!err.contains("panicked"), "case {i} panicked: {err}");
        assert!(err.contains(want), "case {i}: {want:?} not in {err}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// `skewsim run --calibration`: a scheme comparison priced by a measured GPU (a calibration
/// fitted here from the committed run-13 H200 measurements) differs from the built-in
/// profile's, says so in its summary, and a kind that prices no GPU work refuses the flag.
/// `--kernel` picks a built-in profile per run: torch-flash is the default.
#[test]
fn a_comparison_runs_under_a_calibration() {
    let dir = tmp("calibrated");
    let cal = dir.join("cal.json");
    let m = root().join("validate/results/plans_run13/measurements_v2.csv");
    let o = skewsim_at(
        &[
            "calibrate",
            "--measurements",
            m.to_str().unwrap(),
            "-o",
            cal.to_str().unwrap(),
        ],
        None,
        &root(),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let file = dir.join("small.toml");
    std::fs::write(
        &file,
        r#"kind = "four-way"
model = "llama3-8b"
layers = 2
arms = ["ulysses", "libra"]
[network]
topology = "dgx-h200-roce"
[parallel]
cp = 4
ga = 2
[workload]
corpus = "wlbllm"
seq_len = 65536
seed = 1
[settings]
pool_size = 2
head_shards = 4
chunks = 2
[sweep]
dp = [2]
"#,
    )
    .unwrap();
    let run_with = |out: &str, cal: Option<&Path>, extra: &[&str]| {
        let out = dir.join(out);
        let mut args = vec![
            "run",
            file.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ];
        if let Some(c) = cal {
            args.extend(["--calibration", c.to_str().unwrap()]);
        }
        args.extend(extra);
        let o = skewsim_at(&args, None, &root());
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        (read(&out.join("points.csv")), read(&out.join("summary.md")))
    };
    let run = |out: &str, cal: Option<&Path>| run_with(out, cal, &[]);
    let (plain, plain_md) = run("plain", None);
    let (calibrated, md) = run("cal", Some(&cal));
    assert_eq!(plain.lines().count(), calibrated.lines().count());
    assert_ne!(plain, calibrated, "the calibration must change the prices");
    assert!(md.contains("Priced by the calibration"), "{md}");
    assert!(!plain_md.contains("Priced by the calibration"));
    // --kernel: torch-flash is the default; skewsim prices otherwise and says so.
    let (flash, flash_md) = run_with("flash", None, &["--kernel", "torch-flash"]);
    assert_eq!(flash, plain);
    assert!(
        flash_md.contains("`torch-flash` kernel profile"),
        "{flash_md}"
    );
    let (own, own_md) = run_with("own", None, &["--kernel", "skewsim"]);
    assert_ne!(own, plain, "the kernel profile must change the prices");
    assert!(own_md.contains("`skewsim` kernel profile"), "{own_md}");
    for (args, want) in [
        (vec!["--kernel", "fa9"], "torch-flash or skewsim"),
        (
            vec![
                "--kernel",
                "skewsim",
                "--calibration",
                cal.to_str().unwrap(),
            ],
            "give one of them",
        ),
    ] {
        let mut a = vec!["run", file.to_str().unwrap()];
        a.extend(args);
        let o = skewsim_at(&a, None, &dir);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(err.contains(want), "{want:?} not in {err}");
    }
    // The H200 calibration README.md points users at: block models of both passes.
    let shipped = root().join("validate/results/plans_run19/cal_h200.json");
    let c = skewsim::cost::Calibration::from_json_str(&read(&shipped), "cal_h200.json").unwrap();
    assert!(c.attn_blocks.is_some() && c.attn_bwd_blocks.is_some());
    let (_, shipped_md) = run("shipped", Some(&shipped));
    assert!(shipped_md.contains("cal_h200.json"), "{shipped_md}");
    // A calibration that does not parse: named.
    std::fs::write(dir.join("bad.json"), "{\"attn_fwd\": 3}").unwrap();
    let o = skewsim_at(
        &[
            "run",
            file.to_str().unwrap(),
            "--calibration",
            dir.join("bad.json").to_str().unwrap(),
        ],
        None,
        &dir,
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("bad.json"), "{err}");
    // A kind that prices nothing refuses the flag.
    let pools = root().join("experiments/libra-fig4.toml");
    let o = skewsim_at(
        &[
            "run",
            pools.to_str().unwrap(),
            "--calibration",
            cal.to_str().unwrap(),
        ],
        None,
        &dir,
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("prices no GPU work"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}
