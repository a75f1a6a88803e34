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
//!
//! Under tensor parallelism `m` is the rank's shard ([`ModelConfig::tp_shard`]: heads,
//! MLP and vocabulary / TP), and sequence parallelism divides the hidden-sized saved
//! tensors (residuals, norm inputs, a routed copy's hidden state) by TP as well
//! (`seq_shard`; Korthikanti et al. §4.2.2). Under expert parallelism a rank holds
//! experts / EP of each MoE layer's experts (`expert_shard`).

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{Ffn, ModelConfig};

/// Activation recomputation, as Megatron-Core's `--recompute-granularity`: `none` keeps every
/// saved tensor; `selective` recomputes the core attention in backward (Megatron-Core's
/// default `--recompute-modules core_attn`: its output and log-sum-exp are not kept); `full`
/// keeps only each layer's input and recomputes the whole layer. In files: `false`,
/// `"selective"` or `true` (also `"none"` and `"full"`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Recompute {
    /// Every saved tensor kept.
    #[default]
    None,
    /// Core attention recomputed.
    Selective,
    /// Whole layers recomputed from their input.
    Full,
}

impl Recompute {
    /// The whole layer's forward runs again in backward.
    pub fn full(self) -> bool {
        self == Recompute::Full
    }

    /// Core attention's forward runs again in backward (full or selective).
    pub fn attention(self) -> bool {
        self != Recompute::None
    }
}

impl From<bool> for Recompute {
    fn from(full: bool) -> Self {
        if full {
            Recompute::Full
        } else {
            Recompute::None
        }
    }
}

impl Serialize for Recompute {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            Recompute::None => s.serialize_bool(false),
            Recompute::Full => s.serialize_bool(true),
            Recompute::Selective => s.serialize_str("selective"),
        }
    }
}

impl<'de> Deserialize<'de> for Recompute {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Flag(bool),
            Name(String),
        }
        match Raw::deserialize(d)? {
            Raw::Flag(b) => Ok(b.into()),
            Raw::Name(n) => match n.as_str() {
                "none" => Ok(Recompute::None),
                "selective" => Ok(Recompute::Selective),
                "full" => Ok(Recompute::Full),
                _ => Err(serde::de::Error::custom(format!(
                    "recompute = {n:?}: allowed are false, true, \"none\", \"selective\" or \"full\""
                ))),
            },
        }
    }
}

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
    /// Decoder layers' activations alive at once, summed over the micro-batches in flight
    /// (1F1B: the stage's layers × (stages after this one + 1); interleaved: the layers of
    /// each model chunk's micro-batches in flight, `schedule::pipeline::held_layers`).
    pub held_layers: u64,
    /// Activation recomputation.
    pub recompute: Recompute,
    /// Gradients in fp32 (else BF16, with the optimizer's fp32 copy of its shard).
    pub grad_fp32: bool,
    /// Gradient-reduction bucket in bytes (a full-size buffer only when ZeRO ≥ 2).
    pub bucket_bytes: u64,
    /// Divisor of the hidden-sized saved tensors (TP under sequence parallelism, else 1).
    pub seq_shard: u32,
    /// Divisor of the expert parameters (EP; 1 for a dense model).
    pub expert_shard: u32,
    /// FP8 linear layers as TransformerEngine keeps them (`cost::gpu::precision`): the FP8
    /// weight caches beside the BF16 weights, the linear inputs saved in FP8.
    pub fp8: bool,
}

/// One rank's peak memory, by kind, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
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
    activation_bytes_sharded(m, 1)
}

