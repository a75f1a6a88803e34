//! The attention kernels as thread blocks on SMs: the call-level price of one forward launch
//! or one backward call when a calibration fitted a [`BlockModel`] (a calibration's
//! `attn_blocks`) or a [`BwdBlockModel`] (`attn_bwd_blocks`).
//!
//! A per-segment efficiency table prices FLOPs at a rate looked up by length; the hardware
//! runs thread blocks. This module prices what the kernels actually run:
//!
//! - **Forward blocks** (`validate/kernels/attn_fwd_v3.cu`). One block per (query tile of
//!   `block_m` rows of one segment, query head). A segment is queries [a, e) of one sample
//!   over keys [0, e); its tiles are [p0, p1) = [a + k·block_m, min(a + (k+1)·block_m, e)).
//!   The grid's x runs over the tiles sorted by the keys they visit (p1, most first), y over
//!   heads: blocks launch head-major ([`launch_blocks`]).
//! - **A block's time alone on an SM** ([`BlockTimes`]). The forward kernel loops over
//!   ⌈p1 / block_n⌉ key blocks whatever the tile's row count (a 1-row tile at position
//!   50,000 visits as many key blocks as a full one; its idle warps only save part of each
//!   step), so
//!
//!   t = block + n_iter · iter · (1 − row_share + row_share · rows / block_m) + n_diag · diag
//!
//!   with n_diag the key blocks reaching past the tile's first row (masked) —
//!   [`BlockModel::block_ps`]. `iter` and `diag` scale with head_dim / the fitted head_dim.
//! - **Sharing an SM** ([`SmSlots`]). Up to `blocks_per_sm` blocks are resident on an SM;
//!   with k resident each runs `1 + (pair_slowdown − 1)(k − 1)` times slower than alone
//!   (1: co-residency doubles an SM's throughput, k: gains nothing). Blocks take the first
//!   slot of every SM, then the second, …; afterwards each freed slot takes the next block
//!   in launch order ([`makespan_ps`], the one makespan of every launch). Where the SM a
//!   block lands on is the hardware's ([`Placement`]): past the first block of every SM it
//!   is a free slot at random (`validate/torch/dispatch_probe.py`), so a launch of a few long
//!   blocks among short ones runs them alone on some launches and paired on others, and
//!   the model prices the median of seeded draws.
//! - **The backward call** (`validate/kernels/attn_bwd.cu`, 64-row tiles and steps, 2
//!   blocks per SM at head_dim 128): the zeroing of dK/dV and `attn_bwd_dot` (priced per
//!   query row × head), then the dQ launch — the forward's tiling at 64 rows
//!   ([`bwd_dq_blocks`]) — and the dK/dV launch — per segment its key tiles of [0, e), each
//!   looping over the query blocks that see it, most such rows first ([`bwd_dkdv_blocks`],
//!   as `validate::units::Layout::key_tiles` orders them). Each launch takes its blocks'
//!   makespan, with the same block-time form and sharing ([`BwdLaunchBlocks`]).
//!
//! The forward launch takes its blocks' makespan (+ the call overhead, priced by the
//! caller). The same formula covers a launch of a few long blocks (bound by its last wave:
//! measured q = 3,072 units at 228–321 TFLOP/s) and one of many short segments (bound by
//! key-block steps, not FLOPs). `skewsim calibrate` fits the figures and the
//! call overheads to measured calls (`cost::fit`).
//!
//! It may not price anything else; without a block model ([`launch_fwd_ps_f`],
//! [`launch_bwd_ps_f`] with `None`) the table's sum comes back unchanged, bit for bit. The
//! plan lowering (`schedule::plan_attn`), whole-document calls
//! ([`super::CostModel::attn_fwd_ps_f`], [`super::CostModel::attn_bwd_ps`]) and measured
//! calls (`cost::fit`) all price a call through these (the fit through [`LaunchBlocks`] and
//! [`BwdLaunchBlocks`], its shapes computed once per call).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::{Arc, Mutex};

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::Mask;
use crate::error::{invalid, Result};

/// Streaming multiprocessors of an H200 SXM.
pub const H200_SMS: u32 = 132;
/// Query rows per block of the forward kernel v3-w4 (16 rows × 2 MMA tiles × 4 warps).
pub const FWD_BLOCK_M: u32 = 128;
/// Keys per step of the forward kernel's key loop (`BLOCK_N` of `attn_common.cuh`).
pub const FWD_BLOCK_N: u32 = 64;
/// Resident blocks per SM of v3-w4: 96 KiB shared memory each (Q tile 32 KiB, double-buffered
/// K and V tiles 64 KiB) of the H200's 228 KiB, 128 threads.
pub const FWD_BLOCKS_PER_SM: u32 = 2;
/// The head dimension the forward kernel is usually measured at.
pub const FWD_HEAD_DIM: u32 = 128;
/// Most SMs a block model may have.
pub const MAX_SMS: u32 = 1024;
/// Most resident blocks per SM (CUDA's limit on Hopper and Blackwell is 32).
pub const MAX_BLOCKS_PER_SM: u32 = 32;
/// A block's rows and a step's keys: at least 16 (one MMA tile), at most 1024.
pub const BLOCK_ROWS: std::ops::RangeInclusive<u32> = 16..=1024;

fn default_sms() -> u32 {
    H200_SMS
}
fn default_block_m() -> u32 {
    FWD_BLOCK_M
}
fn default_block_n() -> u32 {
    FWD_BLOCK_N
}
fn default_blocks_per_sm() -> u32 {
    FWD_BLOCKS_PER_SM
}
fn default_head_dim() -> u32 {
    FWD_HEAD_DIM
}

/// A block model's launch layout: (SMs, blocks per SM, block_m, block_n, head_dim, tile
/// order).
pub type Layout = (u32, u32, u32, u32, u32, TileOrder);

/// The forward kernel's blocks on the SMs (a calibration's `attn_blocks`): the time of a
/// block alone on an SM, how co-resident blocks share it, and the launch geometry.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BlockModel {
    /// Fixed time of one block alone on its SM (prologue, Q tile, output), ns.
    pub block_ns: f64,
    /// One step of the key loop (`block_n` keys) for a full tile of `block_m` rows, alone
    /// on its SM, ns.
    pub iter_ns: f64,
    /// The share of a step that scales with the tile's rows (0: a 1-row tile's step costs
    /// as much as a full one; 1: proportional to rows).
    pub row_share: f64,
    /// Extra time of a step whose keys reach the tile's first row (the causal mask), ns.
    pub diag_ns: f64,
    /// Time factor of each of two blocks sharing an SM (1: sharing doubles the SM's
    /// throughput; 2: gains nothing); k resident: 1 + (pair_slowdown − 1)(k − 1).
    pub pair_slowdown: f64,
    /// The head dimension the times were fitted at (steps scale with head_dim).
    #[serde(default = "default_head_dim")]
    pub head_dim: u32,
    /// SMs the blocks are scheduled onto.
    #[serde(default = "default_sms")]
    pub sms: u32,
    /// Blocks resident on one SM at a time.
    #[serde(default = "default_blocks_per_sm")]
    pub blocks_per_sm: u32,
    /// Query rows per block.
    #[serde(default = "default_block_m")]
    pub block_m: u32,
    /// Keys per step of the key loop.
    #[serde(default = "default_block_n")]
    pub block_n: u32,
    /// The order the grid hands its blocks to the SMs.
    #[serde(default, skip_serializing_if = "TileOrder::is_longest_first")]
    pub order: TileOrder,
    /// Time of a block that has no rows to compute (a [`TileOrder::Grid`] launch pads
    /// every segment to its longest), ns.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub empty_ns: f64,
    /// Extra time of each step of a launch the kernel runs in its sliding-window mode, ns
    /// (FlashAttention-2 applies the two-sided window mask to every element of every step
    /// and checks its softmax for rows with no key yet; 0: no windowed launches measured).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub window_ns: f64,
    /// Which SM a block past the first of every SM lands on.
    #[serde(default, skip_serializing_if = "Placement::is_in_order")]
    pub placement: Placement,
}

/// Which SM the block dispatcher gives a block once every SM holds one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Placement {
    /// Each freed slot takes the next block in launch order, the lowest SM first; the
    /// second block of every SM in SM order.
    #[default]
    InOrder,
    /// Measured on the H200 (`validate/torch/dispatch_probe.py`, BENCHMARKS.md "Where the
    /// H200's dispatcher puts blocks"): the first block of every SM one per SM; every later
    /// block to a free slot at random — slots that free at the same instant take the next
    /// blocks in a random order, and the second slots fill in a random SM order — so an SM
    /// with two free slots is twice as likely as one with one. The makespan is the median
    /// of [`PLACEMENT_DRAWS`] seeded draws (a measured launch's time is the median of
    /// its repeats).
    AnyFreeSlot,
}

impl Placement {
    fn is_in_order(&self) -> bool {
        *self == Placement::InOrder
    }
}

/// Seeded placements whose median makespan a [`Placement::AnyFreeSlot`] launch takes.
pub const PLACEMENT_DRAWS: u64 = 7;

/// The order a kernel's grid hands its blocks to the SMs, and which blocks it launches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TileOrder {
    /// The project's kernels (`validate/kernels`): exactly the segments' tiles, sorted by
    /// the steps they take, most first.
    #[default]
    LongestFirst,
    /// FlashAttention-2's varlen grid (tile fastest, then segment, then head): per
    /// segment its tiles from the first, each segment padded with empty blocks to the
    /// launch's most tiles (the blocks past a segment's end return at once).
    Grid,
}

impl TileOrder {
    fn is_longest_first(&self) -> bool {
        *self == TileOrder::LongestFirst
    }
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

/// A block's shape: what its time depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct BlockShape {
    /// Steps of the key loop: ⌈p1 / block_n⌉.
    pub n_iter: u32,
    /// Steps whose keys reach the tile's first row (masked): n_iter − ⌊p0 / block_n⌋.
    pub n_diag: u32,
    /// Query rows of the tile (p1 − p0).
    pub rows: u32,
    /// Steps run in the kernel's sliding-window mode (every step of a windowed launch).
    pub n_local: u32,
}

impl BlockModel {
    /// The launch layout the model describes (SMs, blocks per SM, tile, head_dim, tile
    /// order): two models with the same layout price the same kernel.
    pub fn layout(&self) -> Layout {
        (
            self.sms,
            self.blocks_per_sm,
            self.block_m,
            self.block_n,
            self.head_dim,
            self.order,
        )
    }
    /// The H200 forward kernel v3-w4's geometry (132 SMs × 2 resident blocks, 128-row
    /// tiles, 64-key steps, head_dim 128) with the given times.
    pub fn h200(block_ns: f64, iter_ns: f64, row_share: f64, diag_ns: f64, pair: f64) -> Self {
        Self {
            block_ns,
            iter_ns,
            row_share,
            diag_ns,
            pair_slowdown: pair,
            head_dim: FWD_HEAD_DIM,
            sms: H200_SMS,
            blocks_per_sm: FWD_BLOCKS_PER_SM,
            block_m: FWD_BLOCK_M,
            block_n: FWD_BLOCK_N,
            order: TileOrder::LongestFirst,
            empty_ns: 0.0,
            window_ns: 0.0,
            placement: Placement::InOrder,
        }
    }

