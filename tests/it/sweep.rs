//! `skewsim sweep` and `skewsim merge`: a sweep of any experiment kind split over task
//! processes (`--jobs`) or a real Slurm job array merges into `run`'s files byte for byte;
//! a merge with points missing lists them by index and refuses; a corrupt or foreign point
//! file is named.

use crate::common::{root, scratch, skewsim_at};
use std::io::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Four points (two arms at DP 1 and 2) that simulate in about a second.
const SMALL: &str = r#"kind = "four-way"
description = "A small comparison for the sweep tests: two arms at DP 1 and 2."
model = "llama3-8b"
layers = 2
steps = 1
arms = ["ulysses", "libra"]

[network]
topology = "dgx-h200-roce"

[parallel]
cp = 2
ga = 2

[workload]
corpus = "wlbllm"
seq_len = 32768
seed = 1

[settings]
pool_size = 2
head_shards = 2

[sweep]
dp = [1, 2]
"#;

const FILES: [&str; 3] = ["summary.md", "points.csv", "plot.svg"];

/// A `train` sweep of four points (Ulysses and Libra at DP 1 and 2, CP 4) with runtime
/// variance, in well under a second.
const TRAIN: &str = r#"kind = "train"
model = "llama3-8b"
steps = 1
[cluster]
gpus_per_node = 8
nodes = 1
allow_subset = true
[network]
topology = "dgx-h200-roce"
[variance]
persistent = { dist = "lognormal", sigma = 0.01 }
jitter = { dist = "lognormal", sigma = 0.01 }
[parallel]
dp = 1
pp = 1
cp = 4
ga = 2
[workload]
seq_len = 16384
seed = 3
corpus = "libra-256k"
[libra]
pool_size = 2
head_shards = 2
tile_tokens = 4096
[sweep]
dp = [1, 2]
gbs = [4]
scheme = ["ulysses", "libra"]
"#;

/// A `pools` study of four points (two corpora × two global batch sizes).
const POOLS: &str = r#"kind = "pools"
title = "small pools"
seed = 1
trials = 20
gbs = [16, 32]
pool_sizes = [2, 4, 8]
policies = ["random", "vrsp"]
[[corpus]]
name = "libra-256k"
[[corpus]]
name = "wlbllm"
"#;

/// A `runtime-variance` study under three seeds (three points).
const VARIANCE: &str = r#"kind = "runtime-variance"
gpus = 32
steps = 50
seed = 7
seeds = 3
"#;

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Run `skewsim args` in `dir`; its stdout and stderr, and whether it succeeded.
fn sk(args: &[&str], dir: &Path) -> (bool, String, String) {
    let o = skewsim_at(args, None, dir);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        err,
    )
}

/// `small.toml` in a scratch folder `name`, and `run`'s output of it in `name/run/`.
fn small(name: &str) -> std::path::PathBuf {
    let dir = scratch(&format!("sweep-{name}"));
    std::fs::write(dir.join("small.toml"), SMALL).unwrap();
    let (ok, _, err) = sk(&["run", "small.toml", "--out", "run"], &dir);
    assert!(ok, "{err}");
    dir
}

/// The committed megatron-dcp-blog (12 points; its model file named relative to the
/// experiment) swept over two task processes of five points each merges into the committed
/// result, which `run` reproduces (tests/it/schemes.rs).
#[test]
fn a_local_sweep_merges_into_the_committed_result() {
    let out = scratch("sweep-local").join("out");
    let (ok, stdout, err) = sk(
        &[
            "sweep",
            "experiments/megatron-dcp-blog.toml",
            "--jobs",
            "2",
            "--chunk",
            "5",
            "--out",
            out.to_str().unwrap(),
        ],
        &root(),
    );
    assert!(ok, "{err}");
    assert!(stdout.contains("wrote "), "{stdout}");
    assert!(err.contains("3/3 tasks done"), "{err}");
    for f in FILES {
        let committed = read(&root().join("experiments/results/megatron-dcp-blog").join(f));
        assert!(read(&out.join(f)) == committed, "{f} differs from run's");
    }
    // merging again gives the same files
    let (ok, _, err) = sk(&["merge", out.to_str().unwrap()], &root());
    assert!(ok, "{err}");
    let committed = read(&root().join("experiments/results/megatron-dcp-blog/summary.md"));
    assert!(read(&out.join("summary.md")) == committed);
    std::fs::remove_dir_all(out.parent().unwrap()).ok();
}

