//! Attention-kernel efficiency: achieved TFLOP/s as a function of the heads per call and
//! the length of the query chunk and of the KV it attends to.
//!
//! The table is a grid of measured points over (heads, length); a query is answered by
//! bilinear interpolation in (ln heads, ln length), clamped at the grid's edges (no
//! extrapolation). For a call whose query chunk and KV differ in length the effective
//! length is their geometric mean √(q·kv), which equals the document length for a whole
//! causal document (the case the table measures).
//!
//! The default grid is the real H200 measurement shipped in
//! `traces/h200_torch_flash_causal_fwd.csv` (see `traces/README.md`); a calibration file
//! replaces it.

use serde::{Deserialize, Serialize};

use crate::error::{invalid, parse_error, Result};

/// The H200 forward causal FlashAttention measurement (bf16, head_dim 128).
pub const H200_FWD_CSV: &str = include_str!("../../traces/h200_torch_flash_causal_fwd.csv");

/// One measured point: `heads` per call, documents of `len` tokens, achieved `tflops`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EffPoint {
    /// Query heads per kernel call.
    pub heads: u32,
    /// Document (query chunk = KV) length in tokens.
    pub len: u32,
    /// Achieved TFLOP/s (causal FLOPs 4·d·heads·Σ ℓ(ℓ+1)/2 over time).
    pub tflops: f64,
}

/// A full grid of efficiency points, interpolated in log–log space.
#[derive(Clone, Debug, PartialEq)]
pub struct EffTable {
    heads: Vec<f64>,
    lens: Vec<f64>,
    /// `tflops[h * lens.len() + l]`.
    tflops: Vec<f64>,
}

impl EffTable {
    /// The built-in H200 table.
    pub fn h200_default() -> Result<Self> {
        Self::from_csv_str(H200_FWD_CSV, "traces/h200_torch_flash_causal_fwd.csv")
    }

    /// Parse a CSV with the columns `heads,doc_len,...,tflops` (the measurement format).
    pub fn from_csv_str(text: &str, context: &str) -> Result<Self> {
        let mut rdr = csv::Reader::from_reader(text.as_bytes());
        let headers = rdr
            .headers()
            .map_err(|e| parse_error(context, e.to_string()))?
            .clone();
        let col = |name: &str| {
            headers
                .iter()
                .position(|h| h == name)
                .ok_or_else(|| parse_error(context, format!("missing column `{name}`")))
        };
        let (ch, cl, ct) = (col("heads")?, col("doc_len")?, col("tflops")?);
        let mut pts = Vec::new();
        for (i, rec) in rdr.records().enumerate() {
            let rec = rec.map_err(|e| parse_error(context, e.to_string()))?;
            let field = |c: usize| rec.get(c).unwrap_or("");
            let line = i + 2;
            let heads = field(ch)
                .parse::<u32>()
                .map_err(|e| parse_error(context, format!("line {line}: heads: {e}")))?;
            let len = field(cl)
                .parse::<u32>()
                .map_err(|e| parse_error(context, format!("line {line}: doc_len: {e}")))?;
            let tflops = field(ct)
                .parse::<f64>()
                .map_err(|e| parse_error(context, format!("line {line}: tflops: {e}")))?;
            pts.push(EffPoint { heads, len, tflops });
        }
        Self::from_points(&pts, context)
    }

    /// Build from points that cover a full (heads × len) grid.
    pub fn from_points(pts: &[EffPoint], context: &str) -> Result<Self> {
        if pts.is_empty() {
            return Err(invalid(
                format!("{context}: points"),
                0,
                "at least one point",
            ));
        }
        for p in pts {
            if p.heads == 0 || p.len == 0 || !(p.tflops.is_finite() && p.tflops > 0.0) {
                return Err(invalid(
                    format!("{context}: point"),
                    format!("heads {} len {} tflops {}", p.heads, p.len, p.tflops),
                    "heads > 0, len > 0, tflops finite and > 0",
                ));
            }
        }
        let mut heads: Vec<u32> = pts.iter().map(|p| p.heads).collect();
        let mut lens: Vec<u32> = pts.iter().map(|p| p.len).collect();
        heads.sort_unstable();
        heads.dedup();
        lens.sort_unstable();
        lens.dedup();
        let mut grid = vec![f64::NAN; heads.len() * lens.len()];
        for p in pts {
            let (Ok(h), Ok(l)) = (heads.binary_search(&p.heads), lens.binary_search(&p.len)) else {
                continue;
            };
            let cell = &mut grid[h * lens.len() + l];
            if !cell.is_nan() {
                return Err(invalid(
                    format!("{context}: point"),
                    format!("heads {} len {}", p.heads, p.len),
                    "each (heads, len) once",
                ));
            }
            *cell = p.tflops;
        }
        if let Some(i) = grid.iter().position(|v| v.is_nan()) {
            return Err(invalid(
                format!("{context}: grid"),
                format!(
                    "heads {} len {} missing",
                    heads[i / lens.len()],
                    lens[i % lens.len()]
                ),
                "a full grid: every heads value measured at every length",
            ));
        }
        Ok(Self {
            heads: heads.iter().map(|&h| f64::from(h).ln()).collect(),
            lens: lens.iter().map(|&l| f64::from(l).ln()).collect(),
            tflops: grid,
        })
    }

