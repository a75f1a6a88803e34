//! Cost: the one place a FLOP or a byte of work is counted and priced.
//!
//! Owns the model shapes ([`model`]), the attention-kernel efficiency table ([`kernel`]),
//! the per-GPU memory model ([`memory`]) and the [`CostModel`] that turns work into
//! picoseconds on one GPU. It does no I/O: model, CSV and calibration *text* are parsed
//! here, files are read at the edge (CLI).
//!
//! What it prices (per layer, per rank):
//! - linear work per token: QKV and O projections, the MLP or the routed experts (top-k
//!   expert GEMMs plus the router), 2 FLOPs per multiply–add, at a GEMM efficiency of the
//!   GPU's peak; RMSNorms as memory-bound (read + write of the hidden state at HBM speed).
//!   Backward = 2 × forward FLOPs (input and weight gradients).
//! - core attention: exact query–key pairs under the layer's mask ([`mask`]: causal,
//!   sliding window, chunked, block-sparse) × 4 × heads × head_dim FLOPs forward (Libra
//!   Eq. 8 with the mask's pairs), priced document by document at the kernel efficiency
//!   the table gives for the query length, the keys the queries reach and the heads per
//!   call; a model whose layers mix masks is priced per mask class ([`CostModel::for_mask`]);
//!   backward = `attn_bwd_flop_factor` × forward FLOPs (2.5 for FlashAttention-2: five
//!   GEMMs against two) at `attn_bwd_efficiency` × the forward efficiency — or, when a
//!   calibration file carries a measured backward table (`attn_bwd`), at that table's
//!   rate for the same (heads, query length, KV length) ([`attn_bwd_segment_ps_f`]).
//! - one forward kernel launch: the sum of its segments' prices — or, when a calibration
//!   fitted the kernel's block model (`attn_blocks`, [`blocks`]), the makespan of its
//!   thread blocks on the SMs; one backward call likewise (`attn_bwd_blocks`: per query
//!   row·head work plus the dQ and the dK/dV launches' makespans).
//!
//! Architecture invariant: planners (balance/), the schedule and the GPU validator price
//! work through this module only, so the planner's estimate, the engine's duration and the
//! validator's prediction agree by construction. Calibration changes parameters here,
//! never formulas elsewhere.

pub mod blocks;
pub mod elementwise;
pub mod fit;
pub mod fit_window;
pub mod gemm;
pub mod gpu;
pub mod kernel;
pub mod layer;
pub mod mask;
pub mod memory;
pub mod model;
pub mod profile;

use serde::{Deserialize, Serialize};

use crate::error::{invalid, parse_error, Result};
use crate::net::Ps;
pub use blocks::{BlockModel, BwdBlockModel};
pub use kernel::{EffPoint, EffTable};
pub use mask::{AttentionPattern, Mask};
pub use model::{Ffn, ModelConfig};

/// The text of the built-in `name` among `table` (name, text); unknown: an error naming
/// `field`, the value and the built-ins, then `or_else` (what else is allowed).
pub(crate) fn builtin_text(
    table: &[(&'static str, &'static str)],
    field: &str,
    name: &str,
    or_else: &str,
) -> Result<&'static str> {
    table
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, t)| *t)
        .ok_or_else(|| {
            let names: Vec<&str> = table.iter().map(|(n, _)| *n).collect();
            invalid(field, name, format!("one of {}{or_else}", names.join(", ")))
        })
}

/// One measured call's time, at most, in every measurement file (attention, copies, GEMMs,
/// elementwise): a minute; the timed kernels take µs to s.
pub const MAX_CALL_MS: f64 = 60_000.0;

/// The shape of one attention layer, as far as counting FLOPs and bytes needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttnShape {
    /// Query heads h_q.
    pub heads_q: u32,
    /// Key/value heads h_kv (grouped-query attention: h_q is a multiple of h_kv).
    pub heads_kv: u32,
    /// Head dimension.
    pub head_dim: u32,
    /// Bytes per element of Q, K, V and the output (2 for bf16).
    pub dtype_bytes: u32,
    /// Which keys each query attends ([`Mask`]); left out: causal.
    #[serde(default, skip_serializing_if = "Mask::is_causal")]
    pub mask: Mask,
}

impl AttnShape {
    /// Forward FLOPs of core attention per query–key pair the mask keeps and per query
    /// head: 2·d for QKᵀ and 2·d for PV.
    pub fn fwd_flops_per_pair_head(&self) -> f64 {
        4.0 * f64::from(self.head_dim)
    }

    /// Forward FLOPs of `pairs` query–key pairs over `heads` query heads.
    pub fn fwd_flops(&self, pairs: u64, heads: u32) -> f64 {
        pairs as f64 * f64::from(heads) * self.fwd_flops_per_pair_head()
    }

    /// Bytes of K and V for `tokens` tokens over `kv_heads` KV heads.
    pub fn kv_bytes(&self, tokens: u64, kv_heads: u32) -> u64 {
        2 * tokens * u64::from(kv_heads) * u64::from(self.head_dim) * u64::from(self.dtype_bytes)
    }

    /// Bytes of Q (or of the attention output) for `tokens` tokens over `heads` query heads.
    pub fn q_bytes(&self, tokens: u64, heads: u32) -> u64 {
        tokens * u64::from(heads) * u64::from(self.head_dim) * u64::from(self.dtype_bytes)
    }
}

/// The GPU's throughput figures that are not in the attention table.
///
/// Defaults are an H200 SXM: 989 TFLOP/s dense bf16 peak and 4.8 TB/s HBM3e (NVIDIA H200
/// datasheet), 141 GB of memory. The GEMM efficiencies and the attention backward figures
/// are assumptions (not measured here) until a calibration file replaces them.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Hardware {
    /// Dense bf16 peak, TFLOP/s (the MFU denominator).
    pub peak_tflops: f64,
    /// Fraction of peak a dense projection/MLP GEMM reaches.
    pub gemm_efficiency: f64,
    /// Fraction of peak the grouped expert GEMMs reach.
    pub moe_gemm_efficiency: f64,
    /// HBM bandwidth, bytes/s (prices the memory-bound norms).
    pub hbm_bytes_per_s: f64,
    /// Attention backward FLOPs as a multiple of forward.
    pub attn_bwd_flop_factor: f64,
    /// Attention backward efficiency as a fraction of the forward efficiency.
    pub attn_bwd_efficiency: f64,
    /// GPU memory capacity in bytes.
    pub memory_bytes: u64,
}

impl Default for Hardware {
    fn default() -> Self {
        Self {
            peak_tflops: 989.0,
            gemm_efficiency: 0.6,
            moe_gemm_efficiency: 0.4,
            hbm_bytes_per_s: 4.8e12,
            attn_bwd_flop_factor: 2.5,
            attn_bwd_efficiency: 0.8,
            memory_bytes: 141_000_000_000,
        }
    }
}

impl Hardware {
    fn validate(&self, ctx: &str) -> Result<()> {
        let checks = [
            ("peak_tflops", self.peak_tflops, f64::INFINITY),
            ("gemm_efficiency", self.gemm_efficiency, 1.0),
            ("moe_gemm_efficiency", self.moe_gemm_efficiency, 1.0),
            ("hbm_bytes_per_s", self.hbm_bytes_per_s, f64::INFINITY),
            (
                "attn_bwd_flop_factor",
                self.attn_bwd_flop_factor,
                f64::INFINITY,
            ),
            ("attn_bwd_efficiency", self.attn_bwd_efficiency, 1.0),
        ];
        for (f, v, max) in checks {
            if !(v.is_finite() && v > 0.0 && v <= max) {
                return Err(invalid(
                    format!("{ctx}: {f}"),
                    v,
                    format!("a number in (0, {max}]"),
                ));
            }
        }
        if self.memory_bytes == 0 {
            return Err(invalid(
                format!("{ctx}: memory_bytes"),
                0,
                "a positive byte count",
            ));
        }
        Ok(())
    }
}