    /// The block times alone on an SM.
    pub fn times(&self) -> BlockTimes {
        BlockTimes {
            block_ns: self.block_ns,
            iter_ns: self.iter_ns,
            row_share: self.row_share,
            diag_ns: self.diag_ns,
            empty_ns: self.empty_ns,
        }
    }

    /// How its blocks share the SMs.
    pub fn slots(&self) -> SmSlots {
        SmSlots {
            sms: self.sms,
            blocks_per_sm: self.blocks_per_sm,
            pair_slowdown: self.pair_slowdown,
            placement: self.placement,
        }
    }

    /// Check the fields; `ctx` names the file.
    pub fn validate(&self, ctx: &str) -> Result<()> {
        let f = |name: &str| format!("{ctx}: attn_blocks.{name}");
        if !(self.window_ns.is_finite() && self.window_ns >= 0.0) {
            return Err(invalid(
                f("window_ns"),
                self.window_ns,
                "a finite time >= 0 ns",
            ));
        }
        self.times().validate(&f)?;
        self.slots().validate(&f)?;
        check_geometry(&f, self.head_dim, self.block_m, self.block_n)
    }

    /// The shape of the block of query rows [p0, p1) under `mask` (causal: keys [0, p1)).
    pub fn shape(&self, mask: Mask, p0: u64, p1: u64) -> BlockShape {
        query_tile_shape(
            self.block_n,
            mask,
            p0,
            p1,
            self.order == TileOrder::LongestFirst,
        )
    }

    /// Time in ps of a block of `shape` alone on its SM at `head_dim`: [`BlockTimes`]'s,
    /// plus `window_ns` per step run in the sliding-window mode (scaled like the steps).
    pub fn block_ps(&self, b: BlockShape, head_dim: u32) -> f64 {
        let d = head_dim_scale(head_dim, self.head_dim);
        self.times().block_ps(b, d, self.block_m) + 1e3 * d * f64::from(b.n_local) * self.window_ns
    }
}

/// One kernel's block times alone on an SM: a fixed part, the steps of its inner loop
/// (a share of each scaling with the block's rows) and the masked steps' extra.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BlockTimes {
    /// Fixed time of one block alone on its SM (prologue, first tiles, output), ns.
    pub block_ns: f64,
    /// One step of the inner loop for a full block, alone on its SM, ns.
    pub iter_ns: f64,
    /// The share of a step that scales with the block's rows (0: a 1-row block's step
    /// costs as much as a full one; 1: proportional to rows).
    pub row_share: f64,
    /// Extra time of a step that the causal mask cuts, ns.
    pub diag_ns: f64,
    /// Time of an empty block (no rows: [`TileOrder::Grid`]'s padding), ns.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub empty_ns: f64,
}

impl BlockTimes {
    /// Time in ps of a block of `b` alone on its SM: steps and diagonal scaled by
    /// `d_scale` (head_dim / the fitted head_dim), rows counted out of `block_rows`; an
    /// empty block (no rows) takes `empty_ns`.
    pub fn block_ps(&self, b: BlockShape, d_scale: f64, block_rows: u32) -> f64 {
        if b.rows == 0 {
            return 1e3 * self.empty_ns;
        }
        let rows = f64::from(b.rows) / f64::from(block_rows.max(1));
        let step = self.iter_ns * (1.0 - self.row_share + self.row_share * rows);
        1e3 * (self.block_ns
            + d_scale * (f64::from(b.n_iter) * step + f64::from(b.n_diag) * self.diag_ns))
    }

    /// Check the fields; `f` names a field in errors.
    fn validate(&self, f: &dyn Fn(&str) -> String) -> Result<()> {
        for (name, v) in [
            ("block_ns", self.block_ns),
            ("diag_ns", self.diag_ns),
            ("empty_ns", self.empty_ns),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(invalid(f(name), v, "a finite time >= 0 ns"));
            }
        }
        if !(self.iter_ns.is_finite() && self.iter_ns > 0.0) {
            return Err(invalid(f("iter_ns"), self.iter_ns, "a finite time > 0 ns"));
        }
        if !(0.0..=1.0).contains(&self.row_share) {
            return Err(invalid(f("row_share"), self.row_share, "a share in [0, 1]"));
        }
        Ok(())
    }
}

/// How a launch's blocks share the SMs: `sms` SMs of `blocks_per_sm` resident blocks,
/// each of k resident blocks `1 + (pair_slowdown − 1)(k − 1)` times slower than alone.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SmSlots {
    /// Streaming multiprocessors.
    pub sms: u32,
    /// Blocks resident on one SM at once.
    pub blocks_per_sm: u32,
    /// How much slower each of two co-resident blocks runs than alone.
    pub pair_slowdown: f64,
    /// Which SM a block past the first of every SM lands on.
    pub placement: Placement,
}

impl SmSlots {
    /// The slowdown of each of `k` blocks resident on one SM.
    fn slowdown(&self, k: usize) -> f64 {
        1.0 + (self.pair_slowdown - 1.0) * (k.max(1) - 1) as f64
    }

    fn validate(&self, f: &dyn Fn(&str) -> String) -> Result<()> {
        if !(self.pair_slowdown.is_finite() && self.pair_slowdown >= 1.0) {
            return Err(invalid(
                f("pair_slowdown"),
                self.pair_slowdown,
                "a finite factor >= 1",
            ));
        }
        for (name, v, max) in [
            ("sms", self.sms, MAX_SMS),
            ("blocks_per_sm", self.blocks_per_sm, MAX_BLOCKS_PER_SM),
        ] {
            if !(1..=max).contains(&v) {
                return Err(invalid(f(name), v, format!("1..={max}")));
            }
        }
        Ok(())
    }
}

fn check_geometry(
    f: &dyn Fn(&str) -> String,
    head_dim: u32,
    block_m: u32,
    block_n: u32,
) -> Result<()> {
    if head_dim == 0 {
        return Err(invalid(f("head_dim"), 0, "at least 1"));
    }
    for (name, v) in [("block_m", block_m), ("block_n", block_n)] {
        if !BLOCK_ROWS.contains(&v) {
            return Err(invalid(
                f(name),
                v,
                format!("{}..={}", BLOCK_ROWS.start(), BLOCK_ROWS.end()),
            ));
        }
    }
    Ok(())
}

/// head_dim over the head_dim a model was fitted at (steps scale with it).
fn head_dim_scale(head_dim: u32, fitted: u32) -> f64 {
    f64::from(head_dim) / f64::from(fitted.max(1))
}

/// A block with nothing to compute.
const EMPTY: BlockShape = BlockShape {
    n_iter: 0,
    n_diag: 0,
    rows: 0,
    n_local: 0,
};

/// Whether the block models price launches under `mask`: the masks whose kept keys of a
/// query are one contiguous run ending at the query (causal, sliding window), which the
/// kernels walk as a range of key blocks. Others are priced by the table.
pub fn prices_mask(mask: &Mask) -> bool {
    matches!(mask, Mask::Causal | Mask::Sliding { .. })
}

/// Blocks in [lo, hi) ∩ [lo2, hi2) (half-open ranges of block indices).
fn overlap((lo, hi): (u64, u64), (lo2, hi2): (u64, u64)) -> u64 {
    hi.min(hi2).saturating_sub(lo.max(lo2))
}

/// Blocks in the union of two ranges of block indices.
fn union_len(a: (u64, u64), b: (u64, u64)) -> u64 {
    a.1.saturating_sub(a.0) + b.1.saturating_sub(b.0) - overlap(a, b)
}

/// The shape of a query tile [p0, p1) in steps of `block_n` keys under `mask` (causal or a
/// sliding window: [`prices_mask`]): the steps run from the key block holding the first
/// row's lowest key ([`Mask::key_start`]) to the one holding key p1 − 1, as the kernels'
/// key loops bound them; its masked steps are those the causal diagonal crosses (keys past
/// p0) and, with `edge_masked`, those the window's lower edge crosses (the rows' lowest keys
/// fall inside). FlashAttention-2's forward (the [`TileOrder::Grid`] layout) masks every
/// step of a windowed launch alike (`window_ns`); only its first steps, the diagonal's,
/// cost the masked-step extra. The forward's and the backward dQ's blocks.
fn query_tile_shape(block_n: u32, mask: Mask, p0: u64, p1: u64, edge_masked: bool) -> BlockShape {
    debug_assert!(p1 > p0);
    let bn = u64::from(block_n.max(1));
    let end = p1.div_ceil(bn);
    let first = mask.key_start(p0) / bn;
    let diag = ((p0 / bn).min(end), end);
    let edge = if edge_masked {
        (first, mask.key_start(p1 - 1).div_ceil(bn))
    } else {
        (first, first)
    };
    let n_iter = (end - first) as u32;
    BlockShape {
        n_iter,
        n_diag: union_len(diag, edge) as u32,
        rows: (p1 - p0) as u32,
        n_local: if mask.is_causal() { 0 } else { n_iter },
    }
}

/// The mask a launch of segments ending at most at `max_end` runs under: a window that
/// reaches the first key from every query (W − 1 ≥ the longest key range, FlashAttention-2's
/// `window_size_left >= max_seqlen_k`) runs as the causal kernel.
fn launch_mask(mask: Mask, max_end: u64) -> Mask {
    match mask {
        Mask::Sliding { w } if u64::from(w) > max_end => Mask::Causal,
        m => m,
    }
}

/// Query tiles of `block_m` rows of every segment (queries [start, end) under `mask`;
/// `n` such segments) in launch order: most keys first (ties: the larger shape first), or
/// in `Grid` order each segment's tiles from its first, padded to the most any segment has.
fn query_tiles(
    (block_m, block_n): (u32, u32),
    mask: Mask,
    order: TileOrder,
    segs: impl IntoIterator<Item = (u64, u64, u32)>,
) -> Vec<BlockShape> {
    let bm = u64::from(block_m.max(1));
    let segs: Vec<(u64, u64, u32)> = segs.into_iter().collect();
    let mask = launch_mask(mask, segs.iter().map(|s| s.1).max().unwrap_or(0));
    if order == TileOrder::Grid {
        let tiles = segs
            .iter()
            .map(|&(a, e, _)| e.saturating_sub(a).div_ceil(bm))
            .max()
            .unwrap_or(0);
        let mut blocks = Vec::new();
        for &(a, e, n) in &segs {
            let one: Vec<BlockShape> = (0..tiles)
                .map(|k| {
                    let p0 = a + k * bm;
                    if p0 >= e {
                        EMPTY
                    } else {
                        query_tile_shape(block_n, mask, p0, (p0 + bm).min(e), false)
                    }
                })
                .collect();
            for _ in 0..n {
                blocks.extend_from_slice(&one);
            }
        }
        return blocks;
    }
    let mut blocks: Vec<(u64, BlockShape)> = Vec::new();
    for (start, end, n) in segs {
        let mut p0 = start;
        while p0 < end {
            let p1 = (p0 + bm).min(end);
            let b = (p1, query_tile_shape(block_n, mask, p0, p1, true));
            blocks.extend(std::iter::repeat_n(b, n as usize));
            p0 = p1;
        }
    }
    blocks.sort_unstable_by(|x, y| y.cmp(x));
    blocks.into_iter().map(|b| b.1).collect()
}

