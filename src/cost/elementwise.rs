//! The elementwise kernels of a dense layer, kind by kind: the bytes each moves (counted
//! here, as nowhere else) and each kind's time from measurement (`ElementwiseModel`: a
//! call term and an achieved rate on the counted bytes per kind and pass, fitted to
//! eager PyTorch's kernels by `validate/torch/elementwise.py` and `skewsim calibrate
//! --elementwise`).
//!
//! Bytes per token with hidden H, query width Q = h_q·d, key width K = h_kv·d and MLP
//! width I, each op counted as reading its inputs and writing its output once:
//! - `rmsnorm`: forward read x, write y (2H); backward the input gradient (read x and dy,
//!   write dx: 3H) and the weight gradient (read x and dy: 2H);
//! - `rope` (the QKV output split into q, k, v, rotate-half RoPE on q and k): forward four
//!   products, a sum and a difference over halves, the halves joined (9 elements read or
//!   written per element of Q + K); backward the products' and the difference's gradients
//!   (2 per half element) and the halves' sums (3 each): 8 per element, and dq, dk, dv
//!   joined into the QKV gradient (2 (Q + 2K));
//! - `swiglu` (the gate/up output chunked, silu(g)·u): forward SiLU (2I) and the product
//!   (3I); backward the product's two gradients and SiLU's (3I each) and the gate/up
//!   gradient joined (2 × 2I);
//! - `add` on [tokens, H] (3H): the forward's residual adds and the backward's gradient sums
//!   (a kind without a backward row of its own: its forward prices both).
//!
//! The counted bytes are a size, not a claim about the traffic: eager kernels on strided
//! views move more (or move it slower), and the fitted rate per kind carries that.

use serde::{Deserialize, Serialize};

use super::fit::MAX_HEADS;
use super::model::{MAX_HEAD_DIM, MAX_WIDTH};
use super::MAX_CALL_MS;
use crate::error::{invalid, parse_error, Result};

/// An elementwise kernel kind of a dense layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ElemKind {
    /// RMSNorm over the hidden state.
    RmsNorm,
    /// Rotate-half RoPE on the split QKV output's queries and keys.
    Rope,
    /// SiLU of the gate times the up projection.
    SwiGlu,
    /// A residual add (backward: a gradient sum).
    Add,
}

impl ElemKind {
    /// Every kind.
    pub const ALL: [ElemKind; 4] = [
        ElemKind::RmsNorm,
        ElemKind::Rope,
        ElemKind::SwiGlu,
        ElemKind::Add,
    ];

    /// The name the measurement CSVs and calibrations use.
    pub fn name(self) -> &'static str {
        match self {
            ElemKind::RmsNorm => "rmsnorm",
            ElemKind::Rope => "rope",
            ElemKind::SwiGlu => "swiglu",
            ElemKind::Add => "add",
        }
    }

    fn parse(s: &str, field: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| invalid(field, s, "rmsnorm, rope, swiglu or add"))
    }

    /// The pass whose measurement prices this kind in `bwd`: `add` has no backward kernel
    /// of its own (its forward's prices the backward's sums).
    fn priced_as(self, bwd: bool) -> bool {
        bwd && self != ElemKind::Add
    }
}

/// A layer's widths, in elements: hidden H, query Q = h_q·d, key K = h_kv·d, MLP I.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dims {
    /// Hidden size H.
    pub hidden: f64,
    /// Query width h_q·d.
    pub q: f64,
    /// Key (and value) width h_kv·d.
    pub k: f64,
    /// Dense MLP width I (0: none).
    pub mlp: f64,
    /// Bytes per element.
    pub dtype_bytes: f64,
}