/// A calibration file (JSON): the attention grid measured on the target GPU, and any
/// hardware figures to override.
///
/// ```json
/// { "attn_fwd": [{"heads": 8, "len": 1024, "tflops": 250.0}, ...],
///   "hardware": {"gemm_efficiency": 0.55} }
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Calibration {
    /// Forward attention efficiency points (a full heads × len grid).
    pub attn_fwd: Vec<EffPoint>,
    /// Backward attention efficiency points (a full heads × len grid; TFLOP/s counting
    /// `attn_bwd_flop_factor` × the forward FLOPs), measured by `skewsim calibrate`. When
    /// present it replaces `attn_bwd_efficiency` wherever the backward is priced per
    /// segment ([`attn_bwd_segment_ps_f`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attn_bwd: Option<Vec<EffPoint>>,
    /// Hardware figures; the ones left out keep the defaults.
    #[serde(default)]
    pub hardware: Hardware,
    /// Per-launch and copy terms fitted by `skewsim calibrate` ([`fit`]); defaults when
    /// left out.
    #[serde(default)]
    pub launch: LaunchCosts,
    /// The forward kernel's block model ([`blocks`]: its thread blocks list-scheduled onto
    /// the SMs), fitted by `skewsim calibrate`; when present it prices every forward launch
    /// instead of the table. Absent: the table alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attn_blocks: Option<BlockModel>,
    /// The backward kernels' block model ([`blocks::BwdBlockModel`]: per call the dot and
    /// zeroing work per query row × head, then the dQ and the dK/dV launches' blocks on the
    /// SMs), fitted by `skewsim calibrate`; when present it prices every backward call
    /// instead of the backward table, with `launch.attn_bwd_launch_us` per call. Absent:
    /// the table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attn_bwd_blocks: Option<BwdBlockModel>,
}

/// Fixed costs a measured GPU adds to the table's compute time: the attention
/// launch overhead, the device-to-device copy rate and overhead, and run-to-run jitter.
/// Defaults: no launch overhead (the table alone, as the engine prices), copies at half
/// the HBM rate (a copy reads and writes every byte), no jitter figure.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LaunchCosts {
    /// Fixed time of one attention kernel launch, µs.
    pub attn_launch_us: f64,
    /// Fixed time of one attention backward call (its launches and the zeroing of dK/dV),
    /// µs; used with a backward table (`Calibration::attn_bwd`) or block model
    /// (`Calibration::attn_bwd_blocks`), else `attn_launch_us`.
    pub attn_bwd_launch_us: f64,
    /// Fixed time of one copy, µs.
    pub copy_launch_us: f64,
    /// Bytes copied per second (device-to-device on one GPU).
    pub copy_bytes_per_s: f64,
    /// Lognormal σ of run-to-run time of one launch (ln units), when measured.
    pub jitter_sigma: Option<f64>,
}

impl Default for LaunchCosts {
    fn default() -> Self {
        Self {
            attn_launch_us: 0.0,
            attn_bwd_launch_us: 0.0,
            copy_launch_us: 0.0,
            copy_bytes_per_s: Hardware::default().hbm_bytes_per_s / 2.0,
            jitter_sigma: None,
        }
    }
}

impl LaunchCosts {
    fn validate(&self, ctx: &str) -> Result<()> {
        for (f, v) in [
            ("attn_launch_us", self.attn_launch_us),
            ("attn_bwd_launch_us", self.attn_bwd_launch_us),
            ("copy_launch_us", self.copy_launch_us),
            ("jitter_sigma", self.jitter_sigma.unwrap_or(0.0)),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(invalid(
                    format!("{ctx}: launch.{f}"),
                    v,
                    "a finite number >= 0",
                ));
            }
        }
        if !(self.copy_bytes_per_s.is_finite() && self.copy_bytes_per_s > 0.0) {
            return Err(invalid(
                format!("{ctx}: launch.copy_bytes_per_s"),
                self.copy_bytes_per_s,
                "a finite rate > 0",
            ));
        }
        Ok(())
    }
}

impl Calibration {
    /// Parse a calibration file's text; `context` names the file in errors.
    pub fn from_json_str(text: &str, context: &str) -> Result<Self> {
        let c: Calibration =
            serde_json::from_str(text).map_err(|e| parse_error(context, e.to_string()))?;
        c.hardware.validate(context)?;
        c.launch.validate(context)?;
        EffTable::from_points(&c.attn_fwd, context)?;
        if let Some(b) = &c.attn_bwd {
            EffTable::from_points(b, &format!("{context}: attn_bwd"))?;
        }
        if let Some(b) = &c.attn_blocks {
            b.validate(context)?;
        }
        if let Some(b) = &c.attn_bwd_blocks {
            b.validate(context)?;
        }
        Ok(c)
    }
}

/// Forward time, in ps (unrounded), of the queries [start, end) of one sample — keys
/// [key_start(start), end) under the shape's mask; [0, end) causal — over `heads` query
/// heads of one call: exact pairs × FLOPs per pair at the table's rate for (heads, query
/// length, KV length = the keys reached). The one attention-time formula: whole documents
/// ([`CostModel::attn_fwd_ps`]), plan units (`schedule::plan_attn`) and measured launches
/// (`fit`) all price through it.
pub fn attn_segment_ps_f(
    eff: &EffTable,
    shape: &AttnShape,
    heads: u32,
    start: u64,
    end: u64,
) -> f64 {
    let pairs = shape.mask.range_pairs(start, end);
    if pairs == 0 {
        return 0.0;
    }
    let (lo, _) = shape.mask.reach(start, end);
    shape.fwd_flops(pairs, heads) / eff.tflops(heads, end - start, end - lo)
}

/// Backward time, in ps (unrounded), of the same segment as [`attn_segment_ps_f`]:
/// `attn_bwd_flop_factor` × its forward FLOPs at the backward table's rate when there is
/// one (a calibration measured it), else the forward time × factor / `attn_bwd_efficiency`.
pub fn attn_bwd_segment_ps_f(
    fwd: &EffTable,
    bwd: Option<&EffTable>,
    hw: &Hardware,
    shape: &AttnShape,
    heads: u32,
    start: u64,
    end: u64,
) -> f64 {
    match bwd {
        Some(b) => attn_segment_ps_f(b, shape, heads, start, end) * hw.attn_bwd_flop_factor,
        None => {
            attn_segment_ps_f(fwd, shape, heads, start, end) * hw.attn_bwd_flop_factor
                / hw.attn_bwd_efficiency
        }
    }
}

/// How the heads of one layer are divided across a CP group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadSplit {
    /// Query heads per rank.
    pub q: u32,
    /// KV heads per rank (≥ 1; replicated when CP > h_kv).
    pub kv: u32,
}

/// Divide the heads over `cp` ranks, or say why they do not divide.
/// (DeepSpeed-Ulysses: every rank computes h_q/CP whole query heads and the KV heads they
/// map to; KV heads are replicated when CP exceeds h_kv.)
pub fn head_split(heads_q: u32, heads_kv: u32, cp: u32) -> Result<HeadSplit> {
    if cp == 0 || heads_q % cp != 0 {
        return Err(invalid(
            "cp",
            cp,
            format!(
                "a divisor of the model's {heads_q} query heads (Ulysses gives each rank whole \
                 heads): {}",
                divisors(heads_q)
            ),
        ));
    }
    let kv = if heads_kv >= cp {
        if heads_kv % cp != 0 {
            return Err(invalid(
                "cp",
                cp,
                format!("a divisor or a multiple of the model's {heads_kv} KV heads"),
            ));
        }
        heads_kv / cp
    } else {
        if cp % heads_kv != 0 {
            return Err(invalid(
                "cp",
                cp,
                format!("a divisor or a multiple of the model's {heads_kv} KV heads"),
            ));
        }
        1
    };
    Ok(HeadSplit {
        q: heads_q / cp,
        kv,
    })
}