/// Missing and failed points are listed by index (with their tasks and a failed task's
/// reason) and nothing is merged; a truncated point file and another point's file are
/// named errors; rerunning the missing task completes the merge.
#[test]
fn a_merge_with_missing_or_corrupt_points_is_refused_by_name() {
    let dir = small("missing");
    let (ok, _, err) = sk(
        &["sweep", "small.toml", "--slurm", "sw", "--chunk", "2"],
        &dir,
    );
    assert!(ok, "{err}");
    let script = read(&dir.join("sw/sweep.sbatch"));
    assert!(script.contains("#SBATCH --array=0-1\n"), "{script}");
    assert!(
        script.contains("--task \"$SLURM_ARRAY_TASK_ID\""),
        "{script}"
    );
    // only task 1 ran (points 2 and 3), and point 0 "failed"
    let (ok, _, err) = sk(&["sweep", "sw/experiment.toml", "--task", "1"], &dir);
    assert!(ok, "{err}");
    std::fs::write(dir.join("sw/points/0.err"), "the node went away\n").unwrap();
    let (ok, _, err) = sk(&["merge", "sw"], &dir);
    assert!(!ok);
    for want in [
        "missing sweep points: 2 of 4 points have no result",
        ": 0, 1\n",
        "point 0 (task 0): failed: the node went away",
        "point 1 (task 0): no result",
        "sbatch --array=0 ",
    ] {
        assert!(err.contains(want), "{want:?} not in {err}");
    }
    assert!(!dir.join("sw/summary.md").exists());
    let (ok, _, err) = sk(&["sweep", "sw/experiment.toml", "--task", "2"], &dir);
    assert!(
        !ok && err.contains("--task 2: the sweep has tasks 0..=1"),
        "{err}"
    );
    let (ok, _, err) = sk(&["sweep", "sw/experiment.toml", "--task", "0"], &dir);
    assert!(ok, "{err}");
    assert!(!dir.join("sw/points/0.err").exists());
    // a truncated file, then another point's file in its place
    let p3 = dir.join("sw/points/3.toml");
    let good = read(&p3);
    std::fs::write(&p3, &good[..good.len() / 2]).unwrap();
    let (ok, _, err) = sk(&["merge", "sw"], &dir);
    assert!(
        !ok && err.contains("3.toml: corrupt sweep point file"),
        "{err}"
    );
    std::fs::copy(dir.join("sw/points/2.toml"), &p3).unwrap();
    let (ok, _, err) = sk(&["merge", "sw"], &dir);
    assert!(!ok && err.contains("a result of point 2"), "{err}");
    std::fs::write(&p3, good).unwrap();
    let (ok, _, err) = sk(&["merge", "sw"], &dir);
    assert!(ok, "{err}");
    for f in FILES {
        assert!(
            read(&dir.join("sw").join(f)) == read(&dir.join("run").join(f)),
            "{f}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// A sweep refuses what it cannot run or resume: prices for a kind that prices no GPU
/// work (as `run` does), a folder holding another sweep, an edited experiment copy.
#[test]
fn sweep_refuses_prices_it_cannot_use_and_foreign_folders() {
    let dir = small("refuse");
    let (ok, _, err) = sk(
        &[
            "sweep",
            root().join("experiments/libra-fig8.toml").to_str().unwrap(),
            "--slurm",
            "x",
            "--kernel",
            "skewsim",
        ],
        &dir,
    );
    assert!(
        !ok && err.contains("experiment kind \"pools\" prices no GPU work"),
        "{err}"
    );
    assert!(!dir.join("x").exists());
    let (ok, _, err) = sk(&["sweep", "small.toml", "--slurm", "sw"], &dir);
    assert!(ok, "{err}");
    std::fs::write(
        dir.join("other.toml"),
        SMALL.replace("dp = [1, 2]", "dp = [1]"),
    )
    .unwrap();
    let (ok, _, err) = sk(&["sweep", "other.toml", "--slurm", "sw"], &dir);
    assert!(
        !ok && err.contains("holds a sweep of another experiment"),
        "{err}"
    );
    let copy = dir.join("sw/experiment.toml");
    std::fs::write(&copy, SMALL.replace("seed = 1", "seed = 2")).unwrap();
    let (ok, _, err) = sk(&["merge", "sw"], &dir);
    assert!(
        !ok && err.contains("changed since the sweep was written"),
        "{err}"
    );
    let (ok, _, err) = sk(&["sweep", "small.toml"], &dir);
    assert!(!ok && err.contains("give --slurm OUT"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// Every experiment kind's sweep, run as `--jobs 2` tasks of two points each, merges into
/// exactly the files `run` writes (a `train` file without `[sweep]` is one point, one
/// task); with a point's result removed the merge refuses, naming the point and its task.
#[test]
fn every_kind_sweeps_into_runs_files_and_names_a_missing_point() {
    let single = TRAIN.split("[sweep]").next().unwrap();
    for (name, text, points) in [
        ("train", TRAIN, 4),
        ("single", single, 1),
        ("pools", POOLS, 4),
        ("variance", VARIANCE, 3),
    ] {
        let dir = scratch(&format!("sweep-kind-{name}"));
        let file = format!("{name}.toml");
        std::fs::write(dir.join(&file), text).unwrap();
        let (ok, _, err) = sk(&["run", &file, "--out", "run"], &dir);
        assert!(ok, "{name}: {err}");
        let (ok, _, err) = sk(
            &["sweep", &file, "--jobs", "2", "--chunk", "2", "--out", "sw"],
            &dir,
        );
        assert!(ok, "{name}: {err}");
        let tasks = (points + 1) / 2;
        assert!(
            err.contains(&format!("{tasks}/{tasks} tasks done")),
            "{name}: {err}"
        );
        let mut names: Vec<_> = std::fs::read_dir(dir.join("run"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert!(names.len() >= 3, "{name}: {names:?}");
        for f in &names {
            assert!(
                read(&dir.join("sw").join(f)) == read(&dir.join("run").join(f)),
                "{name}: {f} differs from run's"
            );
        }
        let last = points - 1;
        std::fs::remove_file(dir.join(format!("sw/points/{last}.toml"))).unwrap();
        let (ok, _, err) = sk(&["merge", "sw"], &dir);
        assert!(!ok, "{name}: merged without point {last}");
        for want in [
            format!("missing sweep points: 1 of {points} points have no result"),
            format!("point {last} (task {}): no result", last / 2),
        ] {
            assert!(err.contains(&want), "{name}: {want:?} not in {err}");
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}

/// Why Slurm cannot be used here, if it cannot: `sinfo` must answer with a usable node.
fn slurm_unavailable() -> Option<String> {
    match Command::new("sinfo").args(["-h", "-o", "%T"]).output() {
        Err(e) => Some(format!("sinfo did not run ({e}): Slurm is not installed")),
        Ok(o) if !o.status.success() => Some(format!(
            "sinfo failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Ok(o) => {
            let states = String::from_utf8_lossy(&o.stdout).into_owned();
            let up = states
                .lines()
                .any(|s| ["idle", "mixed", "allocated"].contains(&s.trim_end_matches('*')));
            (!up).then(|| format!("no usable Slurm node (states: {:?})", states.trim()))
        }
    }
}

/// Submit `dir/sw/sweep.sbatch`; its job id.
fn sbatch(dir: &Path) -> String {
    let o = Command::new("sbatch")
        .args(["--parsable", "sw/sweep.sbatch"])
        .current_dir(dir)
        .output()
        .expect("sbatch runs");
    assert!(
        o.status.success(),
        "sbatch: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// Wait until Slurm no longer lists job `job` (at most 600 s, then cancel it and fail).
fn wait_for(job: &str, t0: Instant) {
    loop {
        let q = Command::new("squeue")
            .args(["-h", "-j", job, "-o", "%i %T"])
            .output()
            .expect("squeue runs");
        let q = String::from_utf8_lossy(&q.stdout).into_owned();
        if q.trim().is_empty() {
            return;
        }
        if t0.elapsed() > Duration::from_secs(600) {
            let _ = Command::new("scancel").arg(job).status();
            panic!("job array {job} not finished after 600 s: {q}");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Merge the sweep folder `dir/sw` of `tasks` array tasks and compare `files` with `run`'s
/// in `dir/run`.
fn merge_matches_run(dir: &Path, tasks: usize, files: &[&str]) {
    let (ok, _, err) = sk(&["merge", "sw"], dir);
    let logs: Vec<String> = (0..tasks)
        .map(|t| std::fs::read_to_string(dir.join(format!("sw/logs/{t}.out"))).unwrap_or_default())
        .collect();
    assert!(ok, "merge: {err}\ntask logs: {logs:#?}");
    for f in files {
        assert!(
            read(&dir.join("sw").join(f)) == read(&dir.join("run").join(f)),
            "{f}: the job array's merge differs from run's"
        );
    }
}

/// The small comparison and the small `pools` study as real Slurm job arrays
/// (`.ci/slurm-up` brings up a single-node Slurm): submitted with sbatch, waited for,
/// merged, and compared byte for byte with `run`'s files. Without a Slurm it says so on
/// the terminal and skips, or fails when `SKEWSIM_SLURM=required` (as `.ci/run` sets once
/// it has started one).
#[test]
fn a_slurm_job_array_merges_into_runs_files() {
    if let Some(why) = slurm_unavailable() {
        let required = std::env::var("SKEWSIM_SLURM").is_ok_and(|v| v == "required");
        assert!(!required, "SKEWSIM_SLURM=required, but {why}");
        // straight to the terminal: the harness captures what eprintln! writes
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED sweep::a_slurm_job_array_merges_into_runs_files: {why} \
             (.ci/slurm-up starts one)"
        );
        return;
    }
    let dir = small("slurm");
    let (ok, stdout, err) = sk(&["sweep", "small.toml", "--slurm", "sw"], &dir);
    assert!(ok, "{err}");
    assert!(
        stdout.contains("4 points of small.toml (four-way) in 4 array tasks"),
        "{stdout}"
    );
    let pools = scratch("sweep-slurm-pools");
    std::fs::write(pools.join("pools.toml"), POOLS).unwrap();
    let (ok, _, err) = sk(&["run", "pools.toml", "--out", "run"], &pools);
    assert!(ok, "{err}");
    let (ok, stdout, err) = sk(
        &["sweep", "pools.toml", "--slurm", "sw", "--chunk", "2"],
        &pools,
    );
    assert!(ok, "{err}");
    assert!(
        stdout.contains("4 points of pools.toml (pools) in 2 array tasks"),
        "{stdout}"
    );
    let t0 = Instant::now();
    let jobs = [sbatch(&dir), sbatch(&pools)];
    for job in &jobs {
        wait_for(job, t0);
    }
    merge_matches_run(&dir, 4, &FILES);
    merge_matches_run(
        &pools,
        2,
        &[
            "summary.md",
            "results.csv",
            "libra-256k-gbs16.svg",
            "wlbllm-gbs32.svg",
        ],
    );
    let _ = writeln!(
        std::io::stderr(),
        "sweep: Slurm job arrays {} (four-way, 4 tasks) and {} (pools, 2 tasks) merged into \
         run's files byte for byte in {:.1} s",
        jobs[0],
        jobs[1],
        t0.elapsed().as_secs_f64()
    );
    std::fs::remove_dir_all(&dir).ok();
    std::fs::remove_dir_all(&pools).ok();
}
