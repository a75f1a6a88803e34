//! What the WLB-LLM and DistCA knobs cost in memory and communication, priced by `cost/`.
//!
//! Owns three pure functions over the schemes' outputs, no formula of its own: bytes come
//! from the schedules (which price through [`crate::cost::AttnShape`]), memory from
//! [`crate::cost::memory::rank_memory`], latency from [`CostModel`].
//!
//! - [`CostLatency`]: WLB-LLM's W_a + W_l (paper: workload-aware packing) from `cost/`
//!   rather than constant throughputs — W_a at the attention kernel's measured efficiency,
//!   W_l the linear blocks' GEMM time.
//! - [`wlb_s_max_memory`] / [`wlb_max_s_max`]: a WLB-LLM micro-batch may hold up to S_max
//!   tokens, so a rank must budget activations for S_max / CP tokens and the attention
//!   buffers of per-document sharding (its S_max / CP queries over all heads and the KV of
//!   all S_max tokens, all-gathered) — the memory side of the S_max trade-off (a larger
//!   cap packs better).
//! - [`distca_tolerance`]: DistCA's ε trade-off (paper: tolerance 0.10–0.15 trims 20–25% of
//!   memory and communication): per ε, the bytes the scheduler moves, the largest per-server
//!   buffer of received Q/K/V plus outputs computed for others (doubled for backward, as
//!   `memory.rs` counts attention buffers), and the imbalance left.
//!
//! May not touch the schedulers or `cost/`; no I/O.

use serde::Serialize;

use super::distca::{schedule_step, DistcaConfig};
use super::wlbllm::LatencyModel;
use crate::cost::memory::{rank_memory, MemoryBreakdown, MemoryInputs};
use crate::cost::{attn_segment_ps_f, CostModel, LinearPart, Mask};
use crate::error::{invalid, Result};
use crate::workload::PackedSeq;

/// WLB-LLM's latency estimates from the cost model: one layer, all heads on one GPU.
#[derive(Clone, Copy, Debug)]
pub struct CostLatency<'a> {
    /// The cost model.
    pub cost: &'a CostModel,
}

impl LatencyModel for CostLatency<'_> {
    /// Attention of `pairs` causal pairs at the kernel efficiency of the document length
    /// with that many pairs (ℓ(ℓ+1)/2 = pairs; exact for one whole document).
    fn attention_s(&self, pairs: u64) -> f64 {
        if pairs == 0 {
            return 0.0;
        }
        let a = self.cost.attn();
        let len = (((8.0 * pairs as f64 + 1.0).sqrt() - 1.0) / 2.0).max(1.0) as u64;
        let eff = self.cost.attn_eff.tflops(a.heads_q, len, len);
        a.fwd_flops(pairs, a.heads_q) / eff * 1e-12
    }

    fn linear_s(&self, tokens: u64) -> f64 {
        (self.cost.linear_fwd_ps_f(LinearPart::PreAttn, tokens)
            + self.cost.linear_fwd_ps_f(LinearPart::PostAttn, tokens))
            * 1e-12
    }

    fn mask(&self) -> Mask {
        self.cost.attn().mask
    }

    /// A whole document through the one attention-time formula: its pairs under the mask
    /// at the table's rate for its length and the keys its queries reach (the causal
    /// inversion of [`LatencyModel::attention_s`] would look a windowed document up as a
    /// shorter causal one). Causal: the same time as `attention_s` of its pairs.
    fn document_attention_s(&self, len: u32) -> f64 {
        let a = self.cost.attn();
        attn_segment_ps_f(&self.cost.attn_eff, &a, a.heads_q, 0, u64::from(len)) * 1e-12
    }
}

/// Peak memory of a WLB-LLM rank whose micro-batches hold up to `s_max` tokens over `cp`
/// CP ranks; `base` gives everything else (layers, ZeRO, in flight, recompute, bucket).
pub fn wlb_s_max_memory(
    cost: &CostModel,
    base: &MemoryInputs,
    s_max: u32,
    cp: u32,
) -> Result<MemoryBreakdown> {
    let m = &cost.model;
    if cp == 0 {
        return Err(invalid("cp", cp, "a positive CP degree"));
    }
    let tokens = u64::from(s_max).div_ceil(u64::from(cp));
    Ok(rank_memory(
        m,
        &MemoryInputs {
            tokens_per_rank: tokens,
            // Q of S_max / CP tokens over all heads = S_max tokens over h_q / CP heads
            // (rounded up where CP does not divide them); K and V of all S_max tokens
            // (all-gathered) over all KV heads.
            attn_tokens: u64::from(s_max),
            attn_heads_q: m.heads_q.div_ceil(cp),
            attn_heads_kv: m.heads_kv,
            ..*base
        },
    ))
}