fn divisors(n: u32) -> String {
    let d: Vec<String> = (1..=n)
        .filter(|d| n % d == 0)
        .map(|d| d.to_string())
        .collect();
    d.join(", ")
}

/// A piece of a layer's linear work between tensor- or expert-parallel collectives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinearPiece {
    /// Input RMSNorm and the Q, K, V projections (column-parallel under TP).
    Qkv,
    /// The O projection (row-parallel under TP).
    OutProj,
    /// Post-attention RMSNorm and the MLP (column- then row-parallel), or an MoE layer's
    /// router, its shared experts and every token's top-k experts.
    Ffn,
    /// Post-attention RMSNorm and an MoE layer's router alone (the experts run after the
    /// expert-parallel dispatch).
    Router,
}

/// Which linear block of a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinearPart {
    /// Input RMSNorm and the Q, K, V projections (before core attention).
    PreAttn,
    /// O projection, post-attention RMSNorm and the MLP or experts (after core attention).
    PostAttn,
}

/// Prices work on one GPU: the model, the hardware and the attention efficiency table.
#[derive(Clone, Debug)]
pub struct CostModel {
    /// The model.
    pub model: ModelConfig,
    /// The GPU's figures.
    pub hw: Hardware,
    /// Forward attention kernel efficiency.
    pub attn_eff: EffTable,
    /// Measured backward efficiency (a calibration's `attn_bwd`), else `None`: the backward
    /// is then the forward × `attn_bwd_flop_factor` / `attn_bwd_efficiency`.
    pub attn_bwd_eff: Option<EffTable>,
    /// Fixed per-launch costs (zero unless a calibration file measured them).
    pub launch: LaunchCosts,
    /// The forward kernel's block model (a calibration's `attn_blocks`), else `None`.
    pub attn_blocks: Option<BlockModel>,
    /// The backward kernels' block model (a calibration's `attn_bwd_blocks`), else `None`.
    pub attn_bwd_blocks: Option<BwdBlockModel>,
    /// Block prices of launches already priced (shared by clones; keyed by the model too).
    launch_memo: blocks::LaunchMemo,
    /// The GEMM model ([`gemm`]) pricing linear work by shape, else `None`: FLOPs at the
    /// GEMM efficiencies of `hw`.
    pub gemm: Option<gemm::GemmModel>,
    /// The elementwise model ([`elementwise`]) pricing a layer's elementwise kernels by
    /// kind ([`CostModel::layer_time`]), else `None`: their counted bytes at `hw`'s HBM rate.
    pub elementwise: Option<elementwise::ElementwiseModel>,
    /// The linear layers' GEMM precision ([`gpu::precision`]; BF16 unless
    /// [`CostModel::with_precision`] set FP8).
    pub precision: gpu::Precision,
    /// How much faster an FP8 GEMM runs than a BF16 one on this GPU (1 under BF16).
    pub fp8_gemm_speedup: f64,
    /// The ratios this model's measured figures were carried to another GPU by
    /// ([`CostModel::for_gpu`]), else `None`: measured on the GPU it prices.
    pub derived: Option<gpu::Scaling>,
}

impl CostModel {
    /// The model on an H200 with the built-in measured attention table.
    pub fn h200(model: ModelConfig) -> Result<Self> {
        Ok(Self {
            model,
            hw: Hardware::default(),
            attn_eff: EffTable::h200_default()?,
            attn_bwd_eff: None,
            launch: LaunchCosts::default(),
            attn_blocks: None,
            attn_bwd_blocks: None,
            launch_memo: blocks::LaunchMemo::default(),
            gemm: None,
            elementwise: None,
            precision: gpu::Precision::Bf16,
            fp8_gemm_speedup: 1.0,
            derived: None,
        })
    }

    /// The same prices with attention priced by the built-in measured table of whole
    /// launches ([`EffTable::h200_default`]: PyTorch's varlen FlashAttention-2 on an H200,
    /// 64K tokens per launch at each heads × document length; backward = forward ×
    /// `attn_bwd_flop_factor` / `attn_bwd_efficiency`) instead of the thread-block models:
    /// every launch runs at the measured rate of its shape, so none waits on its longest
    /// thread block (as a split-KV kernel would not).
    pub fn by_measured_table(&self) -> Result<Self> {
        let table = EffTable::h200_default()?;
        Ok(Self {
            attn_eff: match &self.derived {
                Some(s) => s.table(&table),
                None => table,
            },
            attn_bwd_eff: None,
            attn_blocks: None,
            attn_bwd_blocks: None,
            ..self.clone()
        })
    }

    /// The model priced with a calibration file's table and hardware figures.
    pub fn calibrated(model: ModelConfig, cal: &Calibration, context: &str) -> Result<Self> {
        cal.hardware.validate(context)?;
        if let Some(b) = &cal.attn_blocks {
            b.validate(context)?;
        }
        if let Some(b) = &cal.attn_bwd_blocks {
            b.validate(context)?;
        }
        Ok(Self {
            model,
            hw: cal.hardware,
            attn_eff: EffTable::from_points(&cal.attn_fwd, context)?,
            attn_bwd_eff: cal
                .attn_bwd
                .as_deref()
                .map(|b| EffTable::from_points(b, &format!("{context}: attn_bwd")))
                .transpose()?,
            launch: cal.launch.clone(),
            attn_blocks: cal.attn_blocks,
            attn_bwd_blocks: cal.attn_bwd_blocks,
            launch_memo: blocks::LaunchMemo::default(),
            gemm: None,
            elementwise: None,
            precision: gpu::Precision::Bf16,
            fp8_gemm_speedup: 1.0,
            derived: None,
        })
    }

    /// The same model with linear work priced by `g`'s GEMM shapes.
    pub fn with_gemm(self, g: gemm::GemmModel) -> Self {
        Self {
            gemm: Some(g),
            ..self
        }
    }

    /// The same model with a layer's elementwise kernels priced by `e`.
    pub fn with_elementwise(self, e: elementwise::ElementwiseModel) -> Self {
        Self {
            elementwise: Some(e),
            ..self
        }
    }

    /// The forward GEMMs of one piece over `tokens` tokens as (M, N, K, dense): the
    /// projections token-major, an MoE layer's experts as one grouped GEMM over every
    /// routed copy.
    fn piece_gemms(&self, piece: LinearPiece, tokens: u64) -> Vec<(u64, u64, u64, bool)> {
        let m = &self.model;
        let (h, d) = (u64::from(m.hidden), u64::from(m.head_dim));
        let (q, kv) = (u64::from(m.heads_q), u64::from(m.heads_kv));
        let t = tokens;
        match (piece, m.ffn) {
            (LinearPiece::Qkv, _) => vec![(t, (q + 2 * kv) * d, h, true)],
            (LinearPiece::OutProj, _) => vec![(t, h, q * d, true)],
            (LinearPiece::Ffn, Ffn::Dense { intermediate }) => {
                let i = u64::from(intermediate);
                vec![(t, 2 * i, h, true), (t, h, i, true)]
            }
            (LinearPiece::Ffn, Ffn::Moe { experts, top_k, .. }) => {
                let mut g = vec![(t, u64::from(experts), h, true)];
                g.extend(self.expert_gemms(t * u64::from(top_k)));
                g
            }
            (LinearPiece::Router, Ffn::Dense { .. }) => Vec::new(),
            (LinearPiece::Router, Ffn::Moe { experts, .. }) => {
                vec![(t, u64::from(experts), h, true)]
            }
        }
    }

