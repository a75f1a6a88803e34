//! The measurement record `skewsim validate` writes and `skewsim calibrate` reads: [`Measurement`] rows as CSV
//! text (format v2) in and out, each row checked on read.

use serde::{Deserialize, Serialize};

use crate::cost::{Mask, MAX_CALL_MS};
use crate::error::{invalid, parse_error, Result};

/// `n` segments of `q` queries ending at sample-local position `kv` (keys [0, kv)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegCount {
    /// Query length e − a.
    pub q: u32,
    /// KV length e.
    pub kv: u32,
    /// How many such segments.
    pub n: u32,
}

/// What a measurement row timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MeasureKind {
    /// One variable-length attention launch (a worker's head chunk).
    Attn,
    /// The chunk's dispatch bytes (Q and KV arriving), moved as one copy.
    Dispatch,
    /// The chunk's return bytes (outputs leaving), moved as one copy.
    Return,
}

impl MeasureKind {
    fn name(self) -> &'static str {
        match self {
            MeasureKind::Attn => "attn",
            MeasureKind::Dispatch => "dispatch",
            MeasureKind::Return => "return",
        }
    }
}

/// Which pass of attention an attention row timed (copy rows are `Fwd`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pass {
    /// The forward launch (O and LSE).
    Fwd,
    /// The backward launches of the same units (dQ, dK, dV: one call of three kernels plus
    /// the zeroing of the atomically accumulated dK/dV).
    Bwd,
}

impl Pass {
    fn name(self) -> &'static str {
        match self {
            Pass::Fwd => "fwd",
            Pass::Bwd => "bwd",
        }
    }
}

/// One measured launch or copy.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Measurement {
    /// Attention launch or copy.
    pub kind: MeasureKind,
    /// Forward or backward (attention rows; copies are forward).
    pub pass: Pass,
    /// The plan (file stem) or trace it came from.
    pub plan: String,
    /// The seed label the plan was made with (held-out split).
    pub seed: u64,
    /// The scheme whose plan it ran.
    pub scheme: String,
    /// The plan's step.
    pub step: u64,
    /// The group's GA index.
    pub ga: u32,
    /// The group's pool.
    pub pool: u32,
    /// The worker that ran it.
    pub worker: u32,
    /// Head chunk index m.
    pub chunk: u32,
    /// Plan work units on the worker.
    pub units: u64,
    /// Kernel units (segments) in the launch.
    pub segments: u64,
    /// Kernel query tiles in the launch (per head).
    pub tiles: u64,
    /// Query heads per call.
    pub heads: u32,
    /// KV heads per call (the `kv_heads` column; `heads` where a file has none).
    pub kv_heads: u32,
    /// Head dimension (64 or 128).
    pub head_dim: u32,
    /// Query tokens in the launch.
    pub q_tokens: u64,
    /// Forward FLOPs (attention rows).
    pub flops: f64,
    /// Bytes moved (copy rows).
    pub bytes: u64,
    /// The cost model's prediction when the row was written.
    pub predicted_ms: Option<f64>,
    /// Median of the timed repetitions.
    pub measured_ms: f64,
    /// 10th percentile of the timed repetitions.
    pub p10_ms: f64,
    /// 90th percentile of the timed repetitions.
    pub p90_ms: f64,
    /// Segment histogram (attention rows).
    pub segs: Vec<SegCount>,
    /// The mask the launch ran under (the `mask` column; causal where a file has none).
    pub mask: Mask,
}

/// The optional column after [`HEADER`]: the launch's mask, written when a row is not
/// causal.
const MASK_COLUMN: &str = "mask";

/// The first line of a measurement CSV: the format and its version.
pub const CSV_VERSION_LINE: &str = "#skewsim-measurements,v2";

