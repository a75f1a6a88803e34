//! What an experiment reads besides its own file (corpus traces, through [`load_corpus`]),
//! the one reader of every user-named input file ([`read_input`], bounded by a per-kind
//! byte limit), and the size limits of one simulated point.

use std::io::Read;
use std::path::Path;

use crate::error::{human_bytes, invalid, parse_error, Context, Result};
use crate::workload::corpus::{Corpus, MAX_TRACE_BYTES};

/// Bytes of a specification file: an experiment, topology or model TOML, a calibration
/// or collective-fit JSON, a sweep folder's manifest. The largest committed one is 15 KB
/// (`calibrations/torch-flash-d128.json`).
pub const MAX_SPEC_BYTES: u64 = 16 << 20;
/// Bytes of a table: a measurement, collective, GEMM or elementwise CSV, a kernel trace
/// JSON, a `--packed` batch, a sweep point's result. The largest committed one is 1.8 MB
/// (`validate/results/plans_run19/measurements.csv`).
pub const MAX_TABLE_BYTES: u64 = 256 << 20;
/// Bytes of a plan file, as many as a plan may be written with
/// ([`crate::plan::MAX_JSON_BYTES`]).
pub const MAX_PLAN_BYTES: u64 = crate::plan::MAX_JSON_BYTES;

/// The bytes of the user-named input file `path`: a regular file of at most `max_bytes`
/// (one of the `MAX_*_BYTES` limits). A device, directory or FIFO is refused before it is
/// opened, and a file past the limit before it is read, each naming the file, what it is
/// and the limit.
pub fn read_input(path: &Path, max_bytes: u64) -> Result<Vec<u8>> {
    let field = || format!("file {}", path.display());
    let allowed = || {
        format!(
            "a regular file of at most {}",
            human_bytes(max_bytes as f64)
        )
    };
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(invalid(field(), file_kind(&meta.file_type()), allowed()));
    }
    let too_big = |len: u64| {
        invalid(
            field(),
            format!("{} ({len} bytes)", human_bytes(len as f64)),
            allowed(),
        )
    };
    if meta.len() > max_bytes {
        return Err(too_big(meta.len()));
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(max_bytes + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max_bytes {
        return Err(too_big(bytes.len() as u64));
    }
    Ok(bytes)
}

/// [`read_input`] of a text file: its bytes as UTF-8, else an error naming the file.
pub fn read_input_text(path: &Path, max_bytes: u64) -> Result<String> {
    String::from_utf8(read_input(path, max_bytes)?).map_err(|e| {
        parse_error(
            path.display().to_string(),
            format!("not UTF-8 text: {}", e.utf8_error()),
        )
    })
}

/// What a file that is not a regular one is, for messages.
fn file_kind(t: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_char_device() {
            return "a character device, not a regular file";
        }
        if t.is_block_device() {
            return "a block device, not a regular file";
        }
        if t.is_fifo() {
            return "a FIFO, not a regular file";
        }
        if t.is_socket() {
            return "a socket, not a regular file";
        }
    }
    if t.is_dir() {
        "a directory, not a regular file"
    } else {
        "not a regular file"
    }
}

/// Whether a corpus spec names a file rather than a built-in or parametric corpus.
fn looks_like_file(spec: &str) -> bool {
    [".json", ".csv", ".txt", ".gz"]
        .iter()
        .any(|ext| spec.ends_with(ext))
        || spec.contains('/')
}

/// Load a corpus: a trace file if `spec` names an existing file, else a built-in name, a
/// parametric spec or a mixture of these.
pub fn load_corpus(spec: &str) -> Result<Corpus> {
    let path = Path::new(spec);
    if path.is_file() || (looks_like_file(spec) && path.exists()) {
        let bytes =
            read_input(path, MAX_TRACE_BYTES).with_context(|| format!("reading trace {spec}"))?;
        return Corpus::from_trace(spec, &bytes);
    }
    if spec.contains('*') {
        let file = spec
            .split('+')
            .filter_map(|term| term.split_once('*'))
            .map(|(_, component)| component.trim())
            .find(|component| looks_like_file(component));
        if let Some(file) = file {
            return Err(invalid(
                "corpus mixture component",
                file,
                "a built-in name or a parametric spec (a trace file is a corpus of its own, \
                 never part of a mixture)",
            ));
        }
    } else if looks_like_file(spec) {
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
