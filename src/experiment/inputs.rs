//! What an experiment reads besides its own file (corpus traces, through [`load_corpus`]),
//! and the size limits of one simulated point.

use std::path::Path;

use crate::error::{invalid, Context, Result};
use crate::workload::corpus::Corpus;

/// Load a corpus: a trace file if `spec` names an existing file, else a built-in name or a
/// parametric spec.
pub fn load_corpus(spec: &str) -> Result<Corpus> {
    let path = Path::new(spec);
    if path.is_file() {
        let bytes = std::fs::read(path).with_context(|| format!("reading trace {spec}"))?;
        return Corpus::from_trace(spec, &bytes);
    }
    let looks_like_file = [".json", ".csv", ".txt", ".gz"]
        .iter()
        .any(|ext| spec.ends_with(ext))
        || spec.contains('/');
    if looks_like_file {
        return Err(invalid(
            "corpus",
            spec,
            "a trace file that exists (this one does not exist), a built-in name or a parametric spec",
        ));
    }
    Corpus::from_spec(spec)
}

/// Simulated GPUs of one point of an experiment (TP × CP × DP × PP): the largest size the
/// engine is measured at (the `recommend-16384` bench arm simulates points of it; minutes
/// of simulation per arm), and the largest `recommend` searches.
pub const MAX_SIM_GPUS: u64 = 1 << 14;
/// Micro-batches per step (GA) of one point.
pub const MAX_GA: u64 = 1 << 10;

/// Refuse a point's parallel layout with a zero degree, or past [`MAX_SIM_GPUS`] or
/// [`MAX_GA`], naming the degree (`file` and `table` locate it).
pub fn check_layout(file: &str, table: &str, [dp, pp, cp, tp]: [u32; 4], ga: u32) -> Result<()> {
    for (name, v) in [("dp", dp), ("pp", pp), ("cp", cp), ("tp", tp), ("ga", ga)] {
        if v == 0 {
            return Err(invalid(format!("{table} {name}"), 0, "a degree ≥ 1")).context(file);
        }
    }
    if u64::from(ga) > MAX_GA {
        return Err(invalid(
            format!("{table} ga"),
            ga,
            format!("at most {MAX_GA} micro-batches per step"),
        ))
        .context(file);
    }
    let gpus = u64::from(dp) * u64::from(pp) * u64::from(cp) * u64::from(tp);
    if gpus > MAX_SIM_GPUS {
        return Err(invalid(
            format!("{table} tp × cp × dp × pp"),
            format!("{tp} × {cp} × {dp} × {pp} = {gpus} simulated GPUs"),
            format!("at most {MAX_SIM_GPUS} per point"),
        ))
        .context(file);
    }
    Ok(())
}