/// [`activation_bytes_per_token_layer`] with the hidden-sized tensors divided by
/// `seq_shard` (sequence parallelism; rounded up).
pub fn activation_bytes_sharded(m: &ModelConfig, seq_shard: u32) -> u64 {
    let dt = u64::from(m.dtype_bytes);
    let h = u64::from(m.hidden).div_ceil(u64::from(seq_shard.max(1)));
    let d = u64::from(m.head_dim);
    let attn = dt * (2 * h + u64::from(m.heads_q + 2 * m.heads_kv) * d + u64::from(m.heads_q) * d)
        + 4 * u64::from(m.heads_q);
    let ffn = match m.ffn {
        Ffn::Dense { intermediate } => dt * (2 * h + 3 * u64::from(intermediate)),
        Ffn::Moe {
            experts,
            top_k,
            expert_intermediate,
            shared_experts,
            shared_expert_intermediate,
        } => {
            dt * (2 * h
                + u64::from(top_k) * (h + 3 * u64::from(expert_intermediate))
                + u64::from(shared_experts) * 3 * u64::from(shared_expert_intermediate))
                + 4 * u64::from(experts)
        }
    };
    attn + ffn
}

/// Bytes per token of one layer that selective recomputation does not keep: core
/// attention's output (h_q·d) and its fp32 log-sum-exp, recomputed from the kept Q, K, V.
pub fn core_attention_bytes_per_token(m: &ModelConfig) -> u64 {
    u64::from(m.dtype_bytes) * u64::from(m.heads_q) * u64::from(m.head_dim)
        + 4 * u64::from(m.heads_q)
}

/// [`activation_bytes_sharded`] with FP8 linear layers (TransformerEngine): the inputs the
/// linear layers save for their weight gradients in FP8, one byte an element — the QKV and
/// MLP inputs (the two normed hidden states) and the down-projection's input (a dense MLP's
/// activation, each routed copy's hidden state and activation, each shared expert's
/// activation) in place of their BF16 copies, and an FP8 copy of the attention output (the
/// O projection's input) beside the BF16 one attention's backward keeps.
pub fn fp8_activation_bytes_sharded(m: &ModelConfig, seq_shard: u32) -> u64 {
    let dt = u64::from(m.dtype_bytes);
    let saved = dt.saturating_sub(1);
    let h = u64::from(m.hidden).div_ceil(u64::from(seq_shard.max(1)));
    let o = u64::from(m.heads_q) * u64::from(m.head_dim);
    let down = match m.ffn {
        Ffn::Dense { intermediate } => u64::from(intermediate),
        Ffn::Moe {
            top_k,
            expert_intermediate,
            shared_experts,
            shared_expert_intermediate,
            ..
        } => {
            u64::from(top_k) * (h + u64::from(expert_intermediate))
                + u64::from(shared_experts) * u64::from(shared_expert_intermediate)
        }
    };
    activation_bytes_sharded(m, seq_shard) + o - saved * (2 * h + down)
}

/// Decoder-layer linear (GEMM weight) parameters one rank of a stage holds: the attention
/// projections and the MLP or experts (the routed ones over `ep`); not the norms, the
/// embedding or the LM head (which FP8 recipes keep in BF16).
pub fn stage_rank_linear_params(m: &ModelConfig, layers: u32, ep: u32) -> u64 {
    let layer = m.attn_proj_params() + m.ffn_params();
    let e = stage_expert_params(m, layers);
    u64::from(layers) * layer - e + e.div_ceil(u64::from(ep.max(1)))
}

/// Gradient bytes per parameter (fp32 main gradients), held and reduced across DP.
pub const GRAD_BYTES_PER_PARAM: u64 = 4;

/// Gradient bytes per parameter: fp32 main gradients, or BF16 ones (Megatron's
/// `grad_reduce_in_fp32 = false`).
pub fn grad_bytes_per_param(fp32: bool) -> u64 {
    if fp32 {
        GRAD_BYTES_PER_PARAM
    } else {
        2
    }
}

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

/// The routed experts' parameters among [`stage_params`] (0 for a dense model; shared
/// experts count as dense parameters).
pub fn stage_expert_params(m: &ModelConfig, layers: u32) -> u64 {
    match m.ffn {
        Ffn::Dense { .. } => 0,
        Ffn::Moe {
            experts,
            expert_intermediate,
            ..
        } => {
            u64::from(layers)
                * u64::from(experts)
                * 3
                * u64::from(m.hidden)
                * u64::from(expert_intermediate)
        }
    }
}

