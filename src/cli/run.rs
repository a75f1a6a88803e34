//! `skewsim run FILE.toml`: run an experiment file and write `runs/NAME/`.
//!
//! An experiment file names its `kind`; `skewsim::experiment` parses and runs it and
//! returns its files, which this writes. Unknown kinds are an error listing the known ones.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::time::Instant;

use skewsim::experiment::inputs::{read_input_text, MAX_SPEC_BYTES};
use skewsim::experiment::{self, calfile, schemes, Outcome, KINDS};

use super::{Output, Stderr};

#[derive(clap::Args)]
pub struct Args {
    /// The experiment file (TOML) to run.
    pub file: PathBuf,
    /// Where to write results (default: runs/NAME, NAME the file's stem).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// A calibration file (JSON, from `skewsim calibrate`) replacing the built-in kernel
    /// profile and cost figures, for kinds that price work (wins over the file's).
    #[arg(long)]
    pub calibration: Option<PathBuf>,
    /// The attention kernel's built-in profile to price by, for kinds that price work:
    /// torch-flash (PyTorch's varlen FlashAttention-2 on the H200, the default) or skewsim
    /// (the project's own kernels); replaces the file's calibration.
    #[arg(long)]
    pub kernel: Option<String>,
    /// Replace the experiment's corpus (`[workload] corpus` and any `[sweep] corpus`) with
    /// this one: a built-in name, a length file (JSON, CSV, one length per line) or a
    /// parametric spec. For `train` and the scheme comparisons.
    #[arg(long)]
    pub corpus: Option<String>,
}

pub fn run(args: Args, out: Output) -> Result<()> {
    let text = read_input_text(&args.file, MAX_SPEC_BYTES)
        .with_context(|| format!("reading experiment file {}", args.file.display()))?;
    let doc: toml::Table = toml::from_str(&text)
        .with_context(|| format!("{} is not valid TOML", args.file.display()))?;
    let kind = match doc.get("kind") {
        Some(toml::Value::String(k)) => k.clone(),
        _ => bail!(
            "{}: missing string field `kind` (one of: {})",
            args.file.display(),
            KINDS.join(", ")
        ),
    };
    let dir = out_dir(&args.file, args.out.as_deref());
    let text = match &args.corpus {
        None => text,
        Some(_) if !matches!(kind.as_str(), "train") && !schemes::KINDS.contains(&kind.as_str()) => bail!(
            "--corpus: experiment kind {kind:?} takes no corpus override (kinds that do: train, {})",
            schemes::KINDS.join(", ")
        ),
        Some(c) => with_corpus(doc, c)
            .with_context(|| format!("{}: --corpus {c}", args.file.display()))?,
    };
    let kernel = calfile::kernel_flag(args.kernel.as_deref(), args.calibration.is_some())?;
    let t0 = Instant::now();
    let prices = (args.calibration.as_deref(), kernel);
    let o = experiment::run_text(&args.file, &text, prices, &Stderr)?;
    write_files(&dir, &o)?;
    print(&o, &dir, t0, out)
}

/// Write the run's files into `dir`.
pub(crate) fn write_files(dir: &Path, o: &Outcome) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for (name, body) in &o.files {
        let p = dir.join(name);
        std::fs::write(&p, body).with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

/// Print what a run of `o`'s kind prints: its summary and where its files went (or its
/// result as JSON).
pub(super) fn print(o: &Outcome, dir: &Path, t0: Instant, out: Output) -> Result<()> {
    let names: Vec<&str> = o.files.iter().map(|(n, _)| n.as_str()).collect();
    if o.kind == "pools" {
        eprintln!(
            "skewsim: {} written to {} ({:.1} s)",
            names.join(", "),
            dir.display(),
            t0.elapsed().as_secs_f64()
        );
    }
    if let (true, Some(j)) = (out.json, &o.json) {
        println!("{j}");
        return Ok(());
    }
    match o.kind.as_str() {
        "pools" => print!("{}", o.summary),
        "runtime-variance" => print!(
            "{}\nwrote {}/{}\n",
            o.summary,
            dir.display(),
            names.join(", ")
        ),
        _ => {
            return out.emit(
                &serde_json::json!({ "dir": dir.display().to_string() }),
                || format!("{}\nwrote {}\n", o.summary, dir.display()),
            )
        }
    }
    Ok(())
}

/// Run the built-in four-way comparison, print its table and write `runs/default/`.
pub fn run_default(out: Output) -> Result<()> {
    let s = schemes::run_default(&Stderr)?;
    let table = s.table.clone();
    let o = s.outcome("four-way".into());
    let dir = Path::new("runs/default");
    write_files(dir, &o)?;
    out.emit(
        &serde_json::json!({ "dir": dir.display().to_string(), "table": table }),
        || {
            format!(
                "skewsim: the four balancing schemes on one small simulated cluster \
                 (built-in four-way comparison; `skewsim run experiments/four-way.toml` \
                 for the full one)\n\n{}\nwrote {}/summary.md, points.csv, plot.svg\n",
                table,
                dir.display()
            )
        },
    )
}

/// The experiment `doc` with its corpus replaced by `corpus` (`[workload] corpus`, and
/// `[sweep] corpus` when the file sweeps corpora), and a line saying so heading its
/// description. A corpus that names an existing file is made absolute, so it is read from
/// where the command was run.
fn with_corpus(mut doc: toml::Table, corpus: &str) -> Result<String> {
    let spec = match std::fs::canonicalize(corpus) {
        Ok(p) if p.is_file() => p.display().to_string(),
        _ => corpus.to_string(),
    };
    let Some(toml::Value::Table(w)) = doc.get_mut("workload") else {
        bail!("the experiment has no [workload] section to take a corpus");
    };
    w.insert("corpus".into(), toml::Value::String(spec.clone()));
    if let Some(toml::Value::Table(sw)) = doc.get_mut("sweep") {
        if sw.contains_key("corpus") {
            sw.insert(
                "corpus".into(),
                toml::Value::Array(vec![toml::Value::String(spec.clone())]),
            );
        }
    }
    let desc = match doc.get("description") {
        Some(toml::Value::String(d)) => d.clone(),
        _ => String::new(),
    };
    doc.insert(
        "description".into(),
        toml::Value::String(format!(
            "Corpus `{corpus}`, given on the command line (`--corpus`), in place of the file's.\n\n{desc}"
        )),
    );
    Ok(toml::to_string(&doc)?)
}

/// `runs/NAME` for `experiments/NAME.toml`, unless `--out` says otherwise.
pub fn out_dir(file: &Path, out: Option<&Path>) -> PathBuf {
    out.map(Path::to_path_buf).unwrap_or_else(|| {
        let stem = file.file_stem().map(|s| s.to_string_lossy().into_owned());
        PathBuf::from("runs").join(stem.unwrap_or_else(|| "experiment".into()))
    })
}