/// One head's blocks of a launch, in launch order: for every segment (queries [start,
/// end) of one sample under `mask`; `n` such segments) its tiles of `block_m` rows, most
/// keys first (ties: the larger shape first), or in the grid's order.
pub fn launch_blocks(
    m: &BlockModel,
    mask: Mask,
    segs: impl IntoIterator<Item = (u64, u64, u32)>,
) -> Vec<BlockShape> {
    query_tiles((m.block_m, m.block_n), mask, m.order, segs)
}

/// Blocks of one launch list-scheduled one by one; a launch of more passes whole heads
/// through at the SMs' steady rate ([`makespan_ps`]).
pub const EXACT_BLOCKS: usize = 8192;

/// Makespan in ps of `heads` copies (head-major) of blocks taking `times` ps each alone on
/// an SM, on `m.sms` SMs holding up to `m.blocks_per_sm` each: the list schedule
/// ([`list_makespan_ps`]) of as many heads as fit in [`EXACT_BLOCKS`] blocks (at least
/// one), each further head adding its work at the SMs' steady rate (every slot busy:
/// `sms × blocks_per_sm / slowdown` blocks' worth of alone-time per unit of time). On the
/// 1,216 measured H200 forward launches of `validate/results/` the 148 over the budget come within
/// 0.87 % of their full list schedule (median 0.003 %). The one makespan of every launch,
/// forward and backward, in the fit and the engine alike.
pub fn makespan_ps(m: SmSlots, times: &[f64], heads: u32) -> f64 {
    makespan_ps_by(m, times, heads, |h| list_makespan_ps(m, times, h))
}

/// [`makespan_ps`] with the list schedule of the heads it schedules exactly (`heads`, or
/// fewer past [`EXACT_BLOCKS`]) taken from `list` (called once, with that head count), so
/// that a memo can serve it to every head count that schedules as many.
fn makespan_ps_by(m: SmSlots, times: &[f64], heads: u32, list: impl FnOnce(u32) -> f64) -> f64 {
    let n = times.len();
    let exact = (EXACT_BLOCKS / n.max(1)).max(1);
    if exact >= heads as usize {
        return list(heads);
    }
    let k = m.blocks_per_sm.max(1) as usize;
    let rate = f64::from(m.sms.max(1)) * k as f64 / m.slowdown(k);
    let head_work: f64 = times.iter().sum();
    list(exact as u32) + (heads as usize - exact) as f64 * head_work / rate
}

/// The list schedule of `heads` copies (head-major) of `times` on the SMs: blocks fill the
/// first slot of every SM, then the second, …; afterwards each freed slot takes the next
/// block. Where the blocks past the first of every SM land is `m.placement`'s: in order
/// (the lowest SM first), or at random — the median of [`PLACEMENT_DRAWS`] seeded draws
/// (with one slot per SM every placement gives the same makespan, so one is drawn).
pub fn list_makespan_ps(m: SmSlots, times: &[f64], heads: u32) -> f64 {
    // One block per SM at most: no block is placed past the first of its SM.
    let one_fill = times.len() * heads as usize <= m.sms as usize;
    if m.placement == Placement::InOrder || m.blocks_per_sm <= 1 || one_fill {
        return list_schedule_ps(m, times, heads, None);
    }
    // The draws run in parallel, in two rounds: a majority first, the rest only if those
    // leave the median open.
    let draw = |seed: u64| {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        list_schedule_ps(m, times, heads, Some(&mut rng))
    };
    let n = PLACEMENT_DRAWS as usize;
    let majority = PLACEMENT_DRAWS / 2 + 1;
    let mut draws: Vec<f64> = (0..majority).into_par_iter().map(draw).collect();
    if let Some(median) = settled_median(&mut draws, n) {
        return median;
    }
    draws.par_extend((majority..PLACEMENT_DRAWS).into_par_iter().map(draw));
    draws.sort_unstable_by(f64::total_cmp);
    draws[n / 2]
}

/// The median of `n` draws once the ones drawn so far fix it whatever the rest give: a
/// value x with at most n/2 − (n − drawn) draws below it and more than n/2 at or below it
/// (e.g. the first 4 of 7 alike). Sorts `draws`.
fn settled_median(draws: &mut [f64], n: usize) -> Option<f64> {
    draws.sort_unstable_by(f64::total_cmp);
    let left = n - draws.len();
    let mut below = 0;
    for run in draws.chunk_by(|a, b| a.to_bits() == b.to_bits()) {
        if below + left <= n / 2 && below + run.len() > n / 2 {
            return Some(run[0]);
        }
        below += run.len();
    }
    None
}

/// One list schedule: `rng` None places in order (a freed SM's slots take the next blocks,
/// the lowest SM first); else the second and later slots fill in a random SM order, and the
/// slots of every SM that frees at one instant take the next blocks in a random order.
fn list_schedule_ps(
    m: SmSlots,
    times: &[f64],
    heads: u32,
    mut rng: Option<&mut ChaCha8Rng>,
) -> f64 {
    let total = times.len() * heads as usize;
    let sms = m.sms as usize;
    if total == 0 || sms == 0 {
        return 0.0;
    }
    let per_sm = m.blocks_per_sm.max(1) as usize;
    let slow: Vec<f64> = (0..=per_sm).map(|k| m.slowdown(k)).collect();
    // The blocks in launch order: `heads` passes over `times`.
    let (mut pass, mut idx) = (0u32, 0usize);
    let mut next = || -> Option<f64> {
        if idx == times.len() {
            pass += 1;
            idx = 0;
        }
        if pass >= heads {
            return None;
        }
        idx += 1;
        Some(times[idx - 1])
    };
    // Per SM: the remaining alone-time of its resident blocks (flat, `per_sm` slots each),
    // how many, and the time of its last update.
    let mut rem = vec![0.0f64; sms * per_sm];
    let mut cnt = vec![0usize; sms];
    let mut last = vec![0.0f64; sms];
    let mut order: Vec<usize> = (0..sms).collect();
    for round in 0..per_sm {
        if round == 1 {
            if let Some(r) = rng.as_deref_mut() {
                order.shuffle(r);
            }
        }
        for &s in &order {
            if let Some(w) = next() {
                rem[s * per_sm + cnt[s]] = w;
                cnt[s] += 1;
            }
        }
    }
    let min_of = |r: &[f64]| r.iter().copied().fold(f64::INFINITY, f64::min);
    // One event per busy SM, its next completion: (time bits — times are ≥ 0, so the bits
    // order as the times —, SM).
    let mut heap: BinaryHeap<Reverse<(u64, u32)>> = BinaryHeap::with_capacity(sms);
    for s in 0..sms {
        if cnt[s] > 0 {
            let r = &rem[s * per_sm..s * per_sm + cnt[s]];
            heap.push(Reverse(((min_of(r) * slow[cnt[s]]).to_bits(), s as u32)));
        }
    }
    let mut end = 0.0f64;
    // The SMs whose events fire at one instant (in order: one at a time), and their freed
    // slots, one entry per slot.
    let mut batch: Vec<usize> = Vec::with_capacity(sms);
    let mut freed: Vec<usize> = Vec::with_capacity(sms * per_sm);
    while let Some(&Reverse((tb, s0))) = heap.peek() {
        // The top's SM alone fires now unless another event ties with it (then one ties at
        // a child of the root): it is updated in place.
        let tie = |e: Option<&Reverse<(u64, u32)>>| e.is_some_and(|e| e.0 .0 == tb);
        let alone = rng.is_none() || {
            let h = heap.as_slice();
            !tie(h.get(1)) && !tie(h.get(2))
        };
        batch.clear();
        if alone {
            batch.push(s0 as usize);
        } else {
            while let Some(&Reverse((tb2, s32))) = heap.peek() {
                if tb2 != tb {
                    break;
                }
                heap.pop();
                batch.push(s32 as usize);
            }
        }
        let t = f64::from_bits(tb);
        freed.clear();
        for &s in &batch {
            let k = cnt[s];
            let slots = &mut rem[s * per_sm..(s + 1) * per_sm];
            let done = (t - last[s]) / slow[k];
            let min = min_of(&slots[..k]);
            // The block(s) that end now leave; the others advance by the same work. `done`
            // comes from absolute times, so it can miss `min` by a few ulps of `t`: a block
            // stays only when it is further than that from ending (then what is left of it
            // is > 0), so the block that set this event always leaves and every event
            // retires one block at least (a remainder left ≤ 0 would set an event at `t`
            // that retires nothing, forever).
            let tol = (min * 1e-12).max(4.0 * f64::EPSILON * t);
            let mut j = 0;
            for i in 0..k {
                let w = slots[i];
                if w - min > tol {
                    slots[j] = (w - done).max(0.0);
                    j += 1;
                }
            }
            cnt[s] = j;
            last[s] = t;
            freed.extend(std::iter::repeat_n(s, per_sm - j));
        }
        if let Some(r) = rng.as_deref_mut() {
            freed.shuffle(r);
        }
        for &s in &freed {
            match next() {
                Some(w) => {
                    rem[s * per_sm + cnt[s]] = w;
                    cnt[s] += 1;
                }
                None => break,
            }
        }
        end = end.max(t);
        let fin = |s: usize| {
            let r = &rem[s * per_sm..s * per_sm + cnt[s]];
            Reverse(((t + min_of(r) * slow[cnt[s]]).to_bits(), s as u32))
        };
        if alone {
            let s = s0 as usize;
            if cnt[s] > 0 {
                if let Some(mut top) = heap.peek_mut() {
                    *top = fin(s);
                }
            } else {
                heap.pop();
            }
        } else {
            for &s in &batch {
                if cnt[s] > 0 {
                    heap.push(fin(s));
                }
            }
        }
    }
    end
}

/// One measured or planned launch's blocks, ready to be priced under any [`BlockModel`] of
/// the same geometry (the fit prices each launch many times).
#[derive(Clone, Debug)]
pub struct LaunchBlocks {
    /// One head's block shapes in launch order.
    pub shapes: Vec<BlockShape>,
    /// Query heads of the launch (each runs `shapes`).
    pub heads: u32,
    /// Head dimension d.
    pub head_dim: u32,
}

impl LaunchBlocks {
    /// The launch of `segs` under `mask` at `heads` query heads per call.
    pub fn new(
        m: &BlockModel,
        mask: Mask,
        heads: u32,
        head_dim: u32,
        segs: impl IntoIterator<Item = (u64, u64, u32)>,
    ) -> Self {
        Self {
            shapes: launch_blocks(m, mask, segs),
            heads,
            head_dim,
        }
    }

    /// The launch's makespan under `m`, ps (without the call overhead).
    pub fn makespan_ps(&self, m: &BlockModel) -> f64 {
        self.makespan_ps_by(m, |times, h| list_makespan_ps(m.slots(), times, h))
    }

    /// [`LaunchBlocks::makespan_ps`] with the list schedule of `h` heads of the blocks'
    /// times from `list(times, h)`.
    fn makespan_ps_by(&self, m: &BlockModel, list: impl FnOnce(&[f64], u32) -> f64) -> f64 {
        let times: Vec<f64> = self
            .shapes
            .iter()
            .map(|&b| m.block_ps(b, self.head_dim))
            .collect();
        makespan_ps_by(m.slots(), &times, self.heads, |h| list(&times, h))
    }
}

