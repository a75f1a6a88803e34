//! Wave quantization of one forward attention launch: the launch-level term of the one
//! attention-time formula (issue 7, run 16's diagnosis).
//!
//! Owns the [`WaveModel`] (a calibration's `attn_waves`) and the launch bound it adds to
//! the per-segment table price: the launch's thread blocks enumerated as the forward
//! kernel tiles them (`validate/kernels/attn_fwd_v3.cu`: one block per (query tile of
//! `block_m` rows of one unit, query head); tiles heaviest — most keys — first, the grid's
//! x = tile fastest, y = head), each block's work its exact causal FLOPs (its rows over
//! their KV prefix), run in launch order on `sms` SMs of `sm_tflops` each, up to
//! `blocks_per_sm` resident at once sharing their SM's rate (v3-w4: 96 KiB of shared
//! memory and 128 threads per block, so two blocks share an SM), each freed slot taking the
//! next block ([`makespan_pairs`]).
//! The launch then takes
//!
//!   time = max(Σ segments at the efficiency table's rate, the blocks' makespan)
//!
//! (+ the call overhead, priced by the caller): a launch of many blocks is
//! throughput-bound (the table), one of few long blocks is bound by its last wave, which
//! a per-segment table cannot see (run 16: the same units at q = 3,072 ran at 228–321
//! TFLOP/s depending on the number of units per launch).
//!
//! It may not price anything else; without a wave model ([`launch_fwd_ps_f`] with `None`)
//! the table's sum comes back unchanged, bit for bit. Both the plan lowering
//! (`schedule::plan_attn`), whole-document calls ([`super::CostModel::attn_fwd_ps_f`]) and
//! measured launches (`cost::fit`) price a launch through [`launch_fwd_ps_f`] (the fit
//! through its two halves, [`launch_makespan_pairs`] computed once per launch and
//! [`WaveModel::bound_ps_f`] per candidate rate).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use serde::{Deserialize, Serialize};

use super::AttnShape;
use crate::error::{invalid, Result};

/// Streaming multiprocessors of an H200 SXM.
pub const H200_SMS: u32 = 132;
/// Query rows per block of the forward kernel v3-w4 (16 rows × 2 MMA tiles × 4 warps).
pub const FWD_BLOCK_M: u32 = 128;
/// Resident blocks per SM of v3-w4: 96 KiB shared memory each (Q tile 32 KiB, double-buffered
/// K and V tiles 64 KiB) of the H200's 228 KiB, 128 threads.
pub const FWD_BLOCKS_PER_SM: u32 = 2;

fn default_sms() -> u32 {
    H200_SMS
}

fn default_block_m() -> u32 {
    FWD_BLOCK_M
}

fn default_blocks_per_sm() -> u32 {
    FWD_BLOCKS_PER_SM
}

/// The launch-level wave term of the forward attention time (a calibration's
/// `attn_waves`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaveModel {
    /// Forward TFLOP/s of one SM, shared by its resident blocks (fitted by `skewsim
    /// calibrate`).
    pub sm_tflops: f64,
    /// SMs the blocks are scheduled onto.
    #[serde(default = "default_sms")]
    pub sms: u32,
    /// Blocks resident on one SM at a time.
    #[serde(default = "default_blocks_per_sm")]
    pub blocks_per_sm: u32,
    /// Query rows per thread block.
    #[serde(default = "default_block_m")]
    pub block_m: u32,
}

impl WaveModel {
    /// A wave model of the H200 forward kernel v3-w4 (132 SMs × 2 resident blocks, 128-row
    /// tiles) at `sm_tflops`.
    pub fn h200(sm_tflops: f64) -> Self {
        Self {
            sm_tflops,
            sms: H200_SMS,
            blocks_per_sm: FWD_BLOCKS_PER_SM,
            block_m: FWD_BLOCK_M,
        }
    }