    /// The expert GEMMs over `copies` routed token copies: gate and up, then down.
    fn expert_gemms(&self, copies: u64) -> Vec<(u64, u64, u64, bool)> {
        match self.model.ffn {
            Ffn::Dense { .. } => Vec::new(),
            Ffn::Moe {
                expert_intermediate,
                ..
            } => {
                let (h, i) = (u64::from(self.model.hidden), u64::from(expert_intermediate));
                vec![(copies, 2 * i, h, false), (copies, h, i, false)]
            }
        }
    }

    /// Time of `gemms`, forward or backward (input gradient M × N by N × K and weight
    /// gradient K × M by M × N), in ps: by the GEMM model's shapes, else FLOPs at the
    /// GEMM efficiencies.
    fn gemms_ps_f(&self, gemms: &[(u64, u64, u64, bool)], bwd: bool) -> f64 {
        gemms
            .iter()
            .map(|&(m, n, k, dense)| {
                let t = match &self.gemm {
                    Some(g) if bwd => g.time_ps(m, k, n) + g.time_ps(k, n, m),
                    Some(g) => g.time_ps(m, n, k),
                    None => {
                        let f = 2.0 * (m * n * k) as f64 * if bwd { 2.0 } else { 1.0 };
                        if dense {
                            self.gemm_ps_f(f, 0.0)
                        } else {
                            self.gemm_ps_f(0.0, f)
                        }
                    }
                };
                t + self.cast_ps(m, n, k, bwd)
            })
            .sum()
    }

    /// The FP8 quantization of one GEMM's activation (forward) or output gradient
    /// (backward) at the HBM rate, ps; 0 under BF16 ([`gpu::precision::cast_bytes`]).
    fn cast_ps(&self, m: u64, n: u64, k: u64, bwd: bool) -> f64 {
        match self.precision {
            gpu::Precision::Bf16 => 0.0,
            gpu::Precision::Fp8 => {
                gpu::precision::cast_bytes(m, n, k, bwd) / self.hw.hbm_bytes_per_s * 1e12
            }
        }
    }

    /// The attention shape a step's plan is made for ([`ModelConfig::attn_shape`]).
    pub fn attn(&self) -> AttnShape {
        self.model.attn_shape()
    }

    /// The cost model of the layers of one mask: the same model and GPU with every layer
    /// under `mask` (what a layer class of a mixed model is priced with).
    pub fn for_mask(&self, mask: Mask) -> CostModel {
        let mut c = self.clone();
        c.model.attention = AttentionPattern::new(vec![mask]);
        c
    }

    /// The model's mask classes (distinct masks in order of first use, with their layer
    /// counts), each with its cost model ([`CostModel::for_mask`]; a causal model: itself).
    pub fn mask_classes(&self) -> Vec<(Mask, u32, CostModel)> {
        let classes = self.model.attention.classes(self.model.layers);
        if classes.len() == 1 && classes[0].0 == self.attn().mask {
            return vec![(classes[0].0, classes[0].1, self.clone())];
        }
        classes
            .into_iter()
            .map(|(m, n)| (m, n, self.for_mask(m)))
            .collect()
    }

    /// Forward FLOPs of one linear block for `tokens` tokens, split into (dense GEMM,
    /// expert GEMM) FLOPs.
    pub fn linear_fwd_flops(&self, part: LinearPart, tokens: u64) -> (f64, f64) {
        match part {
            LinearPart::PreAttn => self.piece_fwd_flops(LinearPiece::Qkv, tokens),
            LinearPart::PostAttn => {
                let (o, _) = self.piece_fwd_flops(LinearPiece::OutProj, tokens);
                let (dense, moe) = self.piece_fwd_flops(LinearPiece::Ffn, tokens);
                (o + dense, moe)
            }
        }
    }

    /// Forward FLOPs of one piece of a layer's linear work for `tokens` tokens, split into
    /// (dense GEMM, expert GEMM) FLOPs. `Ffn` of an MoE layer is the router and the shared
    /// experts (dense GEMMs) plus every token's top-k experts; `Router` the router alone
    /// (under expert parallelism the routed experts run on the tokens they receive:
    /// [`CostModel::experts_fwd_ps_f`]; the shared ones on the TP group's tokens:
    /// [`CostModel::shared_experts_fwd_ps_f`]).
    pub fn piece_fwd_flops(&self, piece: LinearPiece, tokens: u64) -> (f64, f64) {
        let m = &self.model;
        let t = tokens as f64;
        let h = f64::from(m.hidden);
        let d = f64::from(m.head_dim);
        match piece {
            LinearPiece::Qkv => (2.0 * t * h * d * f64::from(m.heads_q + 2 * m.heads_kv), 0.0),
            LinearPiece::OutProj => (2.0 * t * h * d * f64::from(m.heads_q), 0.0),
            LinearPiece::Ffn => match m.ffn {
                Ffn::Dense { .. } => (2.0 * t * m.ffn_active_params() as f64, 0.0),
                Ffn::Moe { experts, .. } => {
                    let dense = h * f64::from(experts) + m.shared_expert_params() as f64;
                    let experts_p = m.ffn_active_params() as f64 - dense;
                    (2.0 * t * dense, 2.0 * t * experts_p)
                }
            },
            LinearPiece::Router => match m.ffn {
                Ffn::Dense { .. } => (0.0, 0.0),
                Ffn::Moe { experts, .. } => (2.0 * t * (h * f64::from(experts)), 0.0),
            },
        }
    }

    /// Forward time of one piece over `tokens` tokens (its GEMMs at the GEMM efficiencies),
    /// plus its RMSNorm over `norm_tokens` (the pieces that start with one: QKV and the
    /// feed-forward; `norm_tokens` = tokens / TP under sequence parallelism), in ps.
    pub fn piece_fwd_ps_f(&self, piece: LinearPiece, tokens: u64, norm_tokens: u64) -> f64 {
        self.piece_gemm_ps_f(piece, tokens) + self.piece_elem_ps(piece, tokens, norm_tokens, false)
    }

    /// Forward time of one piece's GEMMs over `tokens` tokens, ps: by the GEMM model's
    /// shapes, else its FLOPs at the GEMM efficiencies.
    fn piece_gemm_ps_f(&self, piece: LinearPiece, tokens: u64) -> f64 {
        match &self.gemm {
            Some(_) => self.gemms_ps_f(&self.piece_gemms(piece, tokens), false),
            None => {
                let (dense, moe) = self.piece_fwd_flops(piece, tokens);
                self.gemm_ps_f(dense, moe)
            }
        }
    }

    /// Forward time of the expert GEMMs of one MoE layer over `copies` routed token copies
    /// (a token sent to k experts is k copies), each copy through one whole expert, in ps.
    pub fn experts_fwd_ps_f(&self, copies: u64) -> f64 {
        match self.model.ffn {
            Ffn::Dense { .. } => 0.0,
            Ffn::Moe {
                expert_intermediate,
                ..
            } if self.gemm.is_none() => {
                let f = 2.0
                    * copies as f64
                    * 3.0
                    * f64::from(self.model.hidden)
                    * f64::from(expert_intermediate);
                self.gemm_ps_f(0.0, f)
            }
            Ffn::Moe { .. } => self.gemms_ps_f(&self.expert_gemms(copies), false),
        }
    }

