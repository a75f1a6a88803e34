//! `skewsim sweep FILE.toml`: an experiment's sweep points split over a Slurm job array
//! (`--slurm OUT`) or over local processes (`--jobs N --out OUT`), each point written to
//! its own result file; `skewsim merge OUT`: those files gathered into the `summary.md`,
//! `points.csv` and `plot.svg` that `skewsim run` writes, byte for byte.
//!
//! A sweep folder OUT holds `sweep.json` (what every task runs: the experiment as it was
//! named, the folder it was named from, its prices, points and chunk), `experiment.toml`
//! (the experiment's copy, which the tasks and `merge` read), `sweep.sbatch` (the job
//! array), `points/I.toml` (point I's result, written whole or not at all; TOML, whose
//! floats read back exactly), `points/I.err`
//! (why point I failed), `logs/T.out` (task T's output) and, once merged, the run's files.
//! Tasks and `merge` work from the folder the experiment was named from, so relative paths
//! inside it resolve as they did for `run`. Every experiment kind splits (what a point is:
//! `experiment::sweep`).

use anyhow::{bail, ensure, Context, Result};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use skewsim::experiment::inputs::{read_input_text, MAX_SPEC_BYTES, MAX_TABLE_BYTES};
use skewsim::experiment::sweep::{PointResult, Sweep};
use skewsim::experiment::{self, calfile};

use super::{limits, run, Output};

/// The largest sweep (points) and task index accepted.
const MAX_POINTS: u64 = 1 << 24;

#[derive(clap::Args)]
pub struct Args {
    /// The experiment file (TOML); with --task, a sweep folder's copy (OUT/experiment.toml).
    pub file: PathBuf,
    /// Write the sweep folder OUT with a Slurm job-array script, OUT/sweep.sbatch (one
    /// array task per --chunk points); submit it with sbatch, then `skewsim merge OUT`.
    #[arg(long, value_name = "OUT", conflicts_with_all = ["jobs", "out", "task"])]
    pub slurm: Option<PathBuf>,
    /// Run the sweep on this machine, N task processes at a time, into the sweep folder
    /// --out, then merge it.
    #[arg(long, value_name = "N", requires = "out", conflicts_with = "task",
          value_parser = limits::count::<usize>(1, 4096))]
    pub jobs: Option<usize>,
    /// The sweep folder of --jobs.
    #[arg(long, value_name = "OUT")]
    pub out: Option<PathBuf>,
    /// Run array task T of the sweep folder that holds FILE (what sweep.sbatch runs): its
    /// points T·K to T·K + K − 1 (K = the sweep's --chunk).
    #[arg(long, value_name = "T", value_parser = limits::count::<usize>(0, MAX_POINTS),
          conflicts_with_all = ["chunk", "partition", "time", "bin", "calibration", "kernel"])]
    pub task: Option<usize>,
    /// Sweep points per array task [default: 1].
    #[arg(long, value_name = "K", value_parser = limits::count::<usize>(1, MAX_POINTS))]
    pub chunk: Option<usize>,
    /// The Slurm partition the tasks run in (sbatch --partition).
    #[arg(long, requires = "slurm")]
    pub partition: Option<String>,
    /// Each task's time limit (sbatch --time, e.g. 30:00 or 2:00:00).
    #[arg(long, requires = "slurm")]
    pub time: Option<String>,
    /// The skewsim binary the tasks run, at a path every node reaches [default: this one].
    #[arg(long, requires = "slurm")]
    pub bin: Option<PathBuf>,
    /// A calibration file (JSON) pricing the sweep, as `run --calibration`.
    #[arg(long)]
    pub calibration: Option<PathBuf>,
    /// The attention kernel's built-in profile, as `run --kernel`.
    #[arg(long)]
    pub kernel: Option<String>,
}

#[derive(clap::Args)]
pub struct MergeArgs {
    /// The sweep folder (`sweep --slurm OUT` or `sweep --jobs N --out OUT`).
    pub dir: PathBuf,
}