/// The largest S_max, a multiple of `2·cp·tile` (the CP chunking, padded to the kernel
/// tile), whose [`wlb_s_max_memory`] fits `cost.hw.memory_bytes`; None when not even one
/// chunking unit fits.
pub fn wlb_max_s_max(
    cost: &CostModel,
    base: &MemoryInputs,
    cp: u32,
    tile: u32,
) -> Result<Option<u32>> {
    let unit = 2 * u64::from(cp) * u64::from(tile.max(1));
    let fits = |k: u64| -> Result<bool> {
        let s = u32::try_from(k * unit).unwrap_or(u32::MAX);
        Ok(wlb_s_max_memory(cost, base, s, cp)?.total() <= cost.hw.memory_bytes)
    };
    if !fits(1)? {
        return Ok(None);
    }
    // memory grows with S_max: binary search the largest fitting multiple
    let (mut lo, mut hi) = (1u64, u64::from(u32::MAX) / unit);
    if fits(hi)? {
        return Ok(Some((hi * unit) as u32));
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid)? {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(Some((lo * unit) as u32))
}

/// DistCA at one tolerance, summed over the micro-batches given.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ToleranceRow {
    /// ε.
    pub epsilon: f64,
    /// Bytes moved (Q + KV + output), all micro-batches.
    pub bytes: u64,
    /// Largest per-server attention buffer over the micro-batches: 2 × (received Q, K, V
    /// + outputs computed for others), bytes.
    pub max_buffer_bytes: u64,
    /// Largest max_s |F_s − F̄| / F̄ over the micro-batches.
    pub max_deviation: f64,
    /// Moved tasks, all micro-batches.
    pub moves: usize,
}