/// The forward time in ps of one launch under `mask` whose segments the table prices at
/// `table_ps`: `table_ps` itself without a block model, else the launch's blocks'
/// makespan. The call overhead is the caller's.
pub fn launch_fwd_ps_f(
    table_ps: f64,
    blocks: Option<&BlockModel>,
    (mask, head_dim, heads): (Mask, u32, u32),
    segs: impl IntoIterator<Item = (u64, u64, u32)>,
) -> f64 {
    match blocks {
        None => table_ps,
        Some(m) => LaunchBlocks::new(m, mask, heads, head_dim, segs).makespan_ps(m),
    }
}

/// Rows per tile of the backward kernels (`attn_bwd.cu`, NWARPS = 4: query tiles of dQ and
/// key tiles of dK/dV).
pub const BWD_BLOCK_M: u32 = 64;
/// Rows per step of the backward kernels' inner loops (keys for dQ, queries for dK/dV).
pub const BWD_BLOCK_N: u32 = 64;
/// Resident blocks per SM of the backward kernels: 6·64·128·2 + 1024 B = 97 KiB of shared
/// memory each at head_dim 128, 128 threads.
pub const BWD_BLOCKS_PER_SM: u32 = 2;

fn default_bwd_block() -> u32 {
    BWD_BLOCK_M
}
fn default_bwd_blocks_per_sm() -> u32 {
    BWD_BLOCKS_PER_SM
}

/// The backward call's kernels as thread blocks on the SMs (a calibration's
/// `attn_bwd_blocks`): one call of `validate/kernels/attn_bwd.cu` is the zeroing of dK/dV
/// and `attn_bwd_dot` (priced per query row × head), then the dQ launch and the dK/dV
/// launch, each the makespan of its blocks ([`bwd_dq_blocks`], [`bwd_dkdv_blocks`]) with
/// co-resident blocks sharing an SM by `pair_slowdown` ([`makespan_ps`]).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BwdBlockModel {
    /// The dot kernel and the zeroing of dK/dV per query row × query head of the call, ns.
    pub row_head_ns: f64,
    /// A dQ block: a query tile of `block_m` rows over its key blocks of `block_n` keys.
    pub dq: BlockTimes,
    /// A dK/dV block: a key tile of `block_m` keys over the query blocks of `block_n` rows
    /// that see it.
    pub dkdv: BlockTimes,
    /// Time factor of each of two blocks sharing an SM (both launches).
    pub pair_slowdown: f64,
    /// The head dimension the times were fitted at (steps scale with head_dim).
    #[serde(default = "default_head_dim")]
    pub head_dim: u32,
    /// SMs the blocks are scheduled onto.
    #[serde(default = "default_sms")]
    pub sms: u32,
    /// Blocks resident on one SM at a time.
    #[serde(default = "default_bwd_blocks_per_sm")]
    pub blocks_per_sm: u32,
    /// Rows per tile (query rows of a dQ block, keys of a dK/dV block).
    #[serde(default = "default_bwd_block")]
    pub block_m: u32,
    /// Rows per step (keys for dQ, query rows for dK/dV).
    #[serde(default = "default_bwd_block")]
    pub block_n: u32,
    /// The order the dK/dV grid hands its blocks to the SMs.
    #[serde(default, skip_serializing_if = "TileOrder::is_longest_first")]
    pub order: TileOrder,
    /// Whether dQ is a launch of its own (the project's kernels) or accumulated by the
    /// dK/dV blocks as they go (FlashAttention-2: its conversion is per row × head).
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub dq_launch: bool,
    /// Time per byte of the grouped-query reduction, ps (1 / its bandwidth; 0: the kernel
    /// has none). FlashAttention-2 computes dK and dV per query head and, when a call has
    /// fewer KV heads than query heads, sums each group's into its KV head afterwards
    /// ([`group_reduce_bytes`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub reduce_ps_per_byte: f64,
}

fn yes() -> bool {
    true
}

fn is_true(v: &bool) -> bool {
    *v
}

impl BwdBlockModel {
    /// The launch layout the model describes (SMs, blocks per SM, tile, head_dim, tile
    /// order): two models with the same layout price the same kernel.
    pub fn layout(&self) -> Layout {
        (
            self.sms,
            self.blocks_per_sm,
            self.block_m,
            self.block_n,
            self.head_dim,
            self.order,
        )
    }
    /// The H200 backward kernels' geometry (132 SMs × 2 resident blocks, 64-row tiles and
    /// steps, head_dim 128) with the given times.
    pub fn h200(row_head_ns: f64, dq: BlockTimes, dkdv: BlockTimes, pair: f64) -> Self {
        Self {
            row_head_ns,
            dq,
            dkdv,
            pair_slowdown: pair,
            head_dim: FWD_HEAD_DIM,
            sms: H200_SMS,
            blocks_per_sm: BWD_BLOCKS_PER_SM,
            block_m: BWD_BLOCK_M,
            block_n: BWD_BLOCK_N,
            order: TileOrder::LongestFirst,
            dq_launch: true,
            reduce_ps_per_byte: 0.0,
        }
    }

    /// How its blocks share the SMs.
    pub fn slots(&self) -> SmSlots {
        SmSlots {
            sms: self.sms,
            blocks_per_sm: self.blocks_per_sm,
            pair_slowdown: self.pair_slowdown,
            placement: Placement::InOrder,
        }
    }

    /// Check the fields; `ctx` names the file.
    pub fn validate(&self, ctx: &str) -> Result<()> {
        let f = |name: &str| format!("{ctx}: attn_bwd_blocks.{name}");
        if !(self.row_head_ns.is_finite() && self.row_head_ns >= 0.0) {
            return Err(invalid(
                f("row_head_ns"),
                self.row_head_ns,
                "a finite time >= 0 ns",
            ));
        }
        if !(self.reduce_ps_per_byte.is_finite() && self.reduce_ps_per_byte >= 0.0) {
            return Err(invalid(
                f("reduce_ps_per_byte"),
                self.reduce_ps_per_byte,
                "a finite time >= 0 ps per byte",
            ));
        }
        self.dq.validate(&|n: &str| f(&format!("dq.{n}")))?;
        self.dkdv.validate(&|n: &str| f(&format!("dkdv.{n}")))?;
        self.slots().validate(&f)?;
        check_geometry(&f, self.head_dim, self.block_m, self.block_n)
    }

    /// The shape of the dQ block of query rows [p0, p1) under `mask`.
    pub fn dq_shape(&self, mask: Mask, p0: u64, p1: u64) -> BlockShape {
        query_tile_shape(self.block_n, mask, p0, p1, true)
    }
}

/// The dQ launch's blocks of one head in launch order: the query tiles of `m.block_m` rows
/// of every segment (queries [start, end) under `mask`), each over the key blocks its rows
/// reach, most keys first — the forward's tiling at the backward's tile size.
pub fn bwd_dq_blocks(
    m: &BwdBlockModel,
    mask: Mask,
    segs: impl IntoIterator<Item = (u64, u64, u32)>,
) -> Vec<BlockShape> {
    if !m.dq_launch {
        return Vec::new();
    }
    query_tiles((m.block_m, m.block_n), mask, TileOrder::LongestFirst, segs)
}

/// The first sample-local query past every query that sees a key before `j`, under `mask`
/// ([`prices_mask`]'s masks): a window of W keys ends its last such query at j − 2 + W.
fn queries_end(mask: Mask, j: u64) -> u64 {
    match mask {
        Mask::Sliding { w } => (j + u64::from(w)).saturating_sub(1),
        _ => u64::MAX,
    }
}

/// The dK/dV launch's blocks of one head in launch order (`Layout::key_tiles`): per
/// segment [a, e), its key tiles [j0, j1) = [kb·block_m, min((kb+1)·block_m, e)) of [0, e),
/// each looping over the query blocks of `block_n` rows aligned to a that hold a position
/// ≥ j0: qb0 = (j0 − a)/block_n when j0 > a (else 0) up to qb1 = ⌈(e − a)/block_n⌉, or
/// under a sliding window to the block holding the last query that sees the tile
/// (`queries_end` of the unclamped tile end, as FlashAttention-2 bounds it). A block's
/// rows are its keys (j1 − j0), its masked steps the query blocks starting before j1 (the
/// causal mask cuts them) and those holding rows whose window's lower edge falls inside
/// the tile; a tile no query sees is an empty block. Most query rows seeing the tile
/// (e − max(a, j0)) first, ties: the larger shape first. In `Grid` order: per segment its
/// key tiles from the first, then empty blocks up to the most key tiles any segment has
/// (the dQ conversion's blocks are the per row × head term).
pub fn bwd_dkdv_blocks(
    m: &BwdBlockModel,
    mask: Mask,
    segs: impl IntoIterator<Item = (u64, u64, u32)>,
) -> Vec<BlockShape> {
    let (bm, bn) = (u64::from(m.block_m.max(1)), u64::from(m.block_n.max(1)));
    let segs: Vec<(u64, u64, u32)> = segs.into_iter().filter(|&(a, e, _)| e > a).collect();
    // Query block of sample-local position p ≥ a (aligned to a), rounded up.
    let qb_up = move |a: u64, p: u64| p.saturating_sub(a).div_ceil(bn);
    // One segment's key tiles from the first, each with the query rows that see it.
    let tiles_of = move |a: u64, e: u64| {
        (0..e.div_ceil(bm)).map(move |kb| {
            let (j0, j1) = (kb * bm, ((kb + 1) * bm).min(e));
            let qb0 = if j0 > a { (j0 - a) / bn } else { 0 };
            let qb1 = qb_up(a, e.min(queries_end(mask, (kb + 1) * bm)));
            if qb1 <= qb0 {
                return (0, EMPTY);
            }
            // Query blocks whose first row a + qb·bn lies before j1; those holding rows
            // whose lowest key lies inside (j0, j1) (the window's edge).
            let cut = (qb0, qb_up(a, j1).clamp(qb0, qb1));
            let lo = queries_end(mask, j0 + 1).max(a);
            let edge = ((lo - a) / bn, qb_up(a, queries_end(mask, j1)));
            let edge = (edge.0.clamp(qb0, qb1), edge.1.clamp(qb0, qb1));
            let b = BlockShape {
                n_iter: (qb1 - qb0) as u32,
                n_diag: union_len(cut, edge) as u32,
                rows: (j1 - j0) as u32,
                n_local: 0,
            };
            (e.min(queries_end(mask, j1)).saturating_sub(a.max(j0)), b)
        })
    };
    if m.order == TileOrder::Grid {
        let pad = segs
            .iter()
            .map(|&(_, e, _)| e.div_ceil(bm))
            .max()
            .unwrap_or(0);
        let mut blocks = Vec::new();
        for &(a, e, n) in &segs {
            let mut one: Vec<BlockShape> = tiles_of(a, e).map(|t| t.1).collect();
            one.resize(pad as usize, EMPTY);
            for _ in 0..n {
                blocks.extend_from_slice(&one);
            }
        }
        return blocks;
    }
    let mut blocks: Vec<(u64, BlockShape)> = Vec::new();
    for (a, e, n) in segs {
        for t in tiles_of(a, e) {
            blocks.extend(std::iter::repeat_n(t, n as usize));
        }
    }
    blocks.sort_unstable_by(|x, y| y.cmp(x));
    blocks.into_iter().map(|b| b.1).collect()
}