pub(super) const HEADER: [&str; 24] = [
    "kind",
    "pass",
    "plan",
    "seed",
    "scheme",
    "step",
    "ga",
    "pool",
    "worker",
    "chunk",
    "units",
    "segments",
    "tiles",
    "heads",
    "kv_heads",
    "head_dim",
    "q_tokens",
    "flops",
    "bytes",
    "predicted_ms",
    "measured_ms",
    "p10_ms",
    "p90_ms",
    "segs",
];

/// Segments as `q:kv*n` joined by `;`.
pub(super) fn segs_text(segs: &[SegCount]) -> String {
    segs.iter()
        .map(|s| format!("{}:{}*{}", s.q, s.kv, s.n))
        .collect::<Vec<_>>()
        .join(";")
}

pub(super) fn parse_segs(text: &str, ctx: &str) -> Result<Vec<SegCount>> {
    if text.is_empty() {
        return Ok(Vec::new());
    }
    text.split(';')
        .map(|part| {
            let bad = || {
                invalid(
                    format!("{ctx}: segs"),
                    part,
                    "q:kv*n with 1 <= q <= kv and n >= 1",
                )
            };
            let (qkv, n) = part.split_once('*').ok_or_else(bad)?;
            let (q, kv) = qkv.split_once(':').ok_or_else(bad)?;
            let s = SegCount {
                q: q.parse().map_err(|_| bad())?,
                kv: kv.parse().map_err(|_| bad())?,
                n: n.parse().map_err(|_| bad())?,
            };
            if s.q == 0 || s.q > s.kv || s.n == 0 {
                return Err(bad());
            }
            Ok(s)
        })
        .collect()
}

/// Measurement rows as CSV text (header first).
pub fn measurements_to_csv(rows: &[Measurement]) -> Result<String> {
    let mut out = format!("{CSV_VERSION_LINE}\n").into_bytes();
    let mut w = csv::Writer::from_writer(Vec::new());
    let err = |e: csv::Error| parse_error("measurement csv", e.to_string());
    let masked = rows.iter().any(|r| !r.mask.is_causal());
    let extra: &[&str] = if masked { &[MASK_COLUMN] } else { &[] };
    w.write_record(HEADER.iter().chain(extra)).map_err(err)?;
    let opt = |x: Option<f64>| x.map(|v| format!("{v:.6}")).unwrap_or_default();
    for r in rows {
        let mut rec = vec![
            r.kind.name().to_string(),
            r.pass.name().to_string(),
            r.plan.clone(),
            r.seed.to_string(),
            r.scheme.clone(),
            r.step.to_string(),
            r.ga.to_string(),
            r.pool.to_string(),
            r.worker.to_string(),
            r.chunk.to_string(),
            r.units.to_string(),
            r.segments.to_string(),
            r.tiles.to_string(),
            r.heads.to_string(),
            r.kv_heads.to_string(),
            r.head_dim.to_string(),
            r.q_tokens.to_string(),
            format!("{:.6e}", r.flops),
            r.bytes.to_string(),
            opt(r.predicted_ms),
            format!("{:.6}", r.measured_ms),
            format!("{:.6}", r.p10_ms),
            format!("{:.6}", r.p90_ms),
            segs_text(&r.segs),
        ];
        if masked {
            rec.push(r.mask.to_string());
        }
        w.write_record(&rec).map_err(err)?;
    }
    let bytes = w
        .into_inner()
        .map_err(|e| parse_error("measurement csv", e.to_string()))?;
    out.extend(bytes);
    String::from_utf8(out).map_err(|e| parse_error("measurement csv", e.to_string()))
}