    /// Achieved TFLOP/s for `heads` per call, a query chunk of `q_len` and KV of `kv_len`.
    pub fn tflops(&self, heads: u32, q_len: u64, kv_len: u64) -> f64 {
        let h = f64::from(heads.max(1)).ln();
        let l = 0.5 * ((q_len.max(1) as f64).ln() + (kv_len.max(1) as f64).ln());
        let (h0, h1, th) = bracket(&self.heads, h);
        let (l0, l1, tl) = bracket(&self.lens, l);
        let n = self.lens.len();
        let v = |hi: usize, li: usize| self.tflops[hi * n + li];
        let a = v(h0, l0) * (1.0 - tl) + v(h0, l1) * tl;
        let b = v(h1, l0) * (1.0 - tl) + v(h1, l1) * tl;
        a * (1.0 - th) + b * th
    }

    /// The same grid with every rate multiplied by `factor` (`cost::gpu::derive`).
    pub fn scaled(&self, factor: f64) -> Self {
        Self {
            tflops: self.tflops.iter().map(|t| t * factor).collect(),
            ..self.clone()
        }
    }
}

/// Indices bracketing `x` in sorted `xs` and the weight of the upper one, clamped.
fn bracket(xs: &[f64], x: f64) -> (usize, usize, f64) {
    let last = xs.len() - 1;
    if x <= xs[0] {
        return (0, 0, 0.0);
    }
    if x >= xs[last] {
        return (last, last, 0.0);
    }
    let hi = xs.partition_point(|&v| v <= x).min(last);
    let lo = hi - 1;
    (lo, hi, (x - xs[lo]) / (xs[hi] - xs[lo]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_points_come_back_exactly() {
        let t = EffTable::h200_default().unwrap();
        assert!((t.tflops(32, 128, 128) - 87.5).abs() < 1e-9);
        assert!((t.tflops(32, 16384, 16384) - 340.2).abs() < 1e-9);
        assert!((t.tflops(2, 1024, 1024) - 177.7).abs() < 1e-9);
        assert!((t.tflops(8, 65536, 65536) - 325.4).abs() < 1e-9);
    }

    #[test]
    fn interpolation_is_log_linear_and_clamped() {
        let t = EffTable::h200_default().unwrap();
        // Halfway between 128 and 256 in ln: √(128·256) ≈ 181.02 → mean of 87.5 and 125.7.
        let mid = t.tflops(32, 181, 181);
        let expect_w = ((181f64).ln() - (128f64).ln()) / ((256f64).ln() - (128f64).ln());
        assert!(
            (mid - (87.5 + expect_w * (125.7 - 87.5))).abs() < 1e-9,
            "{mid}"
        );
        // heads 4 lies halfway between 2 and 8 in ln heads.
        let h4 = t.tflops(4, 1024, 1024);
        assert!((h4 - 0.5 * (177.7 + 246.9)).abs() < 1e-9, "{h4}");
        // Clamped outside the grid.
        assert_eq!(t.tflops(32, 10, 10), 87.5);
        assert_eq!(t.tflops(64, 1 << 20, 1 << 20), 337.0);
        assert_eq!(t.tflops(1, 128, 128), 59.2);
        // q chunk of 256 against KV of 1024 → effective length 512.
        assert!((t.tflops(32, 256, 1024) - 198.0).abs() < 1e-9);
    }

    #[test]
    fn incomplete_grids_and_bad_csv_are_rejected() {
        let pts = [
            EffPoint {
                heads: 2,
                len: 128,
                tflops: 1.0,
            },
            EffPoint {
                heads: 4,
                len: 256,
                tflops: 1.0,
            },
        ];
        let e = EffTable::from_points(&pts, "cal.json").unwrap_err();
        assert!(e.to_string().contains("full grid"), "{e}");
        let e = EffTable::from_csv_str("heads,doc_len\n1,2\n", "x.csv").unwrap_err();
        assert!(e.to_string().contains("tflops"), "{e}");
        let e = EffTable::from_csv_str("heads,doc_len,tflops\n1,x,2\n", "x.csv").unwrap_err();
        assert!(e.to_string().contains("line 2"), "{e}");
    }
}
