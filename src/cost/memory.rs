//! Per-GPU peak memory: a plan that does not fit is no plan.
//!
//! Counts, for one rank of a pipeline stage: weights (bf16), gradients (fp32 main grads),
//! Adam optimizer states (fp32 master copy + two moments = 12 B/param), each divided by
//! the ZeRO/FSDP sharding degree at the stages that shard them (1: optimizer, 2: + grads,
//! 3: + weights); activations kept for backward per token per layer (all of a layer's
//! saved tensors, or only the layer input with full recomputation plus one layer's worth
//! while it is recomputed) times the micro-batches in flight; the Q/K/V and output buffers
//! a rank receives for core attention (and their gradients); communication buffers (the
//! all-to-all send buffer and the gradient-reduction bucket).
//!
//! Saved tensors per token per layer (bf16 unless noted), following Korthikanti et al.,
//! "Reducing Activation Recomputation in Large Transformer Models" (2022), §4, with flash
//! attention (no s×s score matrix): the residual input and the normed input (2h), Q, K, V
//! ((h_q + 2h_kv)·d), the attention output (h_q·d) and its fp32 log-sum-exp (4·h_q bytes),
//! the second residual and normed input (2h), and the feed-forward's intermediate tensors
//! (gate, up and activation: 3·I; for MoE per routed copy h + 3·I_e, plus fp32 router
//! logits). The LM-head logits are assumed computed in chunks (fused cross-entropy) and
//! are not counted.

use serde::Serialize;

use super::{Ffn, ModelConfig};

/// What the memory of one rank depends on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MemoryInputs {
    /// Decoder layers on this rank's pipeline stage.
    pub layers: u32,
    /// The stage holds the input embedding.
    pub first_stage: bool,
    /// The stage holds the LM head.
    pub last_stage: bool,
    /// ZeRO stage 0..=3.
    pub zero_stage: u8,
    /// Ranks the sharded states are divided over (DP × CP for Ulysses).
    pub shard_degree: u32,
    /// Tokens of one micro-batch this rank holds activations for (L / CP).
    pub tokens_per_rank: u64,
    /// Tokens of the whole packed sequence the attention call sees (L for Ulysses).
    pub attn_tokens: u64,
    /// Query heads this rank computes attention for.
    pub attn_heads_q: u32,
    /// KV heads this rank holds for attention (replicated when CP exceeds h_kv).
    pub attn_heads_kv: u32,
    /// Micro-batches whose activations are alive at once (1F1B: stages after this one + 1).
    pub in_flight: u32,
    /// Full activation recomputation.
    pub recompute: bool,
    /// Gradient-reduction bucket in bytes (a full-size buffer only when ZeRO ≥ 2).
    pub bucket_bytes: u64,
}

/// One rank's peak memory, by kind, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MemoryBreakdown {
    /// Model weights.
    pub weights: u64,
    /// Gradients.
    pub grads: u64,
    /// Optimizer states.
    pub optimizer: u64,
    /// Activations saved for backward.
    pub activations: u64,
    /// Received Q/K/V, output and their gradients for core attention.
    pub attn_buffers: u64,
    /// All-to-all send buffer and gradient bucket.
    pub comm_buffers: u64,
}

impl MemoryBreakdown {
    /// The peak: everything above at once.
    pub fn total(&self) -> u64 {
        self.weights
            + self.grads
            + self.optimizer
            + self.activations
            + self.attn_buffers
            + self.comm_buffers
    }
}

/// Bytes saved for backward per token per layer without recomputation.
pub fn activation_bytes_per_token_layer(m: &ModelConfig) -> u64 {
    let dt = u64::from(m.dtype_bytes);
    let h = u64::from(m.hidden);
    let d = u64::from(m.head_dim);
    let attn = dt * (2 * h + u64::from(m.heads_q + 2 * m.heads_kv) * d + u64::from(m.heads_q) * d)
        + 4 * u64::from(m.heads_q);
    let ffn = match m.ffn {
        Ffn::Dense { intermediate } => dt * (2 * h + 3 * u64::from(intermediate)),
        Ffn::Moe {
            experts,
            top_k,
            expert_intermediate,
        } => {
            dt * (2 * h + u64::from(top_k) * (h + 3 * u64::from(expert_intermediate)))
                + 4 * u64::from(experts)
        }
    };
    attn + ffn
}

/// Gradient bytes per parameter (fp32 main gradients), held and reduced across DP.
pub const GRAD_BYTES_PER_PARAM: u64 = 4;

/// Parameters held by a pipeline stage of `layers` decoder layers: the input embedding on
/// the first stage, the LM head and final norm on the last (a tied head shares the
/// embedding only when both are on the same stage).
pub fn stage_params(m: &ModelConfig, layers: u32, first_stage: bool, last_stage: bool) -> u64 {
    let emb = u64::from(m.vocab) * u64::from(m.hidden);
    let mut params = u64::from(layers) * m.layer_params();
    if first_stage {
        params += emb;
    }
    if last_stage {
        params += u64::from(m.hidden);
        if !m.tie_embeddings || !first_stage {
            params += emb;
        }
    }
    params
}