/// Bytes one call of `kind` moves over `tokens` tokens (backward when `bwd`), as counted
/// in the module doc.
pub fn bytes(kind: ElemKind, bwd: bool, d: &Dims, tokens: u64) -> f64 {
    let per_token = match (kind, bwd) {
        (ElemKind::RmsNorm, false) => 2.0 * d.hidden,
        (ElemKind::RmsNorm, true) => 5.0 * d.hidden,
        (ElemKind::Rope, false) => 9.0 * (d.q + d.k),
        (ElemKind::Rope, true) => 8.0 * (d.q + d.k) + 2.0 * (d.q + 2.0 * d.k),
        (ElemKind::SwiGlu, false) => 5.0 * d.mlp,
        (ElemKind::SwiGlu, true) => 13.0 * d.mlp,
        (ElemKind::Add, _) => 3.0 * d.hidden,
    };
    tokens as f64 * per_token * d.dtype_bytes
}

/// One kind's fitted time: `call_us` + counted bytes / `bytes_per_s`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KindRate {
    /// The kind.
    pub kind: ElemKind,
    /// Backward (true) or forward.
    pub bwd: bool,
    /// Fixed time of one call, µs.
    pub call_us: f64,
    /// Achieved rate on the counted bytes.
    pub bytes_per_s: f64,
}

/// Every kind's rate (forward and backward; `add` forward only).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ElementwiseModel {
    /// One rate per (kind, pass).
    pub kinds: Vec<KindRate>,
}

/// The (kind, pass) series a model must carry.
fn series() -> impl Iterator<Item = (ElemKind, bool)> {
    ElemKind::ALL
        .into_iter()
        .flat_map(|k| [(k, false), (k, true)])
        .filter(|&(k, b)| k.priced_as(b) == b)
}

const ELEMENTWISE_H200: &str = include_str!("../../calibrations/elementwise-h200.json");

impl ElementwiseModel {
    /// Every series present once, every figure finite (rates > 0, call terms >= 0);
    /// `ctx` names the file.
    pub fn validate(&self, ctx: &str) -> Result<()> {
        for (k, b) in series() {
            let n = self
                .kinds
                .iter()
                .filter(|r| r.kind == k && r.bwd == b)
                .count();
            if n != 1 {
                return Err(invalid(
                    format!("{ctx}: kinds[{} {}]", k.name(), pass_name(b)),
                    format!("{n} entries"),
                    "exactly one",
                ));
            }
        }
        for r in &self.kinds {
            let f = format!("{ctx}: kinds[{} {}]", r.kind.name(), pass_name(r.bwd));
            if !(r.bytes_per_s.is_finite() && r.bytes_per_s > 0.0) {
                return Err(invalid(
                    format!("{f}.bytes_per_s"),
                    r.bytes_per_s,
                    "a finite rate > 0",
                ));
            }
            if !(r.call_us.is_finite() && r.call_us >= 0.0) {
                return Err(invalid(
                    format!("{f}.call_us"),
                    r.call_us,
                    "a finite time >= 0 µs",
                ));
            }
        }
        Ok(())
    }

    /// The built-in H200 model (`calibrations/elementwise-h200.json`, fitted by `skewsim
    /// calibrate --elementwise validate/results/layer_run/elementwise_fit.csv`).
    pub fn h200_default() -> Result<Self> {
        let ctx = "calibrations/elementwise-h200.json (built in)";
        let m: ElementwiseModel =
            serde_json::from_str(ELEMENTWISE_H200).map_err(|e| parse_error(ctx, e.to_string()))?;
        m.validate(ctx)?;
        Ok(m)
    }

    /// One call of `kind` over `tokens` tokens, ps.
    pub fn time_ps(&self, kind: ElemKind, bwd: bool, d: &Dims, tokens: u64) -> f64 {
        let b = kind.priced_as(bwd);
        // `validate` guarantees one rate per series.
        let r = self.kinds.iter().find(|r| r.kind == kind && r.bwd == b);
        r.map_or(0.0, |r| {
            r.call_us * 1e6 + bytes(kind, bwd, d, tokens) / r.bytes_per_s * 1e12
        })
    }
}

fn pass_name(bwd: bool) -> &'static str {
    if bwd {
        "bwd"
    } else {
        "fwd"
    }
}

