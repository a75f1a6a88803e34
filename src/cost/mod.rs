//! Cost: the one place a FLOP or a byte of attention work is counted.
//!
//! Architecture invariant: planners (balance/), the schedule and the GPU validator price
//! work through this module only, so the planner's estimate, the engine's duration and the
//! validator's prediction agree by construction.

use serde::{Deserialize, Serialize};

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
}

impl AttnShape {
    /// Forward FLOPs of core attention per causal query–key pair and per query head:
    /// 2·d for QKᵀ and 2·d for PV.
    pub fn fwd_flops_per_pair_head(&self) -> f64 {
        4.0 * f64::from(self.head_dim)
    }

    /// Forward FLOPs of `pairs` causal query–key pairs over `heads` query heads.
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