    /// Forward time of one MoE layer's shared experts over `tokens` tokens (every token runs
    /// each of them; on a TP rank's model their intermediate size is already / TP, so
    /// `tokens` is the TP group's), at the dense GEMM efficiency, in ps.
    pub fn shared_experts_fwd_ps_f(&self, tokens: u64) -> f64 {
        self.gemm_ps_f(
            2.0 * tokens as f64 * self.model.shared_expert_params() as f64,
            0.0,
        )
    }

    /// Bytes one routed token copy carries in an expert-parallel dispatch (and, back, in
    /// its combine): the hidden state.
    pub fn ep_copy_bytes(&self) -> u64 {
        self.hidden_bytes(1)
    }

    /// Experts each token is routed to (1 for a dense model).
    pub fn top_k(&self) -> u32 {
        match self.model.ffn {
            Ffn::Dense { .. } => 1,
            Ffn::Moe { top_k, .. } => top_k,
        }
    }

    /// ps of dense and expert GEMM FLOPs at their efficiencies.
    fn gemm_ps_f(&self, dense: f64, moe: f64) -> f64 {
        // ps = FLOPs / (TFLOP/s): 1e12 FLOP/s per TFLOP/s and 1e12 ps per s cancel.
        let peak = self.hw.peak_tflops * self.fp8_gemm_speedup;
        dense / (peak * self.hw.gemm_efficiency) + moe / (peak * self.hw.moe_gemm_efficiency)
    }

    /// The cost model of one rank of a TP group of `tp` (Megatron-style): the model's
    /// [`ModelConfig::tp_shard`] (experts split by TP only when `ep` = 1), the same GPU.
    /// Every scheme plans and prices one rank's head shard through it.
    pub fn tp_shard(&self, tp: u32, ep: u32) -> Result<CostModel> {
        if tp == 1 {
            return Ok(self.clone());
        }
        Ok(CostModel {
            model: self.model.tp_shard(tp, ep == 1)?,
            ..self.clone()
        })
    }

    /// One call of an elementwise kernel of `kind` over `tokens` tokens (backward when
    /// `bwd`), ps: the elementwise model's measured time of the kind, else its counted
    /// bytes at the HBM rate.
    pub(crate) fn elem_ps(&self, kind: elementwise::ElemKind, bwd: bool, tokens: u64) -> f64 {
        let dims = self.elem_dims();
        match &self.elementwise {
            Some(e) => e.time_ps(kind, bwd, &dims, tokens),
            None => elementwise::bytes(kind, bwd, &dims, tokens) / self.hw.hbm_bytes_per_s * 1e12,
        }
    }