/// One measured elementwise kernel kind (a row of `elementwise_*.csv`).
#[derive(Clone, Debug, PartialEq)]
pub struct ElemRow {
    /// The kind measured.
    pub kind: ElemKind,
    /// Its backward (true) or forward.
    pub bwd: bool,
    /// The model whose widths it ran at (a label).
    pub model: String,
    /// Tokens of the call.
    pub tokens: u64,
    /// The widths.
    pub dims: Dims,
    /// Median of the timed calls, ms.
    pub ms: f64,
}

const COLUMNS: [&str; 10] = [
    "kind",
    "pass",
    "model",
    "tokens",
    "hidden",
    "heads_q",
    "heads_kv",
    "head_dim",
    "intermediate",
    "median_ms",
];

/// Tokens of one measured call, at most: 16 Mi, past any sequence a kernel is timed on.
pub const MAX_CALL_TOKENS: u64 = 1 << 24;

/// Parse elementwise measurement CSV text (bf16); `context` names the file in errors.
/// Sizes are whole numbers from 1 to [`MAX_CALL_TOKENS`] and a model's limits
/// ([`MAX_WIDTH`], [`MAX_HEADS`], [`MAX_HEAD_DIM`]); times are in (0, [`MAX_CALL_MS`]].
pub fn rows_from_csv(text: &str, context: &str) -> Result<Vec<ElemRow>> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header: Vec<&str> = lines
        .next()
        .ok_or_else(|| parse_error(context, "empty file"))?
        .split(',')
        .map(str::trim)
        .collect();
    let col = |name: &str| {
        header.iter().position(|h| *h == name).ok_or_else(|| {
            invalid(
                format!("{context}: header"),
                header.join(","),
                format!("the columns {}", COLUMNS.join(",")),
            )
        })
    };
    let idx: Vec<usize> = COLUMNS.iter().map(|c| col(c)).collect::<Result<_>>()?;
    let mut rows = Vec::new();
    for (n, line) in lines.enumerate() {
        let at = format!("{context}: row {}", n + 1);
        let cells: Vec<&str> = line.split(',').map(str::trim).collect();
        let cell = |i: usize| {
            cells
                .get(idx[i])
                .copied()
                .ok_or_else(|| invalid(&at, line, format!("{} columns", header.len())))
        };
        let whole = |i: usize, max: u64| -> Result<u64> {
            let s = cell(i)?;
            s.parse::<u64>()
                .ok()
                .filter(|v| (1..=max).contains(v))
                .ok_or_else(|| {
                    invalid(
                        format!("{at}: {}", COLUMNS[i]),
                        s,
                        format!("a whole number in 1..={max}"),
                    )
                })
        };
        let width = |i: usize, max: u64| whole(i, max).map(|v| v as f64);
        let bwd = match cell(1)? {
            "fwd" => false,
            "bwd" => true,
            other => return Err(invalid(format!("{at}: pass"), other, "fwd or bwd")),
        };
        let kind = ElemKind::parse(cell(0)?, &format!("{at}: kind"))?;
        if bwd && kind == ElemKind::Add {
            return Err(invalid(
                format!("{at}: pass"),
                "bwd",
                "fwd for add (it has no backward kernel)",
            ));
        }
        let heads = u64::from(MAX_HEADS);
        let d = width(7, MAX_HEAD_DIM.into())?;
        let ms = cell(9)?;
        rows.push(ElemRow {
            kind,
            bwd,
            model: cell(2)?.to_string(),
            tokens: whole(3, MAX_CALL_TOKENS)?,
            dims: Dims {
                hidden: width(4, MAX_WIDTH.into())?,
                q: width(5, heads)? * d,
                k: width(6, heads)? * d,
                mlp: width(8, MAX_WIDTH.into())?,
                dtype_bytes: 2.0,
            },
            ms: ms
                .parse::<f64>()
                .ok()
                .filter(|v| *v > 0.0 && *v <= MAX_CALL_MS)
                .ok_or_else(|| {
                    invalid(
                        format!("{at}: median_ms"),
                        ms,
                        format!("a time in (0, {MAX_CALL_MS}] ms"),
                    )
                })?,
        });
    }
    Ok(rows)
}