/// Parameters one rank of a stage holds when its experts are sharded over `ep` ranks.
pub fn stage_rank_params(
    m: &ModelConfig,
    layers: u32,
    first_stage: bool,
    last_stage: bool,
    ep: u32,
) -> u64 {
    let all = stage_params(m, layers, first_stage, last_stage);
    let e = stage_expert_params(m, layers);
    all - e + e.div_ceil(u64::from(ep.max(1)))
}

/// Gradient bytes a stage reduces across data parallelism each step.
pub fn stage_grad_bytes(m: &ModelConfig, layers: u32, first_stage: bool, last_stage: bool) -> u64 {
    stage_params(m, layers, first_stage, last_stage) * GRAD_BYTES_PER_PARAM
}

/// One rank's peak memory.
pub fn rank_memory(m: &ModelConfig, x: &MemoryInputs) -> MemoryBreakdown {
    let dt = u64::from(m.dtype_bytes);
    let params = stage_rank_params(m, x.layers, x.first_stage, x.last_stage, x.expert_shard);
    let shard = u64::from(x.shard_degree.max(1));
    let by = |stage: u8, bytes: u64| {
        if x.zero_stage >= stage {
            bytes.div_ceil(shard)
        } else {
            bytes
        }
    };
    let per_tok = if x.fp8 {
        fp8_activation_bytes_sharded(m, x.seq_shard)
    } else {
        activation_bytes_sharded(m, x.seq_shard)
    };
    let held = x.held_layers.max(1);
    let hidden = u64::from(m.hidden).div_ceil(u64::from(x.seq_shard.max(1)));
    let activations = match x.recompute {
        Recompute::Full => held * x.tokens_per_rank * dt * hidden + x.tokens_per_rank * per_tok,
        Recompute::Selective => {
            let attn = core_attention_bytes_per_token(m);
            held * x.tokens_per_rank * (per_tok - attn) + x.tokens_per_rank * attn
        }
        Recompute::None => held * x.tokens_per_rank * per_tok,
    };
    let a = m.attn_shape();
    let qkv = a.q_bytes(x.attn_tokens, x.attn_heads_q) + a.kv_bytes(x.attn_tokens, x.attn_heads_kv);
    let out = a.q_bytes(x.attn_tokens, x.attn_heads_q);
    // TransformerEngine's FP8 weight caches: each linear weight row- and column-wise, one
    // byte each, whole on every rank (ZeRO shards the BF16 weights, not the caches).
    let fp8_cache = if x.fp8 {
        2 * stage_rank_linear_params(m, x.layers, x.expert_shard)
    } else {
        0
    };
    MemoryBreakdown {
        weights: by(3, dt * params) + fp8_cache,
        grads: by(2, grad_bytes_per_param(x.grad_fp32) * params),
        // fp32 master weights and two moments; with BF16 gradients also an fp32 copy of
        // the gradients the step updates (Megatron's distributed optimizer: 4 + 16/d bytes
        // per parameter with BF16 gradients, 6 + 12/d with fp32 ones).
        optimizer: by(1, if x.grad_fp32 { 12 } else { 16 } * params),
        activations,
        // forward inputs and output, and in backward their gradients
        attn_buffers: 2 * (qkv + out),
        // The all-to-all send buffer; unsharded gradients are reduced in place, sharded
        // ones (ZeRO ≥ 2) need the bucket being reduced at full size; ZeRO-3 gathers one
        // layer's weights at a time.
        comm_buffers: qkv
            + if x.zero_stage >= 2 { x.bucket_bytes } else { 0 }
            + if x.zero_stage >= 3 {
                dt * stage_rank_params(m, 1, false, false, x.expert_shard)
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
            held_layers: 32,
            recompute: Recompute::None,
            grad_fp32: true,
            bucket_bytes: 0,
            seq_shard: 1,
            expert_shard: 1,
            fp8: false,
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
    fn memory_per_rank_under_tp_and_ep_by_hand() {
        // llama3-8b at TP 8 with sequence parallelism, 8192 tokens on the rank's CP chunk.
        let m = ModelConfig::builtin("llama3-8b").unwrap();
        let s = m.tp_shard(8, true).unwrap();
        let x = MemoryInputs {
            tokens_per_rank: 8192,
            attn_tokens: 8192,
            attn_heads_q: 4,
            attn_heads_kv: 1,
            seq_shard: 8,
            ..inputs()
        };
        let b = rank_memory(&s, &x);
        // Weights: 32 layers of (Q 4096·512 + K,V 2·4096·128 + O 512·4096 + MLP 3·4096·1792
        // + norms 2·4096) + embedding and LM head 2·16032·4096 + final norm 4096, bf16.
        let layer = 4096 * 512 + 2 * 4096 * 128 + 512 * 4096 + 3 * 4096 * 1792 + 2 * 4096;
        let p = 32 * layer + 2 * 16032 * 4096 + 4096;
        assert_eq!(b.weights, 2 * p);
        // Saved per token per layer: 2·(2·512 + 6·128 + 4·128) + 4·4 + 2·(2·512 + 3·1792).
        let per = 2 * (1024 + 768 + 512) + 16 + 2 * (1024 + 5376);
        assert_eq!(b.activations, 8192 * 32 * per);
        // Qwen3 at EP 8: each rank holds 16 of 128 experts per layer.
        let q = ModelConfig::builtin("qwen3-30b-a3b").unwrap();
        let e = stage_expert_params(&q, q.layers);
        assert_eq!(e, 48 * 128 * 3 * 2048 * 768);
        let r = rank_memory(
            &q,
            &MemoryInputs {
                layers: q.layers,
                expert_shard: 8,
                ..inputs()
            },
        );
        assert_eq!(r.weights, 2 * (q.total_params() - e + e / 8));
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
                recompute: Recompute::Full,
                ..inputs()
            },
        );
        assert_eq!(r.activations, 1000 * 32 * 2 * 4096 + 1000 * per);
        assert!(r.activations < b.activations / 5);
        // Q (32 heads) + K,V (8 heads) + O for 1000 tokens, fwd and bwd.
        let qkv = 1000 * 32 * 128 * 2 + 2 * 1000 * 8 * 128 * 2;
        assert_eq!(b.attn_buffers, 2 * (qkv + 1000 * 32 * 128 * 2));
    }

    #[test]
    fn fp8_keeps_weight_caches_and_saves_linear_inputs_in_fp8() {
        let m = ModelConfig::builtin("llama3-8b").unwrap();
        // The normed inputs (2 · 4096) and the down-projection's input (14336) a byte less,
        // an FP8 copy of the attention output (32 · 128) more.
        let bf16 = activation_bytes_per_token_layer(&m);
        assert_eq!(
            fp8_activation_bytes_sharded(&m, 1),
            bf16 + 4096 - (2 * 4096 + 14336)
        );
        let x = MemoryInputs {
            fp8: true,
            ..inputs()
        };
        let (b, f) = (rank_memory(&m, &inputs()), rank_memory(&m, &x));
        // Two FP8 copies of every decoder linear weight: 32 · (Q,K,V,O 4096 · 6144 + 4096 ·
        // 4096 and the MLP 3 · 4096 · 14336).
        let linear = 32 * (4096 * 6144 + 4096 * 4096 + 3 * 4096 * 14336);
        assert_eq!(stage_rank_linear_params(&m, 32, 1), linear);
        assert_eq!(f.weights, b.weights + 2 * linear);
        assert_eq!(
            f.activations,
            1000 * 32 * fp8_activation_bytes_sharded(&m, 1)
        );
        assert_eq!((f.grads, f.optimizer), (b.grads, b.optimizer));
    }
}