/// DistCA's scheduler at each ε of `epsilons` over `batches` (each one GA index's DP
/// micro-batches, one per replica, laid out over `cp` ranks: DP·CP servers). Bytes are
/// every byte the schedule moves (moved tasks and the KV that tasks left in place read
/// from earlier CP ranks); a server's buffer is what it receives (Q, K, V of moved tasks,
/// K and V for its in-place tasks) plus the outputs it computes for others. Errors: an ε
/// the scheduler rejects, CP of 0.
pub fn distca_tolerance(
    batches: &[Vec<PackedSeq>],
    cp: u32,
    cfg: &DistcaConfig,
    epsilons: &[f64],
) -> Result<Vec<ToleranceRow>> {
    epsilons
        .iter()
        .map(|&eps| {
            let c = DistcaConfig::new(cfg.shape, eps, cfg.tile)?.with_scheduler(cfg.scheduler);
            let mut row = ToleranceRow {
                epsilon: eps,
                bytes: 0,
                max_buffer_bytes: 0,
                max_deviation: 0.0,
                moves: 0,
            };
            for b in batches {
                let s = schedule_step(b, cp, &c)?;
                let mut buf = vec![0u64; s.servers.len()];
                for t in &s.transfers {
                    if let Some(x) = buf.get_mut(t.dst as usize) {
                        *x += t.q_bytes + t.kv_bytes + t.out_bytes;
                    }
                }
                for (i, (x, w)) in buf.iter_mut().zip(&s.servers).enumerate() {
                    *x += w
                        .tasks
                        .iter()
                        .filter(|t| t.home as usize == i)
                        .map(|t| t.kv_bytes)
                        .sum::<u64>();
                }
                row.bytes += s.bytes();
                row.moves += s.transfers.len();
                row.max_buffer_bytes = row
                    .max_buffer_bytes
                    .max(2 * buf.iter().copied().max().unwrap_or(0));
                row.max_deviation = row.max_deviation.max(s.max_deviation());
            }
            Ok(row)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::{AttnShape, ModelConfig};
    use crate::workload::corpus::Corpus;
    use crate::workload::pack::{global_batch, Packing};
    use crate::workload::{causal_pairs, Sample};

    fn base() -> MemoryInputs {
        MemoryInputs {
            layers: 32,
            first_stage: true,
            last_stage: true,
            zero_stage: 3,
            shard_degree: 64,
            tokens_per_rank: 0,
            attn_tokens: 0,
            attn_heads_q: 0,
            attn_heads_kv: 0,
            held_layers: 32,
            recompute: crate::cost::memory::Recompute::Full,
            grad_fp32: true,
            bucket_bytes: 0,
            seq_shard: 1,
            expert_shard: 1,
            fp8: false,
        }
    }

    #[test]
    fn s_max_memory_by_hand_and_monotone() {
        let cost = CostModel::h200(ModelConfig::builtin("llama3-8b").unwrap()).unwrap();
        let a = wlb_s_max_memory(&cost, &base(), 65_536, 4).unwrap();
        let b = wlb_s_max_memory(&cost, &base(), 131_072, 4).unwrap();
        // attention buffers: 2 × (Q + out of 16384 tokens × 32 heads + KV of 65536 × 8 heads)
        let q = 16_384u64 * 32 * 128 * 2;
        let kv = 2 * 65_536u64 * 8 * 128 * 2;
        assert_eq!(a.attn_buffers, 2 * (q + kv + q));
        assert_eq!(b.attn_buffers, 2 * a.attn_buffers);
        assert!(b.activations > a.activations && b.weights == a.weights);
        let best = wlb_max_s_max(&cost, &base(), 4, 128).unwrap().unwrap();
        assert_eq!(best % 1024, 0);
        let at = |s| wlb_s_max_memory(&cost, &base(), s, 4).unwrap().total();
        assert!(at(best) <= cost.hw.memory_bytes && at(best + 1024) > cost.hw.memory_bytes);
        assert!(wlb_s_max_memory(&cost, &base(), 1024, 0).is_err());
        // CP 3 does not divide 32 heads: Q of 1024 tokens over ⌈32/3⌉ = 11 heads.
        let c3 = wlb_s_max_memory(&cost, &base(), 1024, 3).unwrap();
        let (q3, kv3) = (1024u64 * 11 * 128 * 2, 2 * 1024u64 * 8 * 128 * 2);
        assert_eq!(c3.attn_buffers, 2 * (q3 + kv3 + q3));
    }

    #[test]
    fn cost_latency_is_the_cost_models_attention_for_one_document() {
        let cost = CostModel::h200(ModelConfig::builtin("llama3-8b").unwrap()).unwrap();
        let m = CostLatency { cost: &cost };
        for len in [4096u32, 65_536] {
            let want = cost.attn_fwd_ps_f([len], 32) * 1e-12;
            let got = m.attention_s(causal_pairs(u64::from(len)));
            assert!((got - want).abs() <= 1e-9 * want, "{len}: {got} vs {want}");
        }
        assert_eq!(m.attention_s(0), 0.0);
        assert!(m.linear_s(2000) > 1.9 * m.linear_s(1000));
        // A whole document: causal, bit for bit the time of its pairs; under a window, the
        // cost model's time of the windowed document (rate at its keys reached), not that
        // of a causal document with as many pairs.
        for len in [1u32, 4096, 65_536] {
            let pairs = causal_pairs(u64::from(len));
            assert_eq!(m.document_attention_s(len), m.attention_s(pairs));
        }
        let mut model = ModelConfig::builtin("llama3-8b").unwrap();
        model.attention = crate::cost::AttentionPattern::new(vec![Mask::Sliding { w: 4096 }]);
        let cost = CostModel::h200(model).unwrap();
        let m = CostLatency { cost: &cost };
        let want = cost.attn_fwd_ps_f([65_536], 32) * 1e-12;
        let got = m.document_attention_s(65_536);
        assert!((got - want).abs() <= 1e-9 * want, "{got} vs {want}");
        // By hand: the table's rate at the document's own length, so the windowed
        // document takes its share of pairs of the causal one's time; a causal document
        // with as many pairs is shorter, priced at another rate.
        let windowed_pairs = Mask::Sliding { w: 4096 }.pairs(65_536);
        let causal_cost = CostModel::h200(ModelConfig::builtin("llama3-8b").unwrap()).unwrap();
        let causal_s = CostLatency { cost: &causal_cost }.document_attention_s(65_536);
        let share = windowed_pairs as f64 / causal_pairs(65_536) as f64;
        assert!(
            (got - causal_s * share).abs() <= 1e-9 * got,
            "{got} vs {causal_s} · {share}"
        );
        assert_ne!(got, m.attention_s(windowed_pairs));
    }

    #[test]
    fn looser_tolerance_moves_less() {
        let corpus = Corpus::from_spec("wlbllm").unwrap();
        let shape = AttnShape {
            heads_q: 32,
            heads_kv: 8,
            head_dim: 128,
            dtype_bytes: 2,
            mask: crate::cost::Mask::Causal,
        };
        let gb = global_batch(&corpus, 65_536, 32, Packing::Sequential, 3, 0).unwrap();
        let batches: Vec<Vec<PackedSeq>> = gb.chunks(16).map(<[PackedSeq]>::to_vec).collect();
        let cfg = DistcaConfig::new(shape, 0.1, 128).unwrap();
        let rows = distca_tolerance(&batches, 1, &cfg, &[0.0, 0.1, 0.3]).unwrap();
        assert!(rows[0].bytes >= rows[1].bytes && rows[1].bytes >= rows[2].bytes);
        assert!(rows[1].max_deviation <= 0.1 + 1e-9 || rows[1].moves > 0);
        assert!(distca_tolerance(&batches, 1, &cfg, &[-1.0]).is_err());
        // hand case: one move of 12 B lands on server 1 → buffer 2 × 12.
        let s = |lens: &[u32], slack: u32| PackedSeq {
            samples: lens
                .iter()
                .map(|&len| Sample {
                    doc: 0,
                    offset: 0,
                    len,
                    cut: false,
                })
                .collect(),
            capacity: lens.iter().sum::<u32>() + slack,
        };
        let unit = AttnShape {
            heads_q: 1,
            heads_kv: 1,
            head_dim: 1,
            dtype_bytes: 1,
            mask: crate::cost::Mask::Causal,
        };
        let c = DistcaConfig::new(unit, 0.15, 1)
            .unwrap()
            .with_scheduler(crate::balance::distca::DistcaScheduler::Tight);
        let r = distca_tolerance(&[vec![s(&[4, 2], 0), s(&[1], 3)]], 1, &c, &[0.15]).unwrap();
        assert_eq!((r[0].bytes, r[0].max_buffer_bytes, r[0].moves), (12, 24, 1));
    }
}