    /// Check the fields; `ctx` names the file.
    pub fn validate(&self, ctx: &str) -> Result<()> {
        if !(self.sm_tflops.is_finite() && self.sm_tflops > 0.0) {
            return Err(invalid(
                format!("{ctx}: attn_waves.sm_tflops"),
                self.sm_tflops,
                "a finite rate > 0 TFLOP/s",
            ));
        }
        if self.sms == 0 {
            return Err(invalid(format!("{ctx}: attn_waves.sms"), 0, "at least 1"));
        }
        if self.blocks_per_sm == 0 {
            return Err(invalid(
                format!("{ctx}: attn_waves.blocks_per_sm"),
                0,
                "at least 1",
            ));
        }
        if self.block_m == 0 {
            return Err(invalid(
                format!("{ctx}: attn_waves.block_m"),
                0,
                "at least 1 query row",
            ));
        }
        Ok(())
    }

    /// The launch's time in ps given its table price `table_ps` and its makespan in causal
    /// pairs at one SM's rate (`makespan_pairs`, from [`launch_makespan_pairs`]):
    /// max(table, makespan × FLOPs per pair / `sm_tflops`).
    pub fn bound_ps_f(&self, table_ps: f64, shape: &AttnShape, makespan_pairs: f64) -> f64 {
        // ps = FLOPs / TFLOP/s.
        let wave = makespan_pairs * shape.fwd_flops_per_pair_head() / self.sm_tflops;
        table_ps.max(wave)
    }
}

/// Per-head blocks of a launch in launch order: for every segment (queries [start, end)
/// of one sample, keys [0, end); `n` such segments) its tiles of `block_m` rows, as
/// (keys, causal pairs), heaviest (most keys) first, ties by more pairs.
pub fn launch_blocks(
    segs: impl IntoIterator<Item = (u64, u64, u32)>,
    block_m: u32,
) -> Vec<(u64, u64)> {
    let bm = u64::from(block_m.max(1));
    let mut blocks = Vec::new();
    for (start, end, n) in segs {
        let mut p0 = start;
        while p0 < end {
            let p1 = (p0 + bm).min(end);
            let b = (p1, crate::plan::segment_pairs(p0, p1));
            blocks.extend(std::iter::repeat_n(b, n as usize));
            p0 = p1;
        }
    }
    blocks.sort_unstable_by(|x, y| y.cmp(x));
    blocks
}

/// Makespan, in causal pairs at one SM's rate, of `heads` copies of `blocks` (head-major,
/// as the grid launches them) run in launch order on `sms` SMs holding up to `per_sm`
/// blocks each, the blocks resident on one SM sharing its rate equally (processor
/// sharing: a block alone runs at the full rate, two at half each). Blocks fill the first
/// slot of every SM, then the second, …; afterwards each freed slot takes the next block.
/// Ties: the lowest SM first. Every time scales with 1 / rate, so this is computed once
/// per launch and divided by the rate.
pub fn makespan_pairs(blocks: &[(u64, u64)], heads: u32, sms: u32, per_sm: u32) -> f64 {
    let total = blocks.len() * heads as usize;
    if total == 0 || sms == 0 {
        return 0.0;
    }
    if total <= sms as usize {
        return blocks.iter().map(|b| b.1).max().unwrap_or(0) as f64;
    }
    let per_sm = per_sm.max(1) as usize;
    let mut next = (0..heads).flat_map(|_| blocks.iter().map(|b| b.1 as f64));
    // Per SM: remaining work of its resident blocks, time of its last update, version.
    let mut rem: Vec<Vec<f64>> = vec![Vec::with_capacity(per_sm); sms as usize];
    let mut last = vec![0.0f64; sms as usize];
    let mut ver = vec![0u64; sms as usize];
    for _ in 0..per_sm {
        for r in rem.iter_mut() {
            if let Some(w) = next.next() {
                r.push(w);
            }
        }
    }
    // Events (completion time bits — times are ≥ 0, so the bits order as the times —, SM,
    // version); a stale version is skipped.
    let mut heap: BinaryHeap<Reverse<(u64, u32, u64)>> = BinaryHeap::new();
    let finish = |r: &[f64], t0: f64| {
        let k = r.len() as f64;
        t0 + r.iter().copied().fold(f64::INFINITY, f64::min) * k
    };
    for (s, r) in rem.iter().enumerate() {
        if !r.is_empty() {
            heap.push(Reverse((finish(r, 0.0).to_bits(), s as u32, 0)));
        }
    }
    let mut end = 0.0f64;
    while let Some(Reverse((tb, s, v))) = heap.pop() {
        let s = s as usize;
        if v != ver[s] {
            continue;
        }
        let t = f64::from_bits(tb);
        let r = &mut rem[s];
        let k = r.len() as f64;
        let done = (t - last[s]) / k;
        let min = r.iter().copied().fold(f64::INFINITY, f64::min);
        // The block(s) that end now leave; the others advance by the same work.
        let tol = min * 1e-12;
        r.retain(|&w| w - min > tol);
        for w in r.iter_mut() {
            *w -= done;
        }
        while r.len() < per_sm {
            match next.next() {
                Some(w) => r.push(w),
                None => break,
            }
        }
        last[s] = t;
        ver[s] += 1;
        end = end.max(t);
        if !r.is_empty() {
            heap.push(Reverse((finish(r, t).to_bits(), s as u32, ver[s])));
        }
    }
    end
}