/// `sweep.json`: what every task of a sweep runs.
#[derive(Serialize, Deserialize, PartialEq, Debug)]
#[serde(deny_unknown_fields)]
struct Manifest {
    format: String,
    /// The experiment file as it was named (relative to `dir`, or absolute).
    experiment: String,
    /// The folder the experiment was named from; tasks and merge run there.
    dir: PathBuf,
    calibration: Option<String>,
    kernel: Option<String>,
    points: usize,
    chunk: usize,
    tasks: usize,
    /// FNV-1a of the experiment text and the fields above it, in hex: every point file
    /// carries it.
    fingerprint: String,
}

const FORMAT: &str = "skewsim-sweep-2";

/// `points/I.toml`: one point's result.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PointFile {
    sweep: String,
    point: usize,
    result: PointResult,
}

pub fn run(args: Args, out: Output) -> Result<()> {
    if let Some(t) = args.task {
        return run_task(&args.file, t);
    }
    let dir = match (&args.slurm, &args.out) {
        (Some(d), _) | (None, Some(d)) => d.clone(),
        (None, None) => bail!(
            "sweep: give --slurm OUT (a job array to submit), --jobs N --out OUT (processes \
             here) or --task T (one task of a sweep folder)"
        ),
    };
    let t0 = Instant::now();
    let (m, sweep) = write_folder(&args, &dir)?;
    if args.slurm.is_some() {
        let script = write_script(&args, &dir, &m)?;
        if m.tasks > 1000 {
            eprintln!(
                "skewsim: {} array tasks: Slurm refuses arrays over its MaxArraySize (1001 by \
                 default); --chunk puts several points in one task",
                m.tasks
            );
        }
        return out.emit(
            &serde_json::json!({
                "dir": dir.display().to_string(),
                "script": script.display().to_string(),
                "points": m.points,
                "tasks": m.tasks,
            }),
            || {
                format!(
                    "{} points of {} ({}) in {} array tasks, {} per task\nsubmit: sbatch {}\n\
                     when every task has finished: skewsim merge {}\n",
                    m.points,
                    m.experiment,
                    sweep.kind(),
                    m.tasks,
                    m.chunk,
                    script.display(),
                    dir.display()
                )
            },
        );
    }
    drop(sweep);
    run_local(&dir, &m, args.jobs.unwrap_or(1))?;
    merge_at(&dir, t0, out)
}

/// Check the experiment, then write the sweep folder `dir`: `sweep.json`, the
/// experiment's copy and the `points/` and `logs/` folders. A folder that already holds
/// this sweep keeps its results (a resumed sweep); one holding another is refused.
fn write_folder(args: &Args, dir: &Path) -> Result<(Manifest, Sweep)> {
    let text = read_input_text(&args.file, MAX_SPEC_BYTES)
        .with_context(|| format!("reading experiment file {}", args.file.display()))?;
    let kernel = calfile::kernel_flag(args.kernel.as_deref(), args.calibration.is_some())?;
    let sweep = experiment::sweep(&args.file, &text, (args.calibration.as_deref(), kernel))?;
    let chunk = args.chunk.unwrap_or(1);
    let mut m = Manifest {
        format: FORMAT.into(),
        experiment: args.file.display().to_string(),
        dir: std::env::current_dir().context("the current folder")?,
        calibration: args.calibration.as_ref().map(|c| c.display().to_string()),
        kernel: args.kernel.clone(),
        points: sweep.len(),
        chunk,
        tasks: sweep.len().div_ceil(chunk),
        fingerprint: String::new(),
    };
    m.fingerprint = fingerprint(&m, &text);
    let manifest = dir.join("sweep.json");
    if manifest.exists() {
        let old = read_manifest(dir)?;
        if old != m {
            bail!(
                "{}: the folder holds a sweep of another experiment or setting ({}, {} points, \
                 chunk {}); give another folder or delete this one",
                dir.display(),
                old.experiment,
                old.points,
                old.chunk
            );
        }
    }
    for sub in ["points", "logs"] {
        let d = dir.join(sub);
        std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
    }
    write(&dir.join("experiment.toml"), &text)?;
    write(&manifest, &(serde_json::to_string_pretty(&m)? + "\n"))?;
    Ok((m, sweep))
}