/// Fit each series' call term and rate to `rows` by least squares on the relative error
/// (time = call + bytes / rate, weights 1 / measured²); a negative call term is refitted
/// as 0. Every series needs two rows of different sizes.
pub fn fit(rows: &[ElemRow]) -> Result<ElementwiseModel> {
    let mut kinds = Vec::new();
    for (k, b) in series() {
        let pts: Vec<(f64, f64)> = rows
            .iter()
            .filter(|r| r.kind == k && r.bwd == b)
            .map(|r| (bytes(k, b, &r.dims, r.tokens), r.ms * 1e-3))
            .collect();
        let distinct = pts.iter().any(|p| p.0 != pts[0].0);
        if pts.len() < 2 || !distinct {
            return Err(invalid(
                format!("elementwise measurements of {} {}", k.name(), pass_name(b)),
                format!("{} rows", pts.len()),
                "at least two rows of different sizes",
            ));
        }
        // Weighted normal equations of t = a + s·x (s = seconds per byte), weight 1/t².
        let (mut w, mut wx, mut wxx, mut wt, mut wxt) = (0.0, 0.0, 0.0, 0.0, 0.0);
        for &(x, t) in &pts {
            let v = 1.0 / (t * t);
            w += v;
            wx += v * x;
            wxx += v * x * x;
            wt += v * t;
            wxt += v * x * t;
        }
        let det = w * wxx - wx * wx;
        let (mut a, mut s) = ((wxx * wt - wx * wxt) / det, (w * wxt - wx * wt) / det);
        if a < 0.0 {
            a = 0.0;
            s = wxt / wxx;
        }
        kinds.push(KindRate {
            kind: k,
            bwd: b,
            call_us: a * 1e6,
            bytes_per_s: 1.0 / s,
        });
    }
    let m = ElementwiseModel { kinds };
    m.validate("elementwise fit")?;
    Ok(m)
}