/// Bytes of the grouped-query reduction of one backward call of `heads` query heads over
/// `kv_heads` KV heads: dK and dV of every key each read at every query head and written at
/// every KV head, bf16 (FlashAttention-2's `dk_expanded` summed over the group); 0 when
/// the call has a KV head per query head.
pub fn group_reduce_bytes(
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    segs: impl IntoIterator<Item = (u64, u64, u32)>,
) -> f64 {
    if kv_heads >= heads {
        return 0.0;
    }
    let keys: u64 = segs.into_iter().map(|(_, e, n)| e * u64::from(n)).sum();
    2.0 * keys as f64 * f64::from(heads + kv_heads) * f64::from(head_dim) * 2.0
}

/// One backward call's blocks (both launches) and its query rows × heads, ready to be
/// priced under any [`BwdBlockModel`] of the same geometry.
#[derive(Clone, Debug)]
pub struct BwdLaunchBlocks {
    /// One head's dQ blocks in launch order.
    pub dq: Vec<BlockShape>,
    /// One head's dK/dV blocks in launch order.
    pub dkdv: Vec<BlockShape>,
    /// Query rows of the call (Σ segments' queries).
    pub rows: u64,
    /// Bytes of its grouped-query reduction ([`group_reduce_bytes`]).
    pub reduce_bytes: f64,
    /// Query heads of the launch (each runs `dq` and `dkdv`).
    pub heads: u32,
    /// Head dimension d.
    pub head_dim: u32,
}

impl BwdLaunchBlocks {
    /// The backward call of `segs` under `mask` at `heads` query heads over `kv_heads` KV
    /// heads.
    pub fn new(
        m: &BwdBlockModel,
        mask: Mask,
        heads: u32,
        kv_heads: u32,
        head_dim: u32,
        segs: impl IntoIterator<Item = (u64, u64, u32)> + Clone,
    ) -> Self {
        Self {
            dq: bwd_dq_blocks(m, mask, segs.clone()),
            dkdv: bwd_dkdv_blocks(m, mask, segs.clone()),
            reduce_bytes: group_reduce_bytes(heads, kv_heads, head_dim, segs.clone()),
            rows: segs
                .into_iter()
                .map(|(a, e, n)| e.saturating_sub(a) * u64::from(n))
                .sum(),
            heads,
            head_dim,
        }
    }

    /// The call's four terms under `m`, ps: the per-row-head work, the dQ launch's
    /// makespan, the dK/dV launch's makespan and the grouped-query reduction.
    pub fn parts_ps(&self, m: &BwdBlockModel) -> [f64; 4] {
        self.parts_ps_by(m, &mut |_, times, h| list_makespan_ps(m.slots(), times, h))
    }

    /// [`BwdLaunchBlocks::parts_ps`] with the list schedule of `h` heads of a launch's
    /// blocks' times from `list(launch, times, h)` (launch 0: dQ, 1: dK/dV).
    fn parts_ps_by(
        &self,
        m: &BwdBlockModel,
        list: &mut dyn FnMut(u8, &[f64], u32) -> f64,
    ) -> [f64; 4] {
        let d = head_dim_scale(self.head_dim, m.head_dim);
        let mut span = |launch: u8, t: &BlockTimes, shapes: &[BlockShape]| {
            let times: Vec<f64> = shapes
                .iter()
                .map(|&b| t.block_ps(b, d, m.block_m))
                .collect();
            makespan_ps_by(m.slots(), &times, self.heads, |h| list(launch, &times, h))
        };
        [
            1e3 * m.row_head_ns * (self.rows * u64::from(self.heads)) as f64,
            span(0, &m.dq, &self.dq),
            span(1, &m.dkdv, &self.dkdv),
            m.reduce_ps_per_byte * self.reduce_bytes,
        ]
    }

    /// The call's time under `m`, ps (without the call overhead).
    pub fn time_ps(&self, m: &BwdBlockModel) -> f64 {
        self.parts_ps(m).iter().sum()
    }
}

/// The backward time in ps of one call under `mask` whose segments the table prices at
/// `table_ps`: `table_ps` itself without a backward block model, else its blocks' price
/// ([`BwdLaunchBlocks::time_ps`]). The call overhead is the caller's.
pub fn launch_bwd_ps_f(
    table_ps: f64,
    blocks: Option<&BwdBlockModel>,
    (mask, head_dim): (Mask, u32),
    (heads, kv_heads): (u32, u32),
    segs: impl IntoIterator<Item = (u64, u64, u32)> + Clone,
) -> f64 {
    match blocks {
        None => table_ps,
        Some(m) => BwdLaunchBlocks::new(m, mask, heads, kv_heads, head_dim, segs).time_ps(m),
    }
}

/// A launch priced once: the pass, model (as its `Debug` text: every figure's shortest
/// exact decimal) and mask, query and KV heads, head_dim and segments — in canonical order
/// where the kernel sorts them, else in the caller's.
type LaunchKey = (String, (u32, u32), u32, Vec<(u64, u64, u32)>);

/// Entries, and segments over all keys, of one generation of the memo (over all its
/// shards); the memo keeps two, so it holds at most twice these (~100 MB of keys).
const MEMO_CAP: usize = 1 << 17;
const MEMO_SEGS: usize = 1 << 21;
/// Shards of the memo, each behind its own lock (threads pricing at once rarely meet).
const MEMO_SHARDS: usize = 64;

/// One shard: the current generation of entries, the previous one, and the segments the
/// current one's keys hold. A full generation becomes the previous one (the one before is
/// dropped); a hit in the previous one moves into the current one, so launches still in
/// use outlive the turn.
#[derive(Default)]
struct Shard {
    new: HashMap<LaunchKey, f64>,
    old: HashMap<LaunchKey, f64>,
    segs: usize,
}

impl Shard {
    fn insert(&mut self, key: LaunchKey, t: f64) {
        if self.new.len() >= MEMO_CAP / MEMO_SHARDS
            || self.segs + key.3.len() > MEMO_SEGS / MEMO_SHARDS
        {
            self.old = std::mem::take(&mut self.new);
            self.segs = 0;
        }
        self.segs += key.3.len();
        self.new.insert(key, t);
    }
}

/// The shards of one memo.
struct Store(Vec<Mutex<Shard>>);

impl Store {
    fn new() -> Self {
        Store((0..MEMO_SHARDS).map(|_| Mutex::default()).collect())
    }

    fn shard(&self, key: &LaunchKey) -> &Mutex<Shard> {
        use std::hash::{BuildHasher, BuildHasherDefault};
        let h = BuildHasherDefault::<std::hash::DefaultHasher>::default().hash_one(key);
        &self.0[(h % self.0.len() as u64) as usize]
    }

    fn get(&self, key: &LaunchKey) -> Option<f64> {
        let mut c = self.shard(key).lock().ok()?;
        if let Some(&t) = c.new.get(key) {
            return Some(t);
        }
        let (k, t) = c.old.remove_entry(key)?;
        c.insert(k, t);
        Some(t)
    }

    fn put(&self, key: LaunchKey, t: f64) {
        if let Ok(mut c) = self.shard(&key).lock() {
            c.insert(key, t);
        }
    }
}

/// Block prices of launches already priced: one store for the whole process, which every
/// cost model's memo shares (a simulation prices the same launch on every rank of a CP
/// group and every head chunk; the points of a sweep, the candidates of a search and their
/// seeds price many of the same launches), and within it the list schedules of a launch's
/// blocks at the heads scheduled exactly ([`makespan_ps`]), which launches of the same
/// segments at different head counts share (a TP or CP degree, Libra's H and M). A pure
/// cache: the key holds everything the price depends on, model included, so a hit returns
/// the bits [`launch_fwd_ps_f`] / [`launch_bwd_ps_f`] would compute.
#[derive(Clone)]
pub struct LaunchMemo(Arc<Store>);

impl Default for LaunchMemo {
    /// The process's store.
    fn default() -> Self {
        static STORE: std::sync::OnceLock<Arc<Store>> = std::sync::OnceLock::new();
        LaunchMemo(STORE.get_or_init(|| Arc::new(Store::new())).clone())
    }
}

impl std::fmt::Debug for LaunchMemo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n: usize = (self.0 .0.iter())
            .map(|s| s.lock().map_or(0, |m| m.new.len() + m.old.len()))
            .sum();
        write!(f, "LaunchMemo({n} entries)")
    }
}

impl LaunchMemo {
    /// `key`'s price, else `price(key's segments)` remembered.
    fn get_or(
        &self,
        (model, order): (String, TileOrder),
        heads: (u32, u32),
        head_dim: u32,
        segs: impl IntoIterator<Item = (u64, u64, u32)>,
        price: impl FnOnce(&[(u64, u64, u32)]) -> f64,
    ) -> f64 {
        let mut segs: Vec<(u64, u64, u32)> = segs.into_iter().collect();
        // A grid runs the segments as the caller passes them; the project's kernels sort.
        if order != TileOrder::Grid {
            segs.sort_unstable();
        }
        self.get_or_key((model, heads, head_dim, segs), price)
    }

    fn get_or_key(&self, key: LaunchKey, price: impl FnOnce(&[(u64, u64, u32)]) -> f64) -> f64 {
        if let Some(t) = self.0.get(&key) {
            return t;
        }
        // Priced outside the lock: other threads price other launches meanwhile.
        let t = price(&key.3);
        self.0.put(key, t);
        t
    }

    /// The list schedule of `h` heads of `times`, the blocks of the launch of `segs`
    /// (canonical order) under `model` (its text names the pass) at `head_dim`.
    fn list_ps(
        &self,
        (model, slots): (String, SmSlots),
        head_dim: u32,
        segs: &[(u64, u64, u32)],
        times: &[f64],
        h: u32,
    ) -> f64 {
        let key = (format!("list {model}"), (h, 0), head_dim, segs.to_vec());
        self.get_or_key(key, |_| list_makespan_ps(slots, times, h))
    }

    /// [`launch_fwd_ps_f`] under `m`, once per distinct launch.
    pub fn fwd_ps(
        &self,
        m: &BlockModel,
        (mask, head_dim): (Mask, u32),
        heads: u32,
        segs: impl IntoIterator<Item = (u64, u64, u32)>,
    ) -> f64 {
        let text = format!("fwd {m:?} {mask}");
        self.get_or(
            (text.clone(), m.order),
            (heads, heads),
            head_dim,
            segs,
            |s| {
                LaunchBlocks::new(m, mask, heads, head_dim, s.iter().copied())
                    .makespan_ps_by(m, |times, h| {
                        self.list_ps((text, m.slots()), head_dim, s, times, h)
                    })
            },
        )
    }