/// FNV-1a over the experiment text and every manifest field but the fingerprint, in hex.
fn fingerprint(m: &Manifest, text: &str) -> String {
    let mut s = format!(
        "{}\0{}\0{}\0{:?}\0{:?}\0{}\0{}\0{}\0",
        m.format,
        m.experiment,
        m.dir.display(),
        m.calibration,
        m.kernel,
        m.points,
        m.chunk,
        m.tasks
    );
    s += text;
    format!("{:016x}", skewsim::rng::fnv1a(s.as_bytes()))
}

/// Write `body` to `path` whole: into a temporary file beside it, then renamed over it,
/// so a killed task leaves no half-written file.
fn write(path: &Path, body: &str) -> Result<()> {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    std::fs::write(&tmp, body).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
}

fn read_manifest(dir: &Path) -> Result<Manifest> {
    let p = dir.join("sweep.json");
    let text = read_input_text(&p, MAX_SPEC_BYTES).with_context(|| {
        format!(
            "reading {}: not a sweep folder (`skewsim sweep FILE --slurm {}` writes one)",
            p.display(),
            dir.display()
        )
    })?;
    let m: Manifest = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a sweep manifest", p.display()))?;
    ensure!(
        m.format == FORMAT,
        "{}: format = {:?}: this skewsim reads {FORMAT:?}",
        p.display(),
        m.format
    );
    Ok(m)
}

/// The sweep folder `dir` (absolute), its manifest and the sweep it describes, with the
/// process moved to the folder the experiment was named from. The experiment's copy must
/// be the text the sweep was written from.
fn open(dir: &Path) -> Result<(PathBuf, Manifest, Sweep)> {
    let dir = std::path::absolute(dir).with_context(|| format!("{}", dir.display()))?;
    let m = read_manifest(&dir)?;
    let copy = dir.join("experiment.toml");
    let text = read_input_text(&copy, MAX_SPEC_BYTES)
        .with_context(|| format!("reading {}", copy.display()))?;
    ensure!(
        fingerprint(&m, &text) == m.fingerprint,
        "{}: changed since the sweep was written (its fingerprint is not sweep.json's {}); \
         write the sweep again",
        copy.display(),
        m.fingerprint
    );
    std::env::set_current_dir(&m.dir).with_context(|| {
        format!(
            "{}: dir = {}: the folder the experiment was named from must be reachable here",
            dir.join("sweep.json").display(),
            m.dir.display()
        )
    })?;
    let kernel = calfile::kernel_flag(m.kernel.as_deref(), m.calibration.is_some())?;
    let cal = m.calibration.as_deref().map(Path::new);
    let sweep = experiment::sweep(Path::new(&m.experiment), &text, (cal, kernel))?;
    ensure!(
        sweep.len() == m.points,
        "{}: points = {}, but the experiment has {} here",
        dir.join("sweep.json").display(),
        m.points,
        sweep.len()
    );
    Ok((dir, m, sweep))
}

