//! The resource budget of the `skewsim` binary: the documented maximum of every size knob
//! and the memory estimate checked before a large allocation.
//!
//! A count flag takes its range from here through [`count`] (so `0`, `-5` and values past
//! the maximum are all refused by clap with the flag, the value and the range); a knob
//! whose cost depends on others (sequences × L, GBS × steps) is checked by
//! [`check_memory`] against `--max-memory` (default: half of this machine's memory) with
//! the estimate and the limit in the message.

use std::sync::OnceLock;

use anyhow::{bail, Result};

use skewsim::error::human_bytes;

/// Packed sequences per batch or statistic (`--sequences`, `--gbs`).
pub const MAX_SEQUENCES: u64 = 1 << 16;
/// The longest packed sequence (`--seq-len`).
pub const MAX_SEQ_LEN: u64 = skewsim::workload::pack::MAX_SEQ_LEN as u64;
/// Documents drawn for length statistics (`corpus --samples`).
pub const MAX_SAMPLES: u64 = 1 << 26;
/// Global batches a command walks through (`plan --step`, `libra-config --steps`).
pub const MAX_STEPS: u64 = skewsim::experiment::plan::MAX_STEPS;
/// Simulated GPUs of one point (DP × PP × CP), and any one parallel degree.
pub const MAX_GPUS: u64 = 1 << 16;
/// Nodes of a topology drawn by `topo` without `--large`.
pub const MAX_DRAWN_NODES: u64 = 1 << 10;
/// Repetitions and warm-up launches of `validate`.
pub const MAX_REPS: u64 = 1 << 16;

/// A clap value parser for a count in `min..=max`: zero, negative and too-large values
/// are all refused by clap with the flag, the value and the range.
pub fn count<T>(
    min: u64,
    max: u64,
) -> impl Fn(&str) -> std::result::Result<T, String> + Clone + Send + Sync + 'static
where
    T: TryFrom<u64>,
{
    move |s: &str| {
        let bad = || format!("{s} is not a whole number in {min}..={max}");
        let v: i128 = s.trim().parse().map_err(|_| bad())?;
        if v < i128::from(min) || v > i128::from(max) {
            return Err(bad());
        }
        T::try_from(v as u64).map_err(|_| bad())
    }
}

/// A clap value parser for a finite float ≥ 0 (NaN and infinity refused by name).
pub fn non_negative(s: &str) -> std::result::Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("{s} is not a finite number >= 0")),
    }
}

static MAX_MEMORY: OnceLock<u64> = OnceLock::new();

/// The smallest `--max-memory`, 1 MiB: a smaller limit refuses even small runs, and a
/// fraction of a byte would round to none.
pub const MIN_MEMORY_LIMIT: u64 = 1 << 20;
/// The largest `--max-memory`: 1 PiB, past any one machine's memory.
pub const MAX_MEMORY_LIMIT: u64 = 1 << 50;

/// Parse a byte size in [`MIN_MEMORY_LIMIT`]..=[`MAX_MEMORY_LIMIT`]: a number with an
/// optional K, M, G or T suffix (powers of 1024).
pub fn parse_bytes(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m: u64 = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return Err(format!("{s}: a byte count such as 512M, 16G or 1T")),
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    match num.parse::<f64>().map(|v| v * mult as f64) {
        Ok(b) if (MIN_MEMORY_LIMIT as f64..=MAX_MEMORY_LIMIT as f64).contains(&b) => Ok(b as u64),
        _ => Err(format!(
            "{s}: a byte count in {}M..={}T such as 512M, 16G or 1T",
            MIN_MEMORY_LIMIT >> 20,
            MAX_MEMORY_LIMIT >> 40
        )),
    }
}

/// Set the memory limit for this process (`--max-memory`); the default applies otherwise.
pub fn set_max_memory(bytes: Option<u64>) {
    if let Some(b) = bytes {
        let _ = MAX_MEMORY.set(b);
    }
}

/// Half of this machine's memory (`MemTotal` of /proc/meminfo), 8 GiB where unknown.
fn default_max_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(8 << 30, |kb| kb * 1024 / 2)
}

/// The memory limit in bytes.
pub fn max_memory() -> u64 {
    *MAX_MEMORY.get_or_init(default_max_memory)
}

/// Refuse `what` when its estimated memory `bytes` exceeds the limit, naming both.
pub fn check_memory(what: &str, bytes: f64) -> Result<()> {
    let limit = max_memory();
    if bytes > limit as f64 {
        bail!(
            "{what} needs ~{} of memory; at most {} here (half of this machine's memory \
             unless --max-memory says otherwise); --max-memory raises the limit",
            human_bytes(bytes),
            human_bytes(limit as f64)
        );
    }
    Ok(())
}

/// Bytes of `n` packed sequences of `seq_len` tokens from documents of mean length
/// `mean_doc` tokens (one sample record per document or cut piece, the sequence's own
/// record); the estimate [`check_memory`] takes for a batch.
pub fn packed_bytes(n: u64, seq_len: u32, mean_doc: f64) -> f64 {
    let per_seq = f64::from(seq_len) / mean_doc.max(1.0) + 2.0;
    n as f64
        * (std::mem::size_of::<skewsim::workload::PackedSeq>() as f64
            + per_seq * std::mem::size_of::<skewsim::workload::Sample>() as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_parse_and_bad_ones_are_named() {
        assert_eq!(parse_bytes("512M"), Ok(512 << 20));
        assert_eq!(parse_bytes("16g"), Ok(16 << 30));
        assert_eq!(parse_bytes("1048576"), Ok(1 << 20));
        assert_eq!(parse_bytes("1024T"), Ok(1 << 50));
        for bad in [
            "", "0", "0.5", "1", "1000", "1023K", "-1G", "nanG", "12Q", "1025T", "1e19", "1e30T",
        ] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
        assert!(non_negative("nan").is_err());
        assert!(non_negative("-0.1").is_err());
        assert_eq!(non_negative("0.5"), Ok(0.5));
    }

    #[test]
    fn a_batch_past_the_limit_is_refused_with_both_figures() {
        let need = packed_bytes(1 << 30, 262_144, 1000.0);
        let e = check_memory("--gbs 1073741824", need)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--gbs 1073741824 needs ~") && e.contains("--max-memory"),
            "{e}"
        );
        assert!(check_memory("a small batch", packed_bytes(32, 262_144, 1000.0)).is_ok());
    }
}