/// The text after the version line, or an error naming the version found.
pub(super) fn strip_version_line<'a>(text: &'a str, context: &str) -> Result<&'a str> {
    let (first, rest) = text.split_once('\n').unwrap_or((text, ""));
    let first = first.trim_end_matches('\r');
    if first == CSV_VERSION_LINE {
        return Ok(rest);
    }
    let allowed =
        format!("`{CSV_VERSION_LINE}` (version 2: forward and backward rows, a `pass` column)");
    if first.starts_with("kind,plan,") {
        return Err(invalid(
            format!("{context}: measurement CSV format"),
            "version 1 (no version line, no `pass` column; forward rows only, written before backward timing)",
            format!("{allowed}; re-run `skewsim validate` to measure both passes"),
        ));
    }
    if let Some(v) = first.strip_prefix("#skewsim-measurements,") {
        return Err(invalid(
            format!("{context}: measurement CSV format"),
            format!("version `{v}`"),
            allowed,
        ));
    }
    Err(invalid(
        format!("{context}: first line"),
        first,
        format!("{allowed}: is this a `skewsim validate` measurement CSV?"),
    ))
}

/// Parse measurement CSV text; `context` names the file in errors.
pub fn measurements_from_csv(text: &str, context: &str) -> Result<Vec<Measurement>> {
    let text = strip_version_line(text, context)?;
    let mut rdr = csv::Reader::from_reader(text.as_bytes());
    let headers = rdr
        .headers()
        .map_err(|e| parse_error(context, e.to_string()))?
        .clone();
    // Every column is required but `kv_heads` (a call without it has a KV head per query
    // head).
    let mut col = [None; HEADER.len()];
    for (i, name) in HEADER.iter().enumerate() {
        col[i] = headers.iter().position(|h| h == *name);
        if col[i].is_none() && *name != "kv_heads" {
            return Err(parse_error(context, format!("missing column `{name}`")));
        }
    }
    let mask_col = headers.iter().position(|h| h == MASK_COLUMN);
    let mut out = Vec::new();
    for (i, rec) in rdr.records().enumerate() {
        let rec = rec.map_err(|e| parse_error(context, e.to_string()))?;
        let line = i + 3;
        let ctx = format!("{context}: line {line}");
        let f = |k: usize| col[k].and_then(|c| rec.get(c)).unwrap_or("");
        fn num<T: std::str::FromStr>(s: &str, ctx: &str, name: &str) -> Result<T> {
            s.parse::<T>()
                .map_err(|_| invalid(format!("{ctx}: {name}"), s, "a number"))
        }
        let kind = match f(0) {
            "attn" => MeasureKind::Attn,
            "dispatch" => MeasureKind::Dispatch,
            "return" => MeasureKind::Return,
            other => {
                return Err(invalid(
                    format!("{ctx}: kind"),
                    other,
                    "attn, dispatch or return",
                ))
            }
        };
        let time = |k: usize, name: &str| -> Result<f64> {
            let v: f64 = num(f(k), &ctx, name)?;
            if !(0.0..=MAX_CALL_MS).contains(&v) {
                return Err(invalid(
                    format!("{ctx}: {name}"),
                    v,
                    format!("a time in [0, {MAX_CALL_MS}] ms"),
                ));
            }
            Ok(v)
        };
        let pass = match f(1) {
            "fwd" => Pass::Fwd,
            "bwd" => Pass::Bwd,
            other => return Err(invalid(format!("{ctx}: pass"), other, "fwd or bwd")),
        };
        if pass == Pass::Bwd && kind != MeasureKind::Attn {
            return Err(invalid(
                format!("{ctx}: pass"),
                "bwd",
                "fwd for dispatch and return rows (only attention rows have a backward)",
            ));
        }
        let heads = num(f(13), &ctx, "heads")?;
        let m = Measurement {
            kind,
            pass,
            plan: f(2).to_string(),
            seed: num(f(3), &ctx, "seed")?,
            scheme: f(4).to_string(),
            step: num(f(5), &ctx, "step")?,
            ga: num(f(6), &ctx, "ga")?,
            pool: num(f(7), &ctx, "pool")?,
            worker: num(f(8), &ctx, "worker")?,
            chunk: num(f(9), &ctx, "chunk")?,
            units: num(f(10), &ctx, "units")?,
            segments: num(f(11), &ctx, "segments")?,
            tiles: num(f(12), &ctx, "tiles")?,
            heads,
            kv_heads: match f(14) {
                "" => heads,
                s => num(s, &ctx, "kv_heads")?,
            },
            head_dim: num(f(15), &ctx, "head_dim")?,
            q_tokens: num(f(16), &ctx, "q_tokens")?,
            flops: num(f(17), &ctx, "flops")?,
            bytes: num(f(18), &ctx, "bytes")?,
            predicted_ms: match f(19) {
                "" => None,
                s => Some(num(s, &ctx, "predicted_ms")?),
            },
            measured_ms: time(20, "measured_ms")?,
            p10_ms: time(21, "p10_ms")?,
            p90_ms: time(22, "p90_ms")?,
            segs: parse_segs(f(23), &ctx)?,
            mask: match mask_col.and_then(|c| rec.get(c)).unwrap_or("") {
                "" => Mask::Causal,
                s => Mask::parse(s, &format!("{ctx}: mask"))?,
            },
        };
        check_row(&m, &ctx)?;
        out.push(m);
    }
    Ok(out)
}