/// Run array task `t` of the sweep folder holding `file`: its points, in parallel, each
/// written to `points/I.json` (or its error to `points/I.err`).
fn run_task(file: &Path, t: usize) -> Result<()> {
    let folder = file.parent().filter(|p| !p.as_os_str().is_empty());
    let (dir, m, sweep) = open(folder.unwrap_or(Path::new(".")))?;
    if t >= m.tasks {
        bail!(
            "--task {t}: the sweep has tasks 0..={} ({} points, {} per task)",
            m.tasks - 1,
            m.points,
            m.chunk
        );
    }
    let points = t * m.chunk..((t + 1) * m.chunk).min(m.points);
    let failed: Vec<usize> = points
        .into_par_iter()
        .filter_map(|i| {
            let (file, err) = (point_path(&dir, i, "toml"), point_path(&dir, i, "err"));
            let done = sweep
                .run_point(i)
                .map_err(anyhow::Error::from)
                .and_then(|r| {
                    let f = PointFile {
                        sweep: m.fingerprint.clone(),
                        point: i,
                        result: r,
                    };
                    write(&file, &toml::to_string(&f)?)
                });
            match done {
                Ok(()) => {
                    std::fs::remove_file(&err).ok();
                    eprintln!("skewsim: point {i} ({}) written", sweep.describe(i));
                    None
                }
                Err(e) => {
                    eprintln!("skewsim: point {i} failed: {e:#}");
                    write(&err, &format!("{e:#}\n")).ok();
                    Some(i)
                }
            }
        })
        .collect();
    if !failed.is_empty() {
        bail!(
            "task {t}: points {} failed (their errors are in {})",
            list(&failed, ", "),
            dir.join("points").display()
        );
    }
    Ok(())
}

fn point_path(dir: &Path, i: usize, ext: &str) -> PathBuf {
    dir.join("points").join(format!("{i}.{ext}"))
}

/// `3, 7, 12` (`sep` = ", ").
fn list(v: &[usize], sep: &str) -> String {
    v.iter().map(usize::to_string).collect::<Vec<_>>().join(sep)
}

/// Run the tasks of the sweep folder `dir` that have points without a result, `jobs`
/// task processes at a time (each `skewsim sweep DIR/experiment.toml --task T`, what the
/// job array runs, its output in `logs/T.out`); the merge that follows names what failed.
fn run_local(dir: &Path, m: &Manifest, jobs: usize) -> Result<()> {
    let exe = std::env::current_exe().context("this skewsim binary's path")?;
    let copy = dir.join("experiment.toml");
    let todo: Vec<usize> = (0..m.tasks)
        .filter(|t| {
            (t * m.chunk..((t + 1) * m.chunk).min(m.points))
                .any(|i| !point_path(dir, i, "toml").exists())
        })
        .collect();
    // the machine's cores shared among the task processes (results do not depend on it)
    let threads = std::thread::available_parallelism().map_or(1, |n| (n.get() / jobs).max(1));
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..jobs.min(todo.len()) {
            s.spawn(|| loop {
                let Some(&t) = todo.get(next.fetch_add(1, Ordering::Relaxed)) else {
                    return;
                };
                let log = dir.join("logs").join(format!("{t}.out"));
                let ran = std::fs::File::create(&log).and_then(|f| {
                    let mut c = std::process::Command::new(&exe);
                    c.arg("sweep").arg(&copy).args(["--task", &t.to_string()]);
                    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
                        c.env("RAYON_NUM_THREADS", threads.to_string());
                    }
                    c.stdout(f.try_clone()?).stderr(f).status()
                });
                let k = done.fetch_add(1, Ordering::Relaxed) + 1;
                match ran {
                    Ok(s) if s.success() => eprintln!("skewsim: {k}/{} tasks done", todo.len()),
                    Ok(_) => eprintln!("skewsim: task {t} failed (see {})", log.display()),
                    Err(e) => eprintln!("skewsim: task {t} did not start: {e}"),
                }
            });
        }
    });
    Ok(())
}

pub fn merge(args: MergeArgs, out: Output) -> Result<()> {
    merge_at(&args.dir, Instant::now(), out)
}