/// Absolute percentage errors of `m` on `rows` (in row order).
pub fn errors(m: &ElementwiseModel, rows: &[ElemRow]) -> Vec<f64> {
    rows.iter()
        .map(|r| 100.0 * (m.time_ps(r.kind, r.bwd, &r.dims, r.tokens) * 1e-9 / r.ms - 1.0).abs())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims() -> Dims {
        Dims {
            hidden: 4096.0,
            q: 4096.0,
            k: 1024.0,
            mlp: 14336.0,
            dtype_bytes: 2.0,
        }
    }

    fn csv_of(m: &ElementwiseModel, tokens: &[u64]) -> String {
        let mut s = String::from(
            "kind,pass,model,tokens,hidden,heads_q,heads_kv,head_dim,intermediate,median_ms,p10_ms,p90_ms\n",
        );
        for (k, b) in series() {
            for &t in tokens {
                let ms = m.time_ps(k, b, &dims(), t) * 1e-9;
                s.push_str(&format!(
                    "{},{},llama3-8b,{t},4096,32,8,128,14336,{ms},{ms},{ms}\n",
                    k.name(),
                    pass_name(b)
                ));
            }
        }
        s
    }

    #[test]
    fn the_built_in_model_covers_every_kind_and_prices_bytes() {
        let m = ElementwiseModel::h200_default().unwrap();
        let d = dims();
        for k in ElemKind::ALL {
            for b in [false, true] {
                let t1 = m.time_ps(k, b, &d, 16384);
                let t2 = m.time_ps(k, b, &d, 32768);
                assert!(t1 > 0.0 && t2 > t1, "{k:?} {b}");
            }
        }
        // add's backward is priced as its forward.
        assert_eq!(
            m.time_ps(ElemKind::Add, true, &d, 8192),
            m.time_ps(ElemKind::Add, false, &d, 8192)
        );
        // RoPE forward: 9 elements of Q + K per token.
        assert_eq!(
            bytes(ElemKind::Rope, false, &d, 10),
            10.0 * 9.0 * 5120.0 * 2.0
        );
    }

    #[test]
    fn a_fit_recovers_the_model_that_made_the_rows() {
        let want = ElementwiseModel {
            kinds: series()
                .enumerate()
                .map(|(i, (kind, bwd))| KindRate {
                    kind,
                    bwd,
                    call_us: 5.0 + i as f64,
                    bytes_per_s: (1.0 + 0.3 * i as f64) * 1e12,
                })
                .collect(),
        };
        let rows = rows_from_csv(&csv_of(&want, &[4096, 16384, 65536]), "t").unwrap();
        let got = fit(&rows).unwrap();
        for (g, w) in got.kinds.iter().zip(&want.kinds) {
            assert_eq!((g.kind, g.bwd), (w.kind, w.bwd));
            assert!(
                (g.call_us - w.call_us).abs() < 1e-6 * w.call_us.max(1.0),
                "{g:?} {w:?}"
            );
            assert!(
                (g.bytes_per_s / w.bytes_per_s - 1.0).abs() < 1e-9,
                "{g:?} {w:?}"
            );
        }
        assert!(errors(&got, &rows).iter().all(|e| *e < 1e-6));
    }

    #[test]
    fn bad_rows_and_models_are_named() {
        let e = rows_from_csv("kind,pass\nrope,fwd\n", "f.csv")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("f.csv: header") && e.contains("median_ms"),
            "{e}"
        );
        let head =
            "kind,pass,model,tokens,hidden,heads_q,heads_kv,head_dim,intermediate,median_ms\n";
        let e = rows_from_csv(&format!("{head}gelu,fwd,m,1,1,1,1,1,1,1\n"), "f.csv")
            .unwrap_err()
            .to_string();
        assert!(e.contains("row 1: kind") && e.contains("gelu"), "{e}");
        let e = rows_from_csv(&format!("{head}add,bwd,m,1,1,1,1,1,1,1\n"), "f.csv")
            .unwrap_err()
            .to_string();
        assert!(e.contains("fwd for add"), "{e}");
        let e = rows_from_csv(&format!("{head}add,fwd,m,1,1,1,1,1,1,-3\n"), "f.csv")
            .unwrap_err()
            .to_string();
        assert!(e.contains("median_ms") && e.contains("-3"), "{e}");
        // sizes are whole numbers within their limits, times finite and at most a minute
        for (col, v) in [
            (3, "0.5"),
            (3, "1e300"),
            (3, "16777217"),
            (4, "1048577"),
            (4, "18446744073709551615"),
            (5, "1025"),
            (6, "4294967296"),
            (7, "1025"),
            (8, "1e300"),
            (9, "1e300"),
            (9, "inf"),
        ] {
            let mut cells = vec!["add", "fwd", "m", "1", "1", "1", "1", "1", "1", "1"];
            cells[col] = v;
            let e = rows_from_csv(&format!("{head}{}\n", cells.join(",")), "f.csv")
                .unwrap_err()
                .to_string();
            let name = head.trim().split(',').nth(col).unwrap();
            assert!(e.contains(&format!("row 1: {name} = {v}")), "{e}");
        }
        let rows = rows_from_csv(&format!("{head}add,fwd,m,1,1,1,1,1,1,1\n"), "f").unwrap();
        let e = fit(&rows).unwrap_err().to_string();
        assert!(e.contains("rmsnorm fwd") && e.contains("two rows"), "{e}");
        let mut m = ElementwiseModel::h200_default().unwrap();
        m.kinds.pop();
        assert!(m
            .validate("x")
            .unwrap_err()
            .to_string()
            .contains("exactly one"));
    }
}