/// The makespan ([`makespan_pairs`]) of a launch of `segs` at `heads` per call.
pub fn launch_makespan_pairs(
    w: &WaveModel,
    heads: u32,
    segs: impl IntoIterator<Item = (u64, u64, u32)>,
) -> f64 {
    makespan_pairs(
        &launch_blocks(segs, w.block_m),
        heads,
        w.sms,
        w.blocks_per_sm,
    )
}

/// The forward time in ps of one launch whose segments the table prices at `table_ps`:
/// `table_ps` itself without a wave model, else [`WaveModel::bound_ps_f`] of the launch's
/// list-schedule makespan. The call overhead is the caller's.
pub fn launch_fwd_ps_f(
    table_ps: f64,
    waves: Option<&WaveModel>,
    shape: &AttnShape,
    heads: u32,
    segs: impl IntoIterator<Item = (u64, u64, u32)>,
) -> f64 {
    match waves {
        None => table_ps,
        Some(w) => w.bound_ps_f(table_ps, shape, launch_makespan_pairs(w, heads, segs)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> AttnShape {
        AttnShape {
            heads_q: 8,
            heads_kv: 1,
            head_dim: 128,
            dtype_bytes: 2,
        }
    }

    #[test]
    fn blocks_are_the_kernels_tiles_heaviest_first() {
        // Queries [100, 400) of one sample: tiles [100,228), [228,356), [356,400).
        let b = launch_blocks([(100, 400, 1), (0, 64, 2)], 128);
        let pairs = |a: u64, e: u64| (e * (e + 1) - a * (a + 1)) / 2;
        assert_eq!(
            b,
            vec![
                (400, pairs(356, 400)),
                (356, pairs(228, 356)),
                (228, pairs(100, 228)),
                (64, pairs(0, 64)),
                (64, pairs(0, 64)),
            ]
        );
        // The blocks' pairs add up to the segments' pairs.
        let tot: u64 = b.iter().map(|x| x.1).sum();
        assert_eq!(tot, pairs(100, 400) + 2 * pairs(0, 64));
    }

    #[test]
    fn two_long_blocks_are_latency_bound_and_2x132_equal_blocks_throughput_bound() {
        let a = shape();
        let w = WaveModel::h200(2.0);
        // Two 128-row tiles at the end of a 32K-token sample, 1 head: each alone on its
        // SM, the makespan is the longer block at the full SM rate.
        let segs = [(32768 - 256, 32768, 1u32)];
        let blocks = launch_blocks(segs, 128);
        assert_eq!(blocks.len(), 2);
        let longest = (32768 * 32769 - 32640 * 32641) / 2;
        assert_eq!(makespan_pairs(&blocks, 1, 132, 2), longest as f64);
        let wave_ps = longest as f64 * 512.0 / 2.0;
        // A table price far below the wave bound (the per-segment sum at 300 TFLOP/s).
        let table = (longest + blocks[1].1) as f64 * 512.0 / 300.0;
        let t = launch_fwd_ps_f(table, Some(&w), &a, 1, segs);
        assert_eq!(t, wave_ps);
        assert!(t > table);
        // 2 × 132 equal blocks: two per SM sharing it, all done at 2 blocks' work: the
        // whole launch at 132 × the SM rate.
        let one = f64::from(128 * 129 / 2);
        let docs = [(0u64, 128u64, 264u32)];
        assert_eq!(
            makespan_pairs(&launch_blocks(docs, 128), 1, 132, 2),
            2.0 * one
        );
        // Throughput-bound: the table at 200 TFLOP/s is slower than 132 SMs at 2 TFLOP/s
        // (264 TFLOP/s in all), so the table's price stands.
        let table = 264.0 * one * 512.0 / 200.0;
        assert!(table > 2.0 * one * 512.0 / 2.0);
        assert_eq!(launch_fwd_ps_f(table, Some(&w), &a, 1, docs), table);
        // One block more: SM 0 takes it once its two are done, a third block's time alone.
        let docs2 = [(0u64, 128u64, 265u32)];
        assert_eq!(
            makespan_pairs(&launch_blocks(docs2, 128), 1, 132, 2),
            3.0 * one
        );
        let table2 = 265.0 * one * 512.0 / 200.0;
        assert_eq!(
            launch_fwd_ps_f(table2, Some(&w), &a, 1, docs2),
            3.0 * one * 512.0 / 2.0
        );
        // The same work as 132 docs × 2 heads, head-major: the same two shared blocks.
        let half = [(0u64, 128u64, 132u32)];
        assert_eq!(
            makespan_pairs(&launch_blocks(half, 128), 2, 132, 2),
            2.0 * one
        );
    }

    #[test]
    fn resident_blocks_share_their_sm() {
        // One SM, blocks of 4 and 2 (two resident): both at half rate until the 2 ends at
        // t = 4, then the 4's remaining 2 alone: 6 — the SM's work, as it is never idle.
        assert_eq!(makespan_pairs(&[(2, 4), (1, 2)], 1, 1, 2), 6.0);
        // Two SMs, blocks 4, 1, 1: SM0 takes 4, SM1 1, then SM0's second slot the last 1.
        // SM0 shares until t = 2 (the 1 ends, the 4 has 3 left), then alone: 5; SM1 ends
        // at 1. One block per SM (a plain list schedule) would end at 4.
        let b = [(3, 4), (2, 1), (1, 1)];
        assert_eq!(makespan_pairs(&b, 1, 2, 2), 5.0);
        assert_eq!(makespan_pairs(&b, 1, 2, 1), 4.0);
        // One per SM: loads 10, 6, 5, 4, 3 in order on 2 SMs: SM0 10; SM1 6; SM1 11;
        // SM0 14; SM1 14.
        let blocks = [(5, 10), (4, 6), (3, 5), (2, 4), (1, 3)];
        assert_eq!(makespan_pairs(&blocks, 1, 2, 1), 14.0);
        assert_eq!(makespan_pairs(&blocks, 0, 2, 2), 0.0);
        assert_eq!(makespan_pairs(&[], 4, 2, 2), 0.0);
    }

    #[test]
    fn no_wave_model_returns_the_table_price_bit_for_bit() {
        let t = 123_456.789_f64;
        assert_eq!(
            launch_fwd_ps_f(t, None, &shape(), 8, [(0, 4096, 3)]).to_bits(),
            t.to_bits()
        );
    }

    #[test]
    fn bad_fields_are_named() {
        let mut w = WaveModel::h200(0.0);
        assert!(w
            .validate("cal.json")
            .unwrap_err()
            .to_string()
            .contains("cal.json: attn_waves.sm_tflops"));
        w.sm_tflops = 2.0;
        w.sms = 0;
        assert!(w
            .validate("cal.json")
            .unwrap_err()
            .to_string()
            .contains("attn_waves.sms"));
        let j: WaveModel = serde_json::from_str(r#"{"sm_tflops": 2.5}"#).unwrap();
        assert_eq!(j, WaveModel::h200(2.5));
    }
}