/// Head dimensions the measured kernels run (`validate/kernels`).
pub const HEAD_DIMS: [u32; 2] = [64, 128];
/// Query heads per measured call, at most.
pub const MAX_HEADS: u32 = 1024;
/// A segment's key length (sample-local position), at most: 16M tokens.
pub const MAX_KV: u32 = 1 << 24;
/// Key tiles of 64 tokens per head of one measured call (Σ n·⌈kv/64⌉), at most: what the
/// block models enumerate (two launches' blocks, ~24 bytes each).
pub const MAX_KEY_TILES: u64 = 1 << 22;

/// A parsed row's values within what the kernels and the fit can take.
pub(super) fn check_row(m: &Measurement, ctx: &str) -> Result<()> {
    if m.kind == MeasureKind::Attn && !HEAD_DIMS.contains(&m.head_dim) {
        return Err(invalid(format!("{ctx}: head_dim"), m.head_dim, "64 or 128"));
    }
    if m.kind == MeasureKind::Attn && !(1..=MAX_HEADS).contains(&m.heads) {
        return Err(invalid(
            format!("{ctx}: heads"),
            m.heads,
            format!("1 to {MAX_HEADS} query heads per call"),
        ));
    }
    if m.kind == MeasureKind::Attn && (m.kv_heads == 0 || m.heads % m.kv_heads.max(1) != 0) {
        return Err(invalid(
            format!("{ctx}: kv_heads"),
            m.kv_heads,
            format!("a divisor of the row's {} query heads", m.heads),
        ));
    }
    if !(m.flops.is_finite() && m.flops >= 0.0) {
        return Err(invalid(
            format!("{ctx}: flops"),
            m.flops,
            "a finite number >= 0",
        ));
    }
    if let Some(p) = m.predicted_ms.filter(|p| !(0.0..=MAX_CALL_MS).contains(p)) {
        return Err(invalid(
            format!("{ctx}: predicted_ms"),
            p,
            format!("a time in [0, {MAX_CALL_MS}] ms or empty"),
        ));
    }
    if let Some(s) = m.segs.iter().find(|s| s.kv > MAX_KV) {
        return Err(invalid(
            format!("{ctx}: segs"),
            format!("{}:{}*{}", s.q, s.kv, s.n),
            format!("key lengths kv <= {MAX_KV}"),
        ));
    }
    let tiles: u64 = m
        .segs
        .iter()
        .map(|s| u64::from(s.n) * u64::from(s.kv).div_ceil(64))
        .sum();
    if tiles > MAX_KEY_TILES {
        return Err(invalid(
            format!("{ctx}: segs"),
            format!("{tiles} key tiles of 64 tokens (Σ n·⌈kv/64⌉)"),
            format!("at most {MAX_KEY_TILES} per call"),
        ));
    }
    Ok(())
}