    /// [`launch_bwd_ps_f`] under `m`, once per distinct call.
    pub fn bwd_ps(
        &self,
        m: &BwdBlockModel,
        (mask, head_dim): (Mask, u32),
        (heads, kv_heads): (u32, u32),
        segs: impl IntoIterator<Item = (u64, u64, u32)>,
    ) -> f64 {
        let text = format!("bwd {m:?} {mask}");
        self.get_or(
            (text.clone(), m.order),
            (heads, kv_heads),
            head_dim,
            segs,
            |s| {
                let call =
                    BwdLaunchBlocks::new(m, mask, heads, kv_heads, head_dim, s.iter().copied());
                let mut list = |launch: u8, times: &[f64], h: u32| {
                    let model = (format!("{launch} {text}"), m.slots());
                    self.list_ps(model, head_dim, s, times, h)
                };
                call.parts_ps_by(m, &mut list).iter().sum()
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const C: Mask = Mask::Causal;

    /// Blocks that end within an ulp of the clock of each other, late in a long launch (the
    /// clock's rounding can leave one with a remainder below 0, whose event must still retire
    /// it): the schedule ends, every block's work done.
    #[test]
    fn near_ties_late_in_a_launch_end() {
        let m = SmSlots {
            sms: 1,
            blocks_per_sm: 3,
            pair_slowdown: 1.3,
            placement: Placement::InOrder,
        };
        let mut times = vec![1e9];
        for i in 0..4000 {
            times.push(1.0 + f64::from(i % 7) * 1e-3);
            times.push(1.0 + f64::from(i % 7) * 1e-3 + 1e-10);
        }
        let t = list_makespan_ps(m, &times, 1);
        // The long block alone after the others: its 1e9 plus what it lost sharing.
        assert!(t >= 1e9 && t.is_finite(), "{t}");
    }

    /// Two long blocks after a first fill of empty ones, on 4 SMs × 2 slots: in order, the
    /// first SM to free takes both (paired, 1.5× each); at any free slot, the second lands
    /// on the first's SM in 1 draw of 7 in expectation (1 of the 7 other freed slots), so the
    /// median draw runs them alone. Draws are seeded: the same makespan every time.
    #[test]
    fn any_free_slot_spreads_blocks_that_free_together() {
        let mut times = vec![1.0; 8];
        times.extend([1000.0, 1000.0]);
        let slots = |placement| SmSlots {
            sms: 4,
            blocks_per_sm: 2,
            pair_slowdown: 1.5,
            placement,
        };
        let in_order = list_makespan_ps(slots(Placement::InOrder), &times, 1);
        assert_eq!(in_order, 1.5 + 1500.0);
        let any = list_makespan_ps(slots(Placement::AnyFreeSlot), &times, 1);
        assert_eq!(any, 1.5 + 1000.0);
        assert_eq!(
            list_makespan_ps(slots(Placement::AnyFreeSlot), &times, 1).to_bits(),
            any.to_bits()
        );
        // The first block of every SM goes one per SM either way: 4 long blocks first run
        // alone, whatever the rest.
        let mut first = vec![1000.0; 4];
        first.extend([1.0; 12]);
        for p in [Placement::InOrder, Placement::AnyFreeSlot] {
            let t = list_makespan_ps(slots(p), &first, 1);
            assert!(t < 1000.0 + 10.0, "{p:?}: {t}");
        }
    }

    /// The median of 7 is settled by the first 4 draws when they agree, by 5 when 4 of them
    /// are at or below a value only one lies under, and only by all 7 otherwise.
    #[test]
    fn the_median_is_settled_as_soon_as_the_draws_fix_it() {
        assert_eq!(settled_median(&mut [3.0, 3.0, 3.0, 3.0], 7), Some(3.0));
        assert_eq!(settled_median(&mut [3.0, 3.0, 3.0, 2.0], 7), None);
        assert_eq!(settled_median(&mut [3.0, 3.0, 3.0, 2.0, 3.0], 7), Some(3.0));
        assert_eq!(settled_median(&mut [3.0, 3.0, 1.0, 2.0, 3.0], 7), None);
        assert_eq!(
            settled_median(&mut [5.0, 1.0, 4.0, 2.0, 7.0, 3.0, 6.0], 7),
            Some(4.0)
        );
        // As the draws themselves: the settled median is the full sort's middle.
        let mut times = vec![1.0; 300];
        times.extend([900.0, 1000.0, 1100.0, 700.0]);
        let m = SmSlots {
            sms: 132,
            blocks_per_sm: 2,
            pair_slowdown: 1.6,
            placement: Placement::AnyFreeSlot,
        };
        let mut all: Vec<f64> = (0..PLACEMENT_DRAWS)
            .map(|seed| list_schedule_ps(m, &times, 1, Some(&mut ChaCha8Rng::seed_from_u64(seed))))
            .collect();
        all.sort_unstable_by(f64::total_cmp);
        assert_eq!(list_makespan_ps(m, &times, 1), all[all.len() / 2]);
    }

    /// Unit step, no fixed or diagonal cost, no row share: a block's time = its steps, ns.
    fn steps_only(pair: f64) -> BlockModel {
        BlockModel::h200(0.0, 1.0, 0.0, 0.0, pair)
    }

    #[test]
    fn blocks_are_the_kernels_tiles_most_keys_first() {
        let m = steps_only(1.5);
        // Queries [100, 400) of one sample: tiles [100,228), [228,356), [356,400).
        let b = launch_blocks(&m, C, [(100, 400, 1), (0, 64, 2)]);
        let s = |p0: u64, p1: u64| m.shape(C, p0, p1);
        assert_eq!(
            b,
            vec![s(356, 400), s(228, 356), s(100, 228), s(0, 64), s(0, 64)]
        );
        // [356, 400): keys [0, 400) in ⌈400/64⌉ = 7 steps; steps from ⌊356/64⌋ = 5 on reach
        // its first row.
        assert_eq!(
            s(356, 400),
            BlockShape {
                n_iter: 7,
                n_diag: 2,
                rows: 44,
                n_local: 0
            }
        );
        // A 1-row tile at the end of a long sample visits every key block.
        assert_eq!(s(49_999, 50_000).n_iter, 782);
    }

    #[test]
    fn block_time_by_hand() {
        let m = BlockModel::h200(2.0, 10.0, 0.25, 3.0, 1.4);
        let b = BlockShape {
            n_iter: 7,
            n_diag: 2,
            rows: 64,
            n_local: 0,
        };
        // 2 + 7 · 10 · (0.75 + 0.25 · 0.5) + 2 · 3 = 69.25 ns.
        assert!((m.block_ps(b, 128) - 69_250.0).abs() < 1e-6);
        // head_dim 64: the steps at half the time, the fixed part unchanged.
        assert!((m.block_ps(b, 64) - (2.0 + 67.25 / 2.0) * 1e3).abs() < 1e-6);
    }

    #[test]
    fn co_resident_blocks_share_their_sm() {
        // One SM, two slots, pair slowdown 1.5: blocks of 4 and 2 run together at 1/1.5
        // until the 2 ends (t = 3), the 4 has 2 left alone: 5.
        let mut m = steps_only(1.5);
        m.sms = 1;
        assert_eq!(makespan_ps(m.slots(), &[4.0, 2.0], 1), 5.0);
        // Slowdown 2 (no gain from sharing): the SM's work, 6.
        m.pair_slowdown = 2.0;
        assert_eq!(makespan_ps(m.slots(), &[4.0, 2.0], 1), 6.0);
        // Two SMs, blocks 4, 1, 1: SM0 takes 4, SM1 1, then SM0's second slot the last 1.
        // SM0 shares until t = 2, the 4 has 3 left alone: 5. One slot per SM: 4.
        m.sms = 2;
        assert_eq!(makespan_ps(m.slots(), &[4.0, 1.0, 1.0], 1), 5.0);
        m.blocks_per_sm = 1;
        assert_eq!(makespan_ps(m.slots(), &[4.0, 1.0, 1.0], 1), 4.0);
        // One slot: loads 10, 6, 5, 4, 3 in order on 2 SMs: SM0 10; SM1 6, 11; SM0 14; SM1 14.
        assert_eq!(makespan_ps(m.slots(), &[10.0, 6.0, 5.0, 4.0, 3.0], 1), 14.0);
        assert_eq!(makespan_ps(m.slots(), &[1.0], 0), 0.0);
        assert_eq!(makespan_ps(m.slots(), &[], 4), 0.0);
    }

    #[test]
    fn a_launch_is_bound_by_its_last_wave_or_by_throughput() {
        let m = steps_only(1.25);
        // 132 equal blocks (one per SM): one block's time.
        assert_eq!(makespan_ps(m.slots(), &[7.0; 132], 1), 7.0);
        // 264 (two per SM, each 1.25× slower): 8.75.
        assert_eq!(makespan_ps(m.slots(), &[7.0; 132], 2), 8.75);
        // 265: one SM takes a third once its pair ends, alone: 8.75 + 7.
        assert_eq!(makespan_ps(m.slots(), &[7.0; 265], 1), 15.75);
        // Many blocks: the SMs' throughput, 132 × 2 / 1.25 blocks per block-time.
        let n = 264 * 100;
        let t = makespan_ps(m.slots(), &vec![1.0; n], 1);
        assert!((t - 100.0 * 1.25).abs() < 1e-9, "{t}");
    }

    #[test]
    fn heads_past_the_budget_pass_at_the_steady_rate() {
        let m = steps_only(1.4);
        // 300 blocks of 1..=300 ns per head, 64 heads: 19,200 blocks, over the budget.
        let times: Vec<f64> = (1..=300).rev().map(f64::from).collect();
        let exact = EXACT_BLOCKS / 300;
        assert_eq!(exact, 27);
        let head = 300.0 * 301.0 / 2.0;
        let rate = 132.0 * 2.0 / 1.4;
        let want = list_makespan_ps(m.slots(), &times, 27) + 37.0 * head / rate;
        assert_eq!(makespan_ps(m.slots(), &times, 64), want);
        // Against the full list schedule: within 1 %.
        let full = list_makespan_ps(m.slots(), &times, 64);
        assert!((want / full - 1.0).abs() < 0.01, "{want} {full}");
        // Within the budget: the list schedule itself.
        assert_eq!(
            makespan_ps(m.slots(), &times, 27),
            list_makespan_ps(m.slots(), &times, 27)
        );
    }

    #[test]
    fn the_memo_returns_the_price_and_keys_on_the_model() {
        let memo = LaunchMemo::default();
        let m = BlockModel::h200(1.0, 2.0, 0.1, 0.5, 1.4);
        let segs = [(0u64, 5000u64, 2u32), (100, 900, 1)];
        let want = launch_fwd_ps_f(0.0, Some(&m), (C, 128, 8), segs);
        // Any order of the segments, twice: the same bits.
        let rev = [segs[1], segs[0]];
        assert_eq!(memo.fwd_ps(&m, (C, 128), 8, segs).to_bits(), want.to_bits());
        assert_eq!(memo.fwd_ps(&m, (C, 128), 8, rev).to_bits(), want.to_bits());
        // Another model, heads or head_dim: priced afresh, not served the first price.
        let m2 = BlockModel { iter_ns: 4.0, ..m };
        let p2 = memo.fwd_ps(&m2, (C, 128), 8, segs);
        assert_eq!(
            p2.to_bits(),
            launch_fwd_ps_f(0.0, Some(&m2), (C, 128, 8), segs).to_bits()
        );
        assert_ne!(p2, want);
        assert_ne!(memo.fwd_ps(&m, (C, 128), 4, segs), want);
        assert_ne!(memo.fwd_ps(&m, (C, 64), 8, segs), want);
    }

    /// Launches of the same segments at several head counts share the list schedule of
    /// the heads scheduled exactly: each still prices to the bits of its own launch,
    /// forward and backward, whichever head count comes first.
    #[test]
    fn head_counts_share_a_list_schedule_and_keep_their_bits() {
        let m = BlockModel {
            order: TileOrder::Grid,
            empty_ns: 0.3,
            placement: Placement::AnyFreeSlot,
            ..BlockModel::h200(1.0, 2.0, 0.1, 0.5, 1.6)
        };
        let b = bwd_model();
        // 3 segments padded to 40 tiles of 128 rows: 120 blocks a head, 68 heads exact
        let segs = [(0u64, 5000u64, 1u32), (0, 300, 1), (4000, 4100, 1)];
        for heads in [[96u32, 1, 8, 68, 69, 200], [200, 69, 68, 8, 1, 96]] {
            let memo = LaunchMemo(Arc::new(Store::new()));
            for h in heads {
                let want = launch_fwd_ps_f(0.0, Some(&m), (C, 128, h), segs);
                assert_eq!(memo.fwd_ps(&m, (C, 128), h, segs).to_bits(), want.to_bits());
                let want = launch_bwd_ps_f(0.0, Some(&b), (C, 128), (h, 1), segs);
                let got = memo.bwd_ps(&b, (C, 128), (h, 1), segs);
                assert_eq!(got.to_bits(), want.to_bits(), "{h} heads");
            }
        }
    }

    /// A grid runs the segments in the caller's order: the memo keys on that order, and
    /// the long segment first or last are two launches.
    #[test]
    fn a_grid_launch_is_priced_in_the_callers_order() {
        let memo = LaunchMemo::default();
        let m = BlockModel {
            order: TileOrder::Grid,
            empty_ns: 0.1,
            ..BlockModel::h200(1.0, 2.0, 0.1, 0.5, 1.5)
        };
        let long = (120_000u64, 120_128u64, 1u32);
        let mut segs = vec![(0u64, 128u64, 1u32); 300];
        segs.insert(0, long);
        let first = launch_fwd_ps_f(0.0, Some(&m), (C, 128, 1), segs.clone());
        segs.rotate_left(1);
        let last = launch_fwd_ps_f(0.0, Some(&m), (C, 128, 1), segs.clone());
        // Last, the long block waits for a free slot behind 300 short ones, then runs
        // alone; first, it shares its SM with a stream of them from the start.
        assert_ne!(first.to_bits(), last.to_bits());
        assert_eq!(
            memo.fwd_ps(&m, (C, 128), 1, segs.clone()).to_bits(),
            last.to_bits()
        );
        segs.rotate_right(1);
        assert_eq!(
            memo.fwd_ps(&m, (C, 128), 1, segs).to_bits(),
            first.to_bits()
        );
    }

    #[test]
    fn the_group_reduction_by_hand() {
        // 4 query heads over 1 KV head, head_dim 128, two segments ending at 1,000 and
        // 3 × 500 keys: 2 (dK, dV) × 2,500 keys × (4 read + 1 written) × 128 × 2 bytes.
        let segs = [(900u64, 1000u64, 1u32), (0, 500, 3)];
        let bytes = group_reduce_bytes(4, 1, 128, segs);
        assert_eq!(bytes, 2.0 * 2500.0 * 5.0 * 128.0 * 2.0);
        assert_eq!(group_reduce_bytes(4, 4, 128, segs), 0.0);
        let m = BwdBlockModel {
            reduce_ps_per_byte: 0.25,
            ..bwd_model()
        };
        let grouped = BwdLaunchBlocks::new(&m, C, 4, 1, 128, segs);
        let plain = BwdLaunchBlocks::new(&m, C, 4, 4, 128, segs);
        assert_eq!(grouped.parts_ps(&m)[3], 0.25 * bytes);
        assert_eq!(plain.parts_ps(&m)[3], 0.0);
        assert_eq!(grouped.parts_ps(&m)[..3], plain.parts_ps(&m)[..3]);
        let bad = BwdBlockModel {
            reduce_ps_per_byte: -1.0,
            ..m
        };
        let e = bad.validate("c.json").unwrap_err().to_string();
        assert!(
            e.contains("c.json: attn_bwd_blocks.reduce_ps_per_byte"),
            "{e}"
        );
    }

    #[test]
    fn no_block_model_returns_the_table_price_bit_for_bit() {
        let t = 123_456.789_f64;
        assert_eq!(
            launch_fwd_ps_f(t, None, (C, 128, 8), [(0, 4096, 3)]).to_bits(),
            t.to_bits()
        );
        // With one, the blocks' makespan: 1 segment of 128 rows at keys [0, 128), 1 head:
        // 2 steps, both on the diagonal.
        let m = BlockModel::h200(1.0, 2.0, 0.0, 0.5, 1.5);
        let p = launch_fwd_ps_f(t, Some(&m), (C, 128, 1), [(0, 128, 1)]);
        assert!(
            (p - (1.0 + 2.0 * 2.0 + 2.0 * 0.5) * 1e3).abs() < 1e-6,
            "{p}"
        );
    }

    #[test]
    fn bad_fields_are_named() {
        let ok = BlockModel::h200(1.0, 2.0, 0.1, 0.5, 1.4);
        assert!(ok.validate("cal.json").is_ok());
        let cases: [(&str, BlockModel); 10] = [
            ("iter_ns", BlockModel { iter_ns: 0.0, ..ok }),
            (
                "block_ns",
                BlockModel {
                    block_ns: -1.0,
                    ..ok
                },
            ),
            (
                "diag_ns",
                BlockModel {
                    diag_ns: f64::NAN,
                    ..ok
                },
            ),
            (
                "row_share",
                BlockModel {
                    row_share: 1.5,
                    ..ok
                },
            ),
            (
                "pair_slowdown",
                BlockModel {
                    pair_slowdown: 0.5,
                    ..ok
                },
            ),
            ("sms", BlockModel { sms: 0, ..ok }),
            ("sms", BlockModel { sms: 1025, ..ok }),
            (
                "blocks_per_sm",
                BlockModel {
                    blocks_per_sm: 33,
                    ..ok
                },
            ),
            ("block_m", BlockModel { block_m: 8, ..ok }),
            (
                "block_n",
                BlockModel {
                    block_n: 2048,
                    ..ok
                },
            ),
        ];
        for (field, m) in cases {
            let e = m.validate("cal.json").unwrap_err().to_string();
            assert!(e.contains(&format!("cal.json: attn_blocks.{field}")), "{e}");
        }
        let j: BlockModel = serde_json::from_str(
            r#"{"block_ns": 1.0, "iter_ns": 2.0, "row_share": 0.1, "diag_ns": 0.5, "pair_slowdown": 1.4}"#,
        )
        .unwrap();
        assert_eq!(j, ok);
    }

    /// A generation of keys of many segments turns before its segments pass its share of
    /// `MEMO_SEGS`; the previous generation still serves its keys, the one before is gone.
    #[test]
    fn the_memo_is_bounded_by_the_segments_its_keys_hold() {
        let mut shard = Shard::default();
        let per = MEMO_SEGS / MEMO_SHARDS;
        let key = |k: u64| {
            let segs = (0..(per as u64 / 3)).map(|i| (i, i + 1 + k, 1)).collect();
            (String::from("m"), (1, 1), 128, segs)
        };
        for k in 0..4 {
            shard.insert(key(k), k as f64);
            assert!(shard.segs <= per, "{} segments after key {k}", shard.segs);
            assert_eq!(
                shard.segs,
                shard.new.keys().map(|k| k.3.len()).sum::<usize>()
            );
        }
        // keys 0..3 fill one generation, key 3 starts the next
        assert_eq!(shard.new.len(), 1);
        assert_eq!(shard.old.get(&key(2)), Some(&2.0));
        let store = Store(vec![Mutex::new(shard)]);
        let memo = LaunchMemo(Arc::new(store));
        assert_eq!(memo.get_or_key(key(2), |_| -1.0), 2.0);
        assert_eq!(memo.get_or_key(key(3), |_| -1.0), 3.0);
    }

    fn bwd_model() -> BwdBlockModel {
        let t = |b: f64, i: f64, rs: f64, d: f64| BlockTimes {
            block_ns: b,
            iter_ns: i,
            row_share: rs,
            diag_ns: d,
            empty_ns: 0.0,
        };
        BwdBlockModel::h200(0.002, t(3.0, 10.0, 0.5, 1.0), t(5.0, 7.0, 0.25, 2.0), 1.5)
    }

    #[test]
    fn backward_blocks_are_the_kernels_tiles_by_hand() {
        let m = bwd_model();
        let b = |n_iter, n_diag, rows| BlockShape {
            n_iter,
            n_diag,
            rows,
            n_local: 0,
        };
        // Queries [100, 300) of one sample. dQ: tiles [100,164), [164,228), [228,292),
        // [292,300) over ⌈p1/64⌉ key blocks, those from ⌊p0/64⌋ on masked; most keys first.
        assert_eq!(
            bwd_dq_blocks(&m, C, [(100, 300, 1)]),
            vec![b(5, 1, 8), b(5, 2, 64), b(4, 2, 64), b(3, 2, 64)]
        );
        // dK/dV: key tiles kb = 0..5 of [0, 300), query blocks of 64 rows from a = 100,
        // qb1 = ⌈200/64⌉ = 4:
        //   kb0 [0,64):    qb 0..4, none starts before 64          → (4, 0, 64), 200 rows see it
        //   kb1 [64,128):  qb 0..4, qb0 (100) starts before 128    → (4, 1, 64), 200
        //   kb2 [128,192): qb 0..4, qb0, qb1 (164) before 192      → (4, 2, 64), 172
        //   kb3 [192,256): qb 1..4 ((192−100)/64 = 1), qb1, qb2    → (3, 2, 64), 108
        //   kb4 [256,300): qb 2..4, both                            → (2, 2, 44), 44
        assert_eq!(
            bwd_dkdv_blocks(&m, C, [(100, 300, 1)]),
            vec![
                b(4, 1, 64),
                b(4, 0, 64),
                b(4, 2, 64),
                b(3, 2, 64),
                b(2, 2, 44)
            ]
        );
        // Counts repeat blocks; a whole document [0, 64) is one block of each, masked.
        assert_eq!(bwd_dq_blocks(&m, C, [(0, 64, 3)]), vec![b(1, 1, 64); 3]);
        assert_eq!(bwd_dkdv_blocks(&m, C, [(0, 64, 2)]), vec![b(1, 1, 64); 2]);
    }

    /// The enumeration against the validator's own tiling (`validate::units::Layout`, what
    /// `skewsim validate` uploads) and the kernels' loop bounds (`attn_bwd.cu`): the same
    /// blocks, in an order of non-increasing work.
    #[test]
    fn backward_blocks_match_the_validators_layout() {
        use validate::units::{Batch, Layout, WorkUnit};
        let m = bwd_model();
        let units = [
            (0u32, 0u32, 700u32),
            (0, 700, 1500),
            (1, 64, 400),
            (1, 0, 64),
            (2, 1280, 2000),
        ];
        let batch = Batch {
            sample_lens: vec![1500, 400, 2000],
            units: units
                .iter()
                .map(|&(sample, a, e)| WorkUnit {
                    sample: sample as usize,
                    a,
                    e,
                })
                .collect(),
        };
        let segs: Vec<(u64, u64, u32)> = units
            .iter()
            .map(|&(_, a, e)| (u64::from(a), u64::from(e), 1))
            .collect();
        let layout = Layout::new(&batch, 64).unwrap();
        let dq: Vec<BlockShape> = layout
            .tiles
            .iter()
            .map(|t| {
                let u = &batch.units[t.unit as usize];
                let p0 = u.a + t.m_block * 64;
                m.dq_shape(C, u64::from(p0), u64::from((p0 + 64).min(u.e)))
            })
            .collect();
        let kv: Vec<BlockShape> = layout
            .key_tiles(&batch, 64)
            .unwrap()
            .iter()
            .map(|t| {
                // attn_bwd_dkdv's loop: qb0 = j0 > a ? (j0 − a)/64 : 0, qb1 = ⌈(e − a)/64⌉;
                // masked where the query block starts before j1.
                let u = &batch.units[t.unit as usize];
                let (j0, j1) = (t.m_block * 64, (t.m_block * 64 + 64).min(u.e));
                let qb0 = if j0 > u.a { (j0 - u.a) / 64 } else { 0 };
                let qb1 = (u.e - u.a).div_ceil(64);
                let n_diag = (qb0..qb1).filter(|qb| u.a + qb * 64 < j1).count() as u32;
                BlockShape {
                    n_iter: qb1 - qb0,
                    n_diag,
                    rows: j1 - j0,
                    n_local: 0,
                }
            })
            .collect();
        let ours = (
            bwd_dq_blocks(&m, C, segs.clone()),
            bwd_dkdv_blocks(&m, C, segs),
        );
        for (theirs, mine) in [(&dq, &ours.0), (&kv, &ours.1)] {
            let (mut a, mut b) = (theirs.clone(), mine.clone());
            a.sort();
            b.sort();
            assert_eq!(a, b);
        }
        // dQ in the same order of keys visited; dK/dV tiles of every unit in the same order
        // of steps (ties aside).
        let iters = |v: &[BlockShape]| v.iter().map(|b| b.n_iter).collect::<Vec<_>>();
        assert_eq!(iters(&dq), iters(&ours.0));
        assert_eq!(iters(&kv), iters(&ours.1));
    }

    #[test]
    fn a_backward_call_by_hand() {
        let m = bwd_model();
        // One 64-token document at 1 head: 64 rows × 0.002 ns; the dQ block 3 + 10 + 1 ns;
        // the dK/dV block 5 + 7 + 2 ns; each alone on its SM, one launch after the other.
        let want = (64.0 * 0.002 + 14.0 + 14.0) * 1e3;
        let p = launch_bwd_ps_f(0.0, Some(&m), (C, 128), (1, 1), [(0u64, 64u64, 1u32)]);
        assert!((p - want).abs() < 1e-6, "{p} {want}");
        // Two heads: the blocks on two SMs, the row work twice.
        let p2 = launch_bwd_ps_f(0.0, Some(&m), (C, 128), (2, 2), [(0u64, 64u64, 1u32)]);
        assert!((p2 - want - 64.0 * 0.002 * 1e3).abs() < 1e-6, "{p2}");
        // 264 heads: two blocks per SM on all 132 SMs, each 1.5× slower.
        let p3 = launch_bwd_ps_f(0.0, Some(&m), (C, 128), (264, 264), [(0u64, 64u64, 1u32)]);
        let want3 = (264.0 * 64.0 * 0.002 + 1.5 * 28.0) * 1e3;
        assert!((p3 - want3).abs() < 1e-6, "{p3} {want3}");
        // Without a model: the table's price, bit for bit.
        let t = 98_765.5_f64;
        assert_eq!(
            launch_bwd_ps_f(t, None, (C, 128), (8, 8), [(0u64, 4096u64, 2u32)]).to_bits(),
            t.to_bits()
        );
        // head_dim 64: steps at half the time, the fixed parts and the row work unchanged.
        let l = BwdLaunchBlocks::new(&m, C, 1, 1, 64, [(0u64, 64u64, 1u32)]);
        let parts = l.parts_ps(&m);
        assert!((parts[1] - (3.0 + 5.5) * 1e3).abs() < 1e-6, "{parts:?}");
        assert!((parts[2] - (5.0 + 4.5) * 1e3).abs() < 1e-6, "{parts:?}");
        assert!((parts[0] - 64.0 * 0.002 * 1e3).abs() < 1e-9, "{parts:?}");
    }

    #[test]
    fn bad_backward_fields_are_named() {
        let ok = bwd_model();
        assert!(ok.validate("cal.json").is_ok());
        let mut cases: Vec<(&str, BwdBlockModel)> = Vec::new();
        let mut m = ok;
        m.row_head_ns = -1.0;
        cases.push(("row_head_ns", m));
        let mut m = ok;
        m.dq.iter_ns = 0.0;
        cases.push(("dq.iter_ns", m));
        let mut m = ok;
        m.dkdv.row_share = 2.0;
        cases.push(("dkdv.row_share", m));
        let mut m = ok;
        m.dkdv.block_ns = f64::NAN;
        cases.push(("dkdv.block_ns", m));
        let mut m = ok;
        m.pair_slowdown = 0.9;
        cases.push(("pair_slowdown", m));
        let mut m = ok;
        m.block_n = 0;
        cases.push(("block_n", m));
        for (field, m) in cases {
            let e = m.validate("cal.json").unwrap_err().to_string();
            assert!(
                e.contains(&format!("cal.json: attn_bwd_blocks.{field}")),
                "{e}"
            );
        }
        // JSON: the geometry defaults to the H200 kernels'; unknown fields are refused.
        let j = r#"{"row_head_ns": 0.002, "pair_slowdown": 1.5,
            "dq": {"block_ns": 3.0, "iter_ns": 10.0, "row_share": 0.5, "diag_ns": 1.0},
            "dkdv": {"block_ns": 5.0, "iter_ns": 7.0, "row_share": 0.25, "diag_ns": 2.0}}"#;
        let back: BwdBlockModel = serde_json::from_str(j).unwrap();
        assert_eq!(back, ok);
        let bad = j.replace("\"dq\"", "\"dq_typo\"");
        assert!(serde_json::from_str::<BwdBlockModel>(&bad).is_err());
        let bad = j.replace("\"iter_ns\": 10.0", "\"iter_ns\": 10.0, \"wave\": 1");
        assert!(serde_json::from_str::<BwdBlockModel>(&bad).is_err());
    }

    #[test]
    fn grid_order_pads_every_segment_to_the_most_tiles() {
        let m = BlockModel {
            order: TileOrder::Grid,
            empty_ns: 0.5,
            ..BlockModel::h200(1.0, 1.0, 0.0, 0.0, 1.0)
        };
        // 64 queries (one tile) beside 300 (three): the first is padded with two empties,
        // in grid order (its tile, then the empties), then the second's tiles from its first.
        let b = launch_blocks(&m, C, [(0, 64, 1), (100, 400, 1)]);
        assert_eq!(b.len(), 6);
        assert_eq!(b[0], query_tile_shape(64, C, 0, 64, true));
        assert_eq!((b[1], b[2]), (EMPTY, EMPTY));
        assert_eq!(b[3], query_tile_shape(64, C, 100, 228, true));
        assert_eq!(b[5], query_tile_shape(64, C, 356, 400, true));
        assert_eq!(m.block_ps(EMPTY, 128), 500.0);
        // FlashAttention-2's backward: no dQ launch; key tiles padded to the longest prefix.
        let bwd = BwdBlockModel {
            order: TileOrder::Grid,
            dq_launch: false,
            block_m: 128,
            ..bwd_model()
        };
        assert!(bwd_dq_blocks(&bwd, C, [(0, 64, 1)]).is_empty());
        let k = bwd_dkdv_blocks(&bwd, C, [(0, 64, 1), (100, 400, 2)]);
        // ⌈400/128⌉ = 4 key tiles per segment: 1 + 3 empties, then 4 and 4.
        assert_eq!(k.len(), 12);
        assert_eq!(k[1..4], [EMPTY; 3]);
        assert!(k[4..].iter().all(|s| s.rows > 0));
        // The call's price: empties at their own time, nothing for dQ.
        let l = BwdLaunchBlocks::new(&bwd, C, 1, 1, 128, [(0, 64, 1)]);
        assert_eq!(l.parts_ps(&bwd)[1], 0.0);
    }

    /// Tiles under a sliding window by hand: the key loop starts at the block of the first
    /// row's lowest key; the window's edge and the diagonal are the masked steps; every step
    /// runs in the window mode and costs `window_ns` more. A window longer than every key
    /// range runs as the causal kernel.
    #[test]
    fn sliding_window_tiles_by_hand() {
        let w = Mask::Sliding { w: 100 };
        let m = BlockModel {
            window_ns: 5.0,
            ..steps_only(1.5)
        };
        // [300, 428): keys from 201 (block 3) to 427 (block 6): 4 steps; the diagonal
        // crosses blocks 4–6, the edge (lowest keys 201..=328) blocks 3–5.
        let b = m.shape(w, 300, 428);
        let want = BlockShape {
            n_iter: 4,
            n_diag: 4,
            rows: 128,
            n_local: 4,
        };
        assert_eq!(b, want);
        // Alone: 4 unit steps + 4 × 5 ns of window mode.
        assert_eq!(m.block_ps(b, 128), 24_000.0);
        // Rows near the sample's start see fewer keys: no edge inside [0, 64).
        assert_eq!(m.shape(w, 0, 64).n_diag, 1);
        // FlashAttention-2's grid: only the diagonal's steps (blocks 4–6) are masked ones.
        let fa2 = BlockModel {
            order: TileOrder::Grid,
            ..m
        };
        assert_eq!(fa2.shape(w, 300, 428), BlockShape { n_diag: 3, ..want });
        // A window past every key range: the causal kernel's blocks.
        let wide = Mask::Sliding { w: 5000 };
        assert_eq!(
            launch_blocks(&m, wide, [(0, 4096, 1)]),
            launch_blocks(&m, C, [(0, 4096, 1)])
        );
        assert_ne!(
            launch_blocks(&m, w, [(0, 4096, 1)]),
            launch_blocks(&m, C, [(0, 4096, 1)])
        );
        // dK/dV under a 64-key window, 64-key tiles and 64-row steps, queries [0, 256):
        // tile [0, 64) is seen by queries up to 126 (blocks 0–1: diagonal 0, edge 1); tile
        // [192, 256) by its own block only.
        let bwd = bwd_model();
        let k = bwd_dkdv_blocks(&bwd, Mask::Sliding { w: 64 }, [(0, 256, 1)]);
        let t = |n_iter, n_diag| BlockShape {
            n_iter,
            n_diag,
            rows: 64,
            n_local: 0,
        };
        assert_eq!(k, vec![t(2, 2), t(2, 2), t(2, 2), t(1, 1)]);
        // Queries [1000, 1064) of a sample under a 64-key window never see keys before
        // 937: tiles of [0, 896) are empty blocks.
        let k = bwd_dkdv_blocks(&bwd, Mask::Sliding { w: 64 }, [(1000, 1064, 1)]);
        assert_eq!(k.iter().filter(|b| **b == EMPTY).count(), 14);
        assert!(prices_mask(&w) && prices_mask(&C));
        assert!(!prices_mask(&Mask::Chunked { c: 64 }));
    }
}