/// Gradient bytes a stage reduces across data parallelism each step.
pub fn stage_grad_bytes(m: &ModelConfig, layers: u32, first_stage: bool, last_stage: bool) -> u64 {
    stage_params(m, layers, first_stage, last_stage) * GRAD_BYTES_PER_PARAM
}

/// One rank's peak memory.
pub fn rank_memory(m: &ModelConfig, x: &MemoryInputs) -> MemoryBreakdown {
    let dt = u64::from(m.dtype_bytes);
    let params = stage_params(m, x.layers, x.first_stage, x.last_stage);
    let shard = u64::from(x.shard_degree.max(1));
    let by = |stage: u8, bytes: u64| {
        if x.zero_stage >= stage {
            bytes.div_ceil(shard)
        } else {
            bytes
        }
    };
    let per_tok = activation_bytes_per_token_layer(m);
    let layers = u64::from(x.layers);
    let inflight = u64::from(x.in_flight.max(1));
    let activations = if x.recompute {
        inflight * x.tokens_per_rank * layers * dt * u64::from(m.hidden)
            + x.tokens_per_rank * per_tok
    } else {
        inflight * x.tokens_per_rank * layers * per_tok
    };
    let a = m.attn_shape();
    let qkv = a.q_bytes(x.attn_tokens, x.attn_heads_q) + a.kv_bytes(x.attn_tokens, x.attn_heads_kv);
    let out = a.q_bytes(x.attn_tokens, x.attn_heads_q);
    MemoryBreakdown {
        weights: by(3, dt * params),
        grads: by(2, GRAD_BYTES_PER_PARAM * params),
        optimizer: by(1, 12 * params),
        activations,
        // forward inputs and output, and in backward their gradients
        attn_buffers: 2 * (qkv + out),
        // The all-to-all send buffer; unsharded gradients are reduced in place, sharded
        // ones (ZeRO ≥ 2) need the bucket being reduced at full size; ZeRO-3 gathers one
        // layer's weights at a time.
        comm_buffers: qkv
            + if x.zero_stage >= 2 { x.bucket_bytes } else { 0 }
            + if x.zero_stage >= 3 {
                dt * m.layer_params()
            } else {
                0
            },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs() -> MemoryInputs {
        MemoryInputs {
            layers: 32,
            first_stage: true,
            last_stage: true,
            zero_stage: 0,
            shard_degree: 1,
            tokens_per_rank: 1000,
            attn_tokens: 1000,
            attn_heads_q: 32,
            attn_heads_kv: 8,
            in_flight: 1,
            recompute: false,
            bucket_bytes: 0,
        }
    }

    #[test]
    fn states_by_hand_and_by_zero_stage() {
        let m = ModelConfig::builtin("llama3-8b").unwrap();
        let p = m.total_params();
        let b = rank_memory(&m, &inputs());
        assert_eq!(b.weights, 2 * p);
        assert_eq!(b.grads, 4 * p);
        assert_eq!(b.optimizer, 12 * p);
        let z = rank_memory(
            &m,
            &MemoryInputs {
                zero_stage: 1,
                shard_degree: 8,
                ..inputs()
            },
        );
        assert_eq!(z.optimizer, (12 * p).div_ceil(8));
        assert_eq!(z.grads, 4 * p);
        let z3 = rank_memory(
            &m,
            &MemoryInputs {
                zero_stage: 3,
                shard_degree: 8,
                ..inputs()
            },
        );
        assert_eq!(z3.weights, (2 * p).div_ceil(8));
    }

    #[test]
    fn stages_hold_every_parameter_once() {
        for name in ["qwen3-30b-a3b", "llama3-8b", "llama-34b"] {
            let m = ModelConfig::builtin(name).unwrap();
            let split = [
                (0, true, false),
                (m.layers / 2, false, false),
                (m.layers - m.layers / 2, false, true),
            ];
            let sum: u64 = split
                .iter()
                .map(|&(l, f, last)| stage_params(&m, l, f, last))
                .sum();
            assert_eq!(sum, m.total_params(), "{name}");
            assert_eq!(stage_params(&m, m.layers, true, true), m.total_params());
            assert_eq!(
                stage_grad_bytes(&m, m.layers, true, true),
                4 * m.total_params()
            );
        }
    }

    #[test]
    fn activations_by_hand_and_recompute_saves() {
        let m = ModelConfig::builtin("llama3-8b").unwrap();
        // 2·(2·4096 + 48·128 + 32·128) + 4·32 + 2·(2·4096 + 3·14336)
        let per = 2 * (8192 + 6144 + 4096) + 128 + 2 * (8192 + 43008);
        assert_eq!(activation_bytes_per_token_layer(&m), per);
        let b = rank_memory(&m, &inputs());
        assert_eq!(b.activations, 1000 * 32 * per);
        let r = rank_memory(
            &m,
            &MemoryInputs {
                recompute: true,
                ..inputs()
            },
        );
        assert_eq!(r.activations, 1000 * 32 * 2 * 4096 + 1000 * per);
        assert!(r.activations < b.activations / 5);
        // Q (32 heads) + K,V (8 heads) + O for 1000 tokens, fwd and bwd.
        let qkv = 1000 * 32 * 128 * 2 + 2 * 1000 * 8 * 128 * 2;
        assert_eq!(b.attn_buffers, 2 * (qkv + 1000 * 32 * 128 * 2));
    }
}
