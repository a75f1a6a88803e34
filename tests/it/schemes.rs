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

/// The arguments of `skewsim run FILE --out OUT`.
fn run_args<'a>(file: &'a Path, out: &'a Path) -> Vec<&'a str> {
    vec![
        "run",
        file.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]
}

/// `skewsim run FILE --out OUT` on `threads` threads (None: the default), which must succeed.
fn run_into(file: &Path, out: &Path, threads: Option<&str>) {
    let o = skewsim_at(&run_args(file, out), threads, &root());
    assert!(
        o.status.success(),
        "{}: {}",
        file.display(),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Run `experiments/NAME.toml` and compare every output file with the committed one.
fn reproduces(name: &str, threads: Option<&str>) {
    let out = tmp(name);
    run_into(
        &root().join(format!("experiments/{name}.toml")),
        &out,
        threads,
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
fn distca_4d_reproduces() {
    reproduces("distca-4d", None);
}

/// Run `sliced` (a slice of `experiments/NAME.toml`; its topology is the built-in
/// dgx-h200-roce, so the file may live anywhere) and check that it gives `rows` rows, each
/// one of the committed `experiments/results/NAME/points.csv`.
fn slice_reproduces_committed_rows(name: &str, sliced: &str, rows: usize) {
    let dir = tmp(&format!("{name}-slice"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(format!("{name}-slice.toml"));
    std::fs::write(&file, sliced).unwrap();
    run_into(&file, &dir, None);
    let ours = read(&dir.join("points.csv"));
    let committed = read(&root().join(format!("experiments/results/{name}/points.csv")));
    let got: Vec<&str> = ours.lines().skip(1).collect();
    assert_eq!(got.len(), rows, "{ours}");
    for r in got {
        assert!(committed.lines().any(|c| c == r), "row not committed: {r}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// The 256K half of attention-microbench (all nine arms, its ablations included)
/// reproduces the committed rows; the 1M half is the same code on a longer corpus and
/// minutes more of simulation.
#[test]
fn a_slice_of_attention_microbench_reproduces_its_committed_rows() {
    let text = read(&root().join("experiments/attention-microbench.toml"));
    let sliced = text.replace(
        "corpus = [\"libra-256k\", \"libra-1m\"]",
        "corpus = [\"libra-256k\"]",
    );
    assert_ne!(sliced, text, "the slice must change the sweep");
    slice_reproduces_committed_rows("attention-microbench", &sliced, 9);
}

/// Sliding-window layer mixes (model files with an `attention` pattern) reproduce.
#[test]
fn masks_reproduces() {
    reproduces("masks", Some("1"));
}

/// The share of sliding-window layers × W as a sweep axis (`[sweep.attention]`) reproduces.
#[test]
fn masks_share_reproduces() {
    reproduces("masks-share", None);
}

/// A causal model gives today's results byte for byte when its all-causal pattern is given
/// explicitly (the share-0 mix): its rows are the masks experiment's llama3-8b rows (the
/// same settings), figure for figure.
#[test]
fn an_explicit_causal_pattern_gives_the_causal_models_rows() {
    let share = read(&root().join("experiments/results/masks-share/points.csv"));
    let masks = read(&root().join("experiments/results/masks/points.csv"));
    let rows: Vec<String> = share
        .lines()
        .filter_map(|l| l.strip_prefix("llama3-8b · causal,"))
        .map(|l| format!("llama3-8b,{l}"))
        .collect();
    assert_eq!(rows.len(), 10, "{share}");
    for r in &rows {
        assert!(masks.lines().any(|m| m == r), "not a masks row: {r}");
    }
}

/// The committed masks-share plot has the share on its x axis: per corpus a skew panel and
/// one panel per balancing scheme, each with one line per W (and the baseline's flat line).
#[test]
fn masks_share_plot_is_against_the_share() {
    let svg = read(&root().join("experiments/results/masks-share/plot.svg"));
    let panels: Vec<&str> = svg.split("<g transform=\"translate(").skip(1).collect();
    assert_eq!(panels.len(), 10);
    for p in &panels {
        assert!(p.contains(">share of sliding-window layers</text>"));
        for w in ["W = 4K", "W = 16K", "W = 64K"] {
            assert!(p.contains(&format!("data-series=\"{w}\"")), "{w} missing");
        }
    }
    let skew = panels
        .iter()
        .filter(|p| p.contains(">CV of per-sequence load</text>"));
    assert_eq!(skew.count(), 2);
    let base = panels
        .iter()
        .filter(|p| p.contains("data-series=\"ulysses (baseline = 1)\""));
    assert_eq!(base.count(), 8);
}

/// Bad `[sweep.attention]` input is refused by name: W ≤ 0, a share that is not a whole
/// number of the pattern's layers, a period that does not tile the layers, a model that
/// has its own pattern.
#[test]
fn bad_attention_sweeps_are_named() {
    let d = tmp("bad-attention");
    std::fs::create_dir_all(&d).unwrap();
    let text = read(&root().join("experiments/masks-share.toml"));
    let own = root().join("experiments/masks/llama3-8b-swa4k-50.toml");
    let own = format!("model = {:?}", own.to_str().unwrap());
    for (i, (from, to, want)) in [
        (
            "window = [4096, 16384, 65536]",
            "window = [0]",
            "invalid [sweep.attention] window = 0: a window W ≥ 1 keys",
        ),
        (
            "window = [4096, 16384, 65536]",
            "window = [-4096]",
            "invalid [sweep.attention] window = -4096",
        ),
        (
            "sliding_share = [0.0, 0.25, 0.5, 0.75, 1.0]",
            "sliding_share = [0.3]",
            "invalid [sweep.attention] sliding_share = 0.3: a share in 0..=1 that is a whole \
             number of the pattern's 4 layers",
        ),
        (
            "window = [4096, 16384, 65536]",
            "window = [4096]\nperiod = 3",
            "invalid [sweep.attention] period = 3: a number of layers ≥ 1 that divides the 4",
        ),
        (
            "model = \"llama3-8b\"",
            own.as_str(),
            "invalid [sweep.attention] model = ",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        assert!(text.contains(from), "{from}");
        let f = d.join(format!("bad-{i}.toml"));
        std::fs::write(&f, text.replacen(from, to, 1)).unwrap();
        let out = d.join("out");
        crate::common::fails(&run_args(&f, &out), want);
    }
    std::fs::remove_dir_all(&d).ok();
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
    // six arms at one point
    slice_reproduces_committed_rows("distca-3d", &sliced, 6);
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
            "tweak = \"warp\": a tweak distca takes",
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
        // a zero degree is refused by name
        ("ga = 8", "ga = 0", "ga = 0: a degree ≥ 1"),
        (
            "topology = \"dgx-h200-roce\"",
            "alpha = 1",
            "unknown field `alpha`",
        ),
        ("topology = \"dgx-h200-roce\"\n", "", "[network] topology = none"),
        (
            "\"distca:eps=0\"",
            "\"wlbllm:cp=0\"",
            "arms \"wlbllm:cp=0\" cp = 0: a degree ≥ 1",
        ),
        (
            "\"distca:eps=0\"",
            "\"wlbllm:cp=3\"",
            "cp = 3: a divisor of the point's DP × CP = 1 × 2 = 2 ranks",
        ),
        (
            "seq_len = [131072, 524288]",
            "seq_len = [131072]\n[[sweep.layout]]\ndp = 1\ncp = 2\nga = 1",
            "[[sweep.layout]] gives each point its DP",
        ),
        (
            "dp = [1, 8]\nseq_len = [131072, 524288]",
            "seq_len = [131072, 524288]\n[[sweep.layout]]\nmodel = \"llama-34b\"\ndp = 1\ncp = 2\nga = 8",
            "[[sweep.layout]] #1 model = \"llama-34b\": one of the file's models",
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
/// fitted here from the committed H200 measurements in `validate/results/plans_run13/`) differs from the built-in
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
        let mut args = run_args(&file, &out);
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

/// The DistCA paper's second dataset as an arm: `skewsim run FILE --corpus PATH` runs a
/// DistCA experiment on another real length list (one length per line, here a ProLong-like
/// long tail written by the test) without editing the file; the summary says so, every row
/// names the file, the figures are the new corpus's, and a missing file is named.
#[test]
fn a_distca_experiment_runs_on_a_corpus_given_on_the_command_line() {
    let dir = tmp("distca-corpus");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("distca-small.toml");
    std::fs::write(
        &file,
        r#"arms = ["wlbllm", "distca", "distca:signal"]
kind = "distca-ablation"
steps = 1
model = "llama3-8b"
layers = 2
[parallel]
tp = 4
cp = 2
ga = 2
[network]
topology = "dgx-h200-roce"
[workload]
corpus = "wlbllm"
seed = 1
[sweep]
dp = [1]
seq_len = [65536]
"#,
    )
    .unwrap();
    // A long tail: lengths 1 ..= 60,000, most short, a few near the cap.
    let lengths: String = (0..3000u64)
        .map(|i| format!("{}\n", 1 + (i * 7919 % 3000).pow(4) / 1_350_000_000))
        .collect();
    let corpus = dir.join("prolong-like.txt");
    std::fs::write(&corpus, lengths).unwrap();
    let run = |out: &str, extra: &[&str]| {
        let out = dir.join(out);
        let mut args = run_args(&file, &out);
        args.extend(extra);
        let o = skewsim_at(&args, None, &root());
        (o, out)
    };
    let (o, plain) = run("plain", &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (o, swapped) = run("prolong", &["--corpus", corpus.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let md = read(&swapped.join("summary.md"));
    assert!(
        md.contains("prolong-like.txt`, given on the command line (`--corpus`)"),
        "{md}"
    );
    let points = read(&swapped.join("points.csv"));
    let rows: Vec<&str> = points.lines().skip(1).collect();
    assert_eq!(rows.len(), 3, "{points}");
    assert!(
        rows.iter().all(|r| r.contains("prolong-like.txt")),
        "{points}"
    );
    assert_ne!(points, read(&plain.join("points.csv")));
    let (o, _) = run("missing", &["--corpus", "no/such/lengths.txt"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && !err.contains("panicked"), "{err}");
    assert!(
        err.contains("invalid corpus = no/such/lengths.txt")
            && err.contains("this one does not exist"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