    /// The elementwise kernels an unfused layer runs in one piece, in order: QKV its input
    /// RMSNorm and RoPE on the split output; the O projection the attention block's residual
    /// add; the feed-forward (an MoE layer's router, which starts it, alike) its RMSNorm,
    /// SwiGLU (a dense MLP's) and residual add.
    pub(crate) fn piece_elems(&self, piece: LinearPiece) -> &'static [elementwise::ElemKind] {
        use elementwise::ElemKind::{Add, RmsNorm, Rope, SwiGlu};
        match (piece, self.model.ffn) {
            (LinearPiece::Qkv, _) => &[RmsNorm, Rope],
            (LinearPiece::OutProj, _) => &[Add],
            (LinearPiece::Ffn, Ffn::Dense { .. }) => &[RmsNorm, SwiGlu, Add],
            (LinearPiece::Ffn | LinearPiece::Router, _) => &[RmsNorm, Add],
        }
    }

    /// One piece's elementwise kernels, ps: under the elementwise model every kind of
    /// [`CostModel::piece_elems`] (RoPE and SwiGLU over `tokens`, the norm and adds over
    /// `norm_tokens`, the sequence-parallel shard); without it the piece's RMSNorm alone as
    /// its counted bytes at the HBM rate (read twice backward), the analytical model a
    /// calibration file prices with.
    fn piece_elem_ps(&self, piece: LinearPiece, tokens: u64, norm_tokens: u64, bwd: bool) -> f64 {
        use elementwise::ElemKind::{Rope, SwiGlu};
        if self.elementwise.is_none() {
            let norm = || self.elem_ps(elementwise::ElemKind::RmsNorm, false, norm_tokens);
            return match piece {
                LinearPiece::OutProj => 0.0,
                _ if bwd => 2.0 * norm(),
                _ => norm(),
            };
        }
        self.piece_elems(piece)
            .iter()
            .map(|&k| {
                let t = if matches!(k, Rope | SwiGlu) {
                    tokens
                } else {
                    norm_tokens
                };
                self.elem_ps(k, bwd, t)
            })
            .sum()
    }

    /// A linear block's elementwise kernels over `tokens` tokens, ps.
    fn part_elem_ps(&self, part: LinearPart, tokens: u64, bwd: bool) -> f64 {
        Self::part_pieces(part)
            .iter()
            .map(|&p| self.piece_elem_ps(p, tokens, tokens, bwd))
            .sum()
    }

    /// Forward time of one linear block over `tokens` tokens, in ps (unrounded).
    pub fn linear_fwd_ps_f(&self, part: LinearPart, tokens: u64) -> f64 {
        if self.gemm.is_some() {
            let g: f64 = Self::part_pieces(part)
                .iter()
                .map(|&p| self.piece_gemm_ps_f(p, tokens))
                .sum();
            return g + self.part_elem_ps(part, tokens, false);
        }
        let (dense, moe) = self.linear_fwd_flops(part, tokens);
        self.gemm_ps_f(dense, moe) + self.part_elem_ps(part, tokens, false)
    }

    /// The pieces of a linear block.
    fn part_pieces(part: LinearPart) -> &'static [LinearPiece] {
        match part {
            LinearPart::PreAttn => &[LinearPiece::Qkv],
            LinearPart::PostAttn => &[LinearPiece::OutProj, LinearPiece::Ffn],
        }
    }

    /// Forward time of one linear block over `tokens` tokens, in ps.
    pub fn linear_fwd_ps(&self, part: LinearPart, tokens: u64) -> Ps {
        self.linear_fwd_ps_f(part, tokens).round() as Ps
    }

    /// Backward time of one linear block: 2 × forward GEMM FLOPs (by the GEMM model: each
    /// GEMM's input and weight gradients by their shapes) and the block's elementwise
    /// kernels' gradients ([`CostModel::piece_elem_ps`]).
    pub fn linear_bwd_ps(&self, part: LinearPart, tokens: u64) -> Ps {
        let g: f64 = match &self.gemm {
            Some(_) => Self::part_pieces(part)
                .iter()
                .map(|&p| self.gemms_ps_f(&self.piece_gemms(p, tokens), true))
                .sum(),
            None => {
                let (dense, moe) = self.linear_fwd_flops(part, tokens);
                2.0 * self.gemm_ps_f(dense, moe)
            }
        };
        (g + self.part_elem_ps(part, tokens, true)).round() as Ps
    }

    /// Bytes of the hidden state of `tokens` tokens (a pipeline activation or its
    /// gradient).
    pub fn hidden_bytes(&self, tokens: u64) -> u64 {
        tokens * u64::from(self.model.hidden) * u64::from(self.model.dtype_bytes)
    }

    /// Forward FLOPs of the LM head over `tokens` tokens.
    pub fn lm_head_fwd_ps(&self, tokens: u64) -> Ps {
        if let Some(g) = &self.gemm {
            let (v, h) = (u64::from(self.model.vocab), u64::from(self.model.hidden));
            return g.time_ps(tokens, v, h).round() as Ps;
        }
        let f = tokens as f64 * self.model.lm_head_fwd_flops_per_token();
        (f / (self.hw.peak_tflops * self.hw.gemm_efficiency)).round() as Ps
    }

    /// Forward time of core attention over whole causal documents of the given lengths,
    /// `heads` query heads per call, in ps: each document's exact causal FLOPs at the
    /// efficiency the table gives for its length.
    pub fn attn_fwd_ps(&self, doc_lens: impl IntoIterator<Item = u32>, heads: u32) -> Ps {
        self.attn_fwd_ps_f(doc_lens, heads).round() as Ps
    }

    /// [`CostModel::attn_fwd_ps`] unrounded: one kernel call (its launch overhead once)
    /// over every document — the table's sum, or with a calibrated block model the
    /// launch's blocks' makespan ([`blocks::launch_fwd_ps_f`]).
    pub fn attn_fwd_ps_f(&self, doc_lens: impl IntoIterator<Item = u32>, heads: u32) -> f64 {
        match self.fwd_blocks() {
            None => self.attn_launch_ps() + self.attn_kernel_ps_f(doc_lens, heads),
            Some(_) => {
                let segs = doc_lens.into_iter().map(|l| (0, u64::from(l), 1));
                self.attn_launch_ps() + self.fwd_launch_ps_f(0.0, heads, segs)
            }
        }
    }

    /// One forward launch's compute time (unrounded ps, no call overhead) of segments
    /// (start, end, count) that the table prices at `table_ps`: `table_ps` itself without
    /// a block model, else the launch's blocks' makespan ([`blocks::launch_fwd_ps_f`],
    /// computed once per distinct launch).
    pub fn fwd_launch_ps_f(
        &self,
        table_ps: f64,
        heads: u32,
        segs: impl IntoIterator<Item = (u64, u64, u32)>,
    ) -> f64 {
        match self.fwd_blocks() {
            None => table_ps,
            Some(m) => {
                let key = (self.attn().mask, self.model.head_dim);
                self.launch_memo.fwd_ps(m, key, heads, segs)
            }
        }
    }

    /// The forward block model where it applies: layers whose mask the kernels walk as
    /// key-block ranges ([`blocks::prices_mask`]: causal, sliding window); layers of another
    /// mask are priced by the table ([`attn_segment_ps_f`]).
    fn fwd_blocks(&self) -> Option<&BlockModel> {
        self.attn_blocks
            .as_ref()
            .filter(|_| blocks::prices_mask(&self.attn().mask))
    }

    /// The backward block model where it applies (as [`Self::fwd_blocks`]).
    fn bwd_blocks(&self) -> Option<&BwdBlockModel> {
        self.attn_bwd_blocks
            .as_ref()
            .filter(|_| blocks::prices_mask(&self.attn().mask))
    }

    /// One backward call's compute time likewise: `table_ps` without a backward block
    /// model, else its blocks' price ([`blocks::launch_bwd_ps_f`], once per distinct call).
    pub fn bwd_launch_ps_f(
        &self,
        table_ps: f64,
        heads: u32,
        segs: impl IntoIterator<Item = (u64, u64, u32)>,
    ) -> f64 {
        match self.bwd_blocks() {
            None => table_ps,
            Some(m) => {
                let kv = self.kv_heads_per_call(heads);
                let key = (self.attn().mask, self.model.head_dim);
                self.launch_memo.bwd_ps(m, key, (heads, kv), segs)
            }
        }
    }

    /// KV heads a call of `heads` query heads reads: its share of the model's groups, at
    /// least one (a KV head replicated to ranks that hold part of its group).
    pub fn kv_heads_per_call(&self, heads: u32) -> u32 {
        let (q, kv) = (self.model.heads_q.max(1), self.model.heads_kv.max(1));
        (u64::from(heads) * u64::from(kv))
            .div_ceil(u64::from(q))
            .clamp(1, u64::from(heads.max(1))) as u32
    }

    /// The table's compute time of whole documents, without the launch overhead.
    fn attn_kernel_ps_f(&self, doc_lens: impl IntoIterator<Item = u32>, heads: u32) -> f64 {
        let a = self.attn();
        doc_lens
            .into_iter()
            .map(|l| attn_segment_ps_f(&self.attn_eff, &a, heads, 0, u64::from(l)))
            .sum()
    }

    /// The fixed cost of one attention kernel launch, ps (0 without a calibration).
    pub fn attn_launch_ps(&self) -> f64 {
        self.launch.attn_launch_us * 1e6
    }

    /// One backward call's fixed cost, ps: the measured backward overhead with a backward
    /// table or block model, else the forward call's (the backward is then priced from the
    /// forward).
    pub fn attn_bwd_launch_ps(&self) -> f64 {
        if self.attn_bwd_eff.is_some() || self.attn_bwd_blocks.is_some() {
            self.launch.attn_bwd_launch_us * 1e6
        } else {
            self.attn_launch_ps()
        }
    }

    /// Backward time of core attention over the same documents: the forward compute ×
    /// the backward FLOP factor / its efficiency, plus one launch; with a measured backward
    /// table, each document at that table's rate plus the backward call's overhead; with a
    /// backward block model, the call's blocks ([`blocks::launch_bwd_ps_f`]) plus its
    /// overhead.
    pub fn attn_bwd_ps(&self, doc_lens: impl IntoIterator<Item = u32>, heads: u32) -> Ps {
        if self.bwd_blocks().is_some() {
            let segs = doc_lens.into_iter().map(|l| (0, u64::from(l), 1));
            let t = self.bwd_launch_ps_f(0.0, heads, segs);
            return (t + self.attn_bwd_launch_ps()).round() as Ps;
        }
        match &self.attn_bwd_eff {
            None => (self.attn_kernel_ps_f(doc_lens, heads) * self.hw.attn_bwd_flop_factor
                / self.hw.attn_bwd_efficiency
                + self.attn_bwd_launch_ps())
            .round() as Ps,
            Some(b) => {
                let a = self.attn();
                let t: f64 = doc_lens
                    .into_iter()
                    .map(|l| {
                        attn_bwd_segment_ps_f(
                            &self.attn_eff,
                            Some(b),
                            &self.hw,
                            &a,
                            heads,
                            0,
                            u64::from(l),
                        )
                    })
                    .sum();
                (t + self.attn_bwd_launch_ps()).round() as Ps
            }
        }
    }

    /// Model FLOPs (forward + backward, no recomputation) of one step's worth of documents:
    /// 3 × (linear + LM head) per token plus (1 + bwd factor) × attention, `class_pairs`
    /// the step's exact pairs under each mask class ([`AttentionPattern::classes`] order;
    /// one entry, the causal pairs, for a causal model). The MFU numerator.
    pub fn model_flops(&self, tokens: u64, class_pairs: &[u64]) -> f64 {
        let m = &self.model;
        let lin = tokens as f64
            * (f64::from(m.layers) * m.layer_linear_fwd_flops_per_token()
                + m.lm_head_fwd_flops_per_token());
        let attn: f64 = m
            .attention
            .classes(m.layers)
            .iter()
            .zip(class_pairs)
            .map(|(&(_, n), &p)| f64::from(n) * self.attn().fwd_flops(p, m.heads_q))
            .sum();
        3.0 * lin + (1.0 + self.hw.attn_bwd_flop_factor) * attn
    }

    /// The exact pairs of documents of lengths `lens` under each of the model's mask
    /// classes ([`CostModel::model_flops`]'s `class_pairs`).
    pub fn class_pairs(&self, lens: &[u32]) -> Vec<u64> {
        self.model
            .attention
            .classes(self.model.layers)
            .iter()
            .map(|(m, _)| lens.iter().map(|&l| m.pairs(u64::from(l))).sum())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    /// With a GEMM model, linear work is priced by each GEMM's shape: a dense layer's
    /// pieces and their backward (input and weight gradients) by hand; FLOP counts agree.
    #[test]
    fn a_gemm_model_prices_the_pieces_by_shape() {
        let g = gemm::h200(700.0, 3e12, 10.0, 20.0);
        let c = CostModel::h200(ModelConfig::builtin("llama3-8b").unwrap())
            .unwrap()
            .with_gemm(g.clone());
        let t = 8192u64;
        // llama3-8b: hidden 4096, 32 + 2 × 8 heads of 128, SwiGLU intermediate 14336.
        let qkv = g.time_ps(t, 6144, 4096);
        let o = g.time_ps(t, 4096, 4096);
        let mlp = g.time_ps(t, 28672, 4096) + g.time_ps(t, 4096, 14336);
        let norm = 2.0 * (t * 4096 * 2) as f64 / c.hw.hbm_bytes_per_s * 1e12;
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * b.abs().max(1.0);
        assert!(close(c.piece_fwd_ps_f(LinearPiece::Qkv, t, t), qkv + norm));
        assert!(close(c.piece_fwd_ps_f(LinearPiece::OutProj, t, t), o));
        assert!(close(
            c.linear_fwd_ps_f(LinearPart::PostAttn, t),
            o + mlp + norm
        ));
        let bwd = g.time_ps(t, 4096, 6144) + g.time_ps(4096, 6144, t) + 2.0 * norm;
        assert_eq!(c.linear_bwd_ps(LinearPart::PreAttn, t), bwd.round() as Ps);
        assert_eq!(
            c.lm_head_fwd_ps(t),
            g.time_ps(t, 128_256, 4096).round() as Ps
        );
        for p in [LinearPiece::Qkv, LinearPiece::OutProj, LinearPiece::Ffn] {
            let f: f64 = c
                .piece_gemms(p, t)
                .iter()
                .map(|&(m, n, k, _)| 2.0 * (m * n * k) as f64)
                .sum();
            assert_eq!(f, c.piece_fwd_flops(p, t).0, "{p:?}");
        }
        // An MoE layer: the router dense, the experts' FLOPs all of its expert share.
        let q = CostModel::h200(ModelConfig::builtin("qwen3-30b-a3b").unwrap())
            .unwrap()
            .with_gemm(g);
        let (dense, moe) = q.piece_fwd_flops(LinearPiece::Ffn, t);
        let sum = |want: bool| -> f64 {
            q.piece_gemms(LinearPiece::Ffn, t)
                .iter()
                .filter(|x| x.3 == want)
                .map(|&(m, n, k, _)| 2.0 * (m * n * k) as f64)
                .sum()
        };
        assert_eq!((sum(true), sum(false)), (dense, moe));
    }

    use super::*;

    fn qwen() -> CostModel {
        CostModel::h200(ModelConfig::builtin("qwen3-30b-a3b").unwrap()).unwrap()
    }

    #[test]
    fn attention_time_is_pairs_times_flops_over_measured_rate() {
        let c = qwen();
        // One 16384-token document, 32 heads: the table's point is 340.2 TFLOP/s.
        let pairs = 16384u64 * 16385 / 2;
        let flops = pairs as f64 * 32.0 * 4.0 * 128.0;
        let want = flops / 340.2; // ps
        assert_eq!(c.attn_fwd_ps([16384], 32), want.round() as Ps);
        // 65536 tokens as 512 documents of 128: matches the measured median 0.792 ms
        // to the table's rounding (87.5 TFLOP/s printed to 0.1).
        let t = c.attn_fwd_ps(std::iter::repeat_n(128, 512), 32) as f64 * 1e-9; // ms
        assert!((t - 0.792).abs() / 0.792 < 0.01, "{t}");
        // Backward: 2.5x FLOPs at 0.8x efficiency.
        let b = c.attn_bwd_ps([16384], 32) as f64;
        assert!((b - want * 2.5 / 0.8).abs() <= 1.0, "{b}");
    }

    #[test]
    fn a_calibrated_launch_overhead_is_paid_once_per_call_forward_and_backward() {
        let plain = qwen();
        let mut launched = qwen();
        launched.launch.attn_launch_us = 5.0;
        let docs = [4096u32, 512, 128];
        let f = launched.attn_fwd_ps(docs, 8) as i64 - plain.attn_fwd_ps(docs, 8) as i64;
        let b = launched.attn_bwd_ps(docs, 8) as i64 - plain.attn_bwd_ps(docs, 8) as i64;
        assert!((f - 5_000_000).abs() <= 1, "{f}");
        assert!((b - 5_000_000).abs() <= 1, "{b}");
        // One segment through the shared formula equals the whole-document price.
        let a = plain.attn();
        let seg = attn_segment_ps_f(&plain.attn_eff, &a, 8, 0, 4096);
        assert_eq!(seg.round() as Ps, plain.attn_fwd_ps([4096], 8));
    }

    #[test]
    fn linear_time_by_hand_for_a_dense_model() {
        let c = CostModel::h200(ModelConfig::builtin("llama3-8b").unwrap()).unwrap();
        let t = 1000u64;
        // PreAttn: 2·t·4096·128·(32+16) FLOPs at 989·0.6 TFLOP/s + norm 2·t·4096·2 B at 4.8e12 B/s.
        let flops: f64 = 2.0 * 1000.0 * 4096.0 * 128.0 * 48.0;
        let want = flops / (989.0 * 0.6) + 2.0 * 1000.0 * 4096.0 * 2.0 / 4.8e12 * 1e12;
        assert_eq!(c.linear_fwd_ps(LinearPart::PreAttn, t), want.round() as Ps);
        let bwd = c.linear_bwd_ps(LinearPart::PreAttn, t) as f64;
        assert!((bwd - 2.0 * want).abs() <= 1.0);
        // PostAttn: O (4096·4096) + MLP (3·4096·14336), all dense.
        let (d, m) = c.linear_fwd_flops(LinearPart::PostAttn, t);
        assert_eq!(m, 0.0);
        assert_eq!(d, 2.0 * 1000.0 * (4096.0 * 4096.0 + 3.0 * 4096.0 * 14336.0));
    }

    /// Qwen3-30B-A3B's routed experts with two shared experts of intermediate size 1,024
    /// added: what they cost per token, per TP rank, and in memory, by hand.
    #[test]
    fn shared_experts_by_hand() {
        use crate::cost::memory::{
            activation_bytes_sharded, stage_expert_params, stage_rank_params,
        };
        let q = ModelConfig::builtin("qwen3-30b-a3b").unwrap();
        let Ffn::Moe {
            shared_experts: 0, ..
        } = q.ffn
        else {
            panic!("qwen3-30b-a3b has no shared experts");
        };
        let moe = |n, i| Ffn::Moe {
            experts: 128,
            top_k: 8,
            expert_intermediate: 768,
            shared_experts: n,
            shared_expert_intermediate: i,
        };
        let m = ModelConfig {
            ffn: moe(2, 1024),
            ..q.clone()
        };
        // 2 · 3 · 2048 · 1024 shared parameters, run by every token.
        assert_eq!(m.shared_expert_params(), 12_582_912);
        assert_eq!(m.ffn_active_params(), 37_748_736 + 262_144 + 12_582_912);
        let c = CostModel::h200(m.clone()).unwrap();
        // The shared experts are dense GEMMs beside the router; the routed experts unchanged.
        let (dense, routed) = c.piece_fwd_flops(LinearPiece::Ffn, 10);
        assert_eq!(dense, 2.0 * 10.0 * (2048.0 * 128.0 + 12_582_912.0));
        assert_eq!(routed, 2.0 * 10.0 * 8.0 * 3.0 * 2048.0 * 768.0);
        assert_eq!(
            c.piece_fwd_flops(LinearPiece::Router, 10),
            (2.0 * 10.0 * 2048.0 * 128.0, 0.0)
        );
        // 2·10·12,582,912 FLOPs at 989 · 0.6 TFLOP/s.
        let want = 2.0 * 10.0 * 12_582_912.0 / (989.0 * 0.6);
        assert!((c.shared_experts_fwd_ps_f(10) - want).abs() < 1e-6 * want);
        // TP 8 under EP: routed experts whole, shared ones split like the dense MLP, so a
        // TP rank's share of the group's 80 tokens costs what 10 tokens cost whole.
        let s = c.tp_shard(8, 8).unwrap();
        assert_eq!(s.model.ffn, moe(2, 128));
        assert!((s.shared_experts_fwd_ps_f(80) - want).abs() < 1e-6 * want);
        // Memory: shared experts are dense parameters, held whole by every EP rank; the
        // saved activations gain 3 · 1,024 bf16 values per shared expert and token.
        let e = 128 * 3 * 2048 * 768;
        assert_eq!(stage_expert_params(&m, 1), e);
        let layer = 18_874_368 + e + 262_144 + 12_582_912 + 2 * 2048;
        assert_eq!(m.layer_params(), layer);
        assert_eq!(stage_rank_params(&m, 1, false, false, 8), layer - e + e / 8);
        assert_eq!(
            activation_bytes_sharded(&m, 1) - activation_bytes_sharded(&q, 1),
            2 * 2 * 3 * 1024
        );
        // Bad shapes are named.
        let e = ModelConfig {
            ffn: moe(1, 1020),
            ..q.clone()
        }
        .tp_shard(8, false)
        .unwrap_err()
        .to_string();
        assert!(e.contains("shared-expert intermediate size 1020"), "{e}");
        let text = include_str!("../../models/qwen3-30b-a3b.toml")
            .replace("shared_experts = 0", "shared_experts = 1");
        let e = ModelConfig::from_toml_str(&text, "q.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("ffn.shared_expert_intermediate"), "{e}");
    }

    #[test]
    fn moe_experts_are_priced_at_the_expert_gemm_efficiency() {
        let c = qwen();
        let (dense, moe) = c.linear_fwd_flops(LinearPart::PostAttn, 10);
        assert_eq!(moe, 2.0 * 10.0 * 8.0 * 3.0 * 2048.0 * 768.0);
        assert_eq!(dense, 2.0 * 10.0 * (4096.0 * 2048.0 + 2048.0 * 128.0));
        // Per-token linear FLOPs of a layer agree with the model's parameter count.
        let (d1, m1) = c.linear_fwd_flops(LinearPart::PreAttn, 1);
        let (d2, m2) = c.linear_fwd_flops(LinearPart::PostAttn, 1);
        assert_eq!(
            d1 + m1 + d2 + m2,
            c.model.layer_linear_fwd_flops_per_token()
        );
    }

    #[test]
    fn calibration_replaces_table_and_hardware() {
        let json = r#"{"attn_fwd": [{"heads": 32, "len": 128, "tflops": 100.0}],
                       "hardware": {"gemm_efficiency": 0.5}}"#;
        let cal = Calibration::from_json_str(json, "cal.json").unwrap();
        let c = CostModel::calibrated(ModelConfig::builtin("llama3-8b").unwrap(), &cal, "cal.json")
            .unwrap();
        assert_eq!(c.attn_eff.tflops(8, 4096, 4096), 100.0);
        assert_eq!(c.hw.gemm_efficiency, 0.5);
        assert_eq!(c.hw.peak_tflops, 989.0);
        let bad = r#"{"attn_fwd": [{"heads": 32, "len": 128, "tflops": 100.0}], "hardware": {"gemm_efficiency": 1.5}}"#;
        let e = Calibration::from_json_str(bad, "cal.json").unwrap_err();
        assert!(e.to_string().contains("gemm_efficiency"), "{e}");
        assert!(Calibration::from_json_str("{}", "cal.json").is_err());
        // The block model: optional (above), read when present, checked by field name.
        let m = r#""block_ns": 1.0, "iter_ns": 2.0, "row_share": 0.1, "diag_ns": 0.5"#;
        let w = format!(
            r#"{{"attn_fwd": [{{"heads": 32, "len": 128, "tflops": 100.0}}], "attn_blocks": {{{m}, "pair_slowdown": 1.4}}}}"#
        );
        let cal = Calibration::from_json_str(&w, "cal.json").unwrap();
        let want = BlockModel::h200(1.0, 2.0, 0.1, 0.5, 1.4);
        assert_eq!(cal.attn_blocks, Some(want));
        let c = CostModel::calibrated(ModelConfig::builtin("llama3-8b").unwrap(), &cal, "cal.json")
            .unwrap();
        assert_eq!(c.attn_blocks, Some(want));
        let bad = w.replace("1.4", "0.9");
        let e = Calibration::from_json_str(&bad, "cal.json").unwrap_err();
        assert!(
            e.to_string()
                .contains("cal.json: attn_blocks.pair_slowdown"),
            "{e}"
        );
        // The backward block model: read when present, checked by field name.
        let b = r#""attn_bwd_blocks": {"row_head_ns": 0.01, "pair_slowdown": 1.6,
            "dq": {"block_ns": 5000.0, "iter_ns": 2400.0, "row_share": 0.3, "diag_ns": 0.0},
            "dkdv": {"block_ns": 3000.0, "iter_ns": 1500.0, "row_share": 0.3, "diag_ns": 0.0}}"#;
        let w = format!(
            r#"{{"attn_fwd": [{{"heads": 32, "len": 128, "tflops": 100.0}}], "launch": {{"attn_bwd_launch_us": 20.0}}, {b}}}"#
        );
        let cal = Calibration::from_json_str(&w, "cal.json").unwrap();
        let m = cal.attn_bwd_blocks.unwrap();
        assert_eq!(
            (m.dkdv.iter_ns, m.block_m, m.blocks_per_sm),
            (1500.0, 64, 2)
        );
        let c = CostModel::calibrated(
            ModelConfig::builtin("qwen3-30b-a3b").unwrap(),
            &cal,
            "cal.json",
        )
        .unwrap();
        // A whole-document backward is one call: its blocks plus the backward overhead.
        assert_eq!(c.kv_heads_per_call(8), 1);
        let want = blocks::launch_bwd_ps_f(
            0.0,
            Some(&m),
            (Mask::Causal, 128),
            (8, 1),
            [(0u64, 4096u64, 1u32)],
        ) + 20e6;
        assert_eq!(c.attn_bwd_ps([4096], 8), want.round() as Ps);
        let bad = w.replace("\"iter_ns\": 1500.0", "\"iter_ns\": -1.0");
        let e = Calibration::from_json_str(&bad, "cal.json").unwrap_err();
        assert!(
            e.to_string()
                .contains("cal.json: attn_bwd_blocks.dkdv.iter_ns"),
            "{e}"
        );
        // A calibration of the retired wave term is refused by its field's name.
        let old = r#"{"attn_fwd": [{"heads": 32, "len": 128, "tflops": 100.0}], "attn_waves": {"sm_tflops": 2.5}}"#;
        let e = Calibration::from_json_str(old, "cal.json").unwrap_err();
        assert!(e.to_string().contains("attn_waves"), "{e}");
    }
}