/// Gather the sweep folder `dir`'s point results into the run's files, written into
/// `dir`; refused, listing them, while any point has no result.
fn merge_at(dir: &Path, t0: Instant, out: Output) -> Result<()> {
    let (dir, m, sweep) = open(dir)?;
    let mut results = Vec::with_capacity(m.points);
    let mut missing = Vec::new();
    for i in 0..m.points {
        let p = point_path(&dir, i, "toml");
        if !p.exists() {
            missing.push(i);
            continue;
        }
        let text = read_input_text(&p, MAX_TABLE_BYTES)
            .with_context(|| format!("reading {}", p.display()))?;
        let name = p.display().to_string();
        let f: PointFile = toml::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{name}: corrupt sweep point file: {e}"))?;
        ensure!(
            f.sweep == m.fingerprint && f.point == i,
            "{name}: a result of point {} of sweep {}, not point {i} of this sweep ({}); \
             delete it and rerun its task",
            f.point,
            f.sweep,
            m.fingerprint
        );
        results.push(f.result);
    }
    if !missing.is_empty() {
        bail!("{}", missing_report(&dir, &m, &missing));
    }
    let o = sweep.finish(results)?;
    run::write_files(&dir, &o)?;
    run::print(&o, &dir, t0, out)
}

/// The merge's refusal: which points have no result, why where a task said so, and the
/// tasks to run again.
fn missing_report(dir: &Path, m: &Manifest, missing: &[usize]) -> String {
    let mut s = format!(
        "missing sweep points: {} of {} points have no result in {}, so nothing is merged: {}\n",
        missing.len(),
        m.points,
        dir.join("points").display(),
        list(missing, ", ")
    );
    for &i in missing {
        let why = read_input_text(&point_path(dir, i, "err"), MAX_TABLE_BYTES)
            .map(|e| format!("failed: {}", e.lines().next().unwrap_or_default()))
            .unwrap_or_else(|_| "no result (not run, still running, or killed)".into());
        let _ = writeln!(s, "  point {i} (task {}): {why}", i / m.chunk);
    }
    let mut tasks: Vec<usize> = missing.iter().map(|i| i / m.chunk).collect();
    tasks.dedup();
    let _ = write!(
        s,
        "run their tasks again: sbatch --array={} {} (or `skewsim sweep {} --task T` for each)",
        list(&tasks, ","),
        dir.join("sweep.sbatch").display(),
        dir.join("experiment.toml").display()
    );
    s
}

/// `'text'` for a POSIX shell.
fn quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', r"'\''"))
}

/// Write `dir/sweep.sbatch`: one array task per chunk of points, each running
/// `skewsim sweep DIR/experiment.toml --task $SLURM_ARRAY_TASK_ID`.
fn write_script(args: &Args, dir: &Path, m: &Manifest) -> Result<PathBuf> {
    let dir = std::fs::canonicalize(dir).with_context(|| format!("{}", dir.display()))?;
    let bin = match &args.bin {
        Some(b) => std::path::absolute(b)?,
        None => std::env::current_exe().context("this skewsim binary's path")?,
    };
    let name = Path::new(&m.experiment)
        .file_stem()
        .map_or("sweep".into(), |s| s.to_string_lossy().into_owned());
    let mut s = format!(
        "#!/bin/bash\n\
         # skewsim sweep of {exp}: {n} points, {k} per array task.\n\
         # Submit: sbatch {script}\n\
         # Then, when every task has finished: skewsim merge {dirq}\n\
         #SBATCH --job-name=skewsim-{name}\n\
         #SBATCH --array=0-{last}\n\
         #SBATCH --output={logs}/%a.out\n",
        exp = m.experiment,
        n = m.points,
        k = m.chunk,
        script = quote(&dir.join("sweep.sbatch")),
        dirq = quote(&dir),
        last = m.tasks - 1,
        logs = dir.join("logs").display(),
    );
    if let Some(p) = &args.partition {
        let _ = writeln!(s, "#SBATCH --partition={p}");
    }
    if let Some(t) = &args.time {
        let _ = writeln!(s, "#SBATCH --time={t}");
    }
    let _ = write!(
        s,
        "set -eu\nexec {} sweep {} --task \"$SLURM_ARRAY_TASK_ID\"\n",
        quote(&bin),
        quote(&dir.join("experiment.toml"))
    );
    let script = dir.join("sweep.sbatch");
    write(&script, &s)?;
    Ok(script)
}
