//! Model configurations: the shapes that decide how much work a token costs.
//!
//! A model is a TOML file (`models/*.toml`); the built-ins are compiled in with
//! `include_str!` so `skewsim` works without the repository around it. Every figure in a
//! built-in is checked against the model's published `config.json` (cited in the file),
//! and the parameter counts are tested against the published totals.

use serde::{Deserialize, Serialize};

use super::{AttentionPattern, AttnShape, Mask};
use crate::error::{invalid, parse_error, Result};

/// The most decoder layers of a model (published models have up to ~130).
pub const MAX_LAYERS: u32 = 1 << 12;
/// The widest hidden or intermediate size: 1 Mi, twenty times the widest published
/// (Llama 3.1 405B's 53248 intermediate).
pub const MAX_WIDTH: u32 = 1 << 20;
/// The largest head dimension.
pub const MAX_HEAD_DIM: u32 = 1024;
/// The largest vocabulary: 16 Mi entries (published models have up to ~256 Ki).
pub const MAX_VOCAB: u32 = 1 << 24;
/// The most bytes per element (8: f64).
pub const MAX_DTYPE_BYTES: u32 = 8;
/// The most experts (routed, or shared) of one MoE layer (published models have up to ~400).
pub const MAX_EXPERTS: u32 = 1 << 16;

/// The feed-forward block of every layer.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", try_from = "FfnFile")]
pub enum Ffn {
    /// A dense SwiGLU MLP (gate, up, down projections).
    Dense {
        /// Intermediate size.
        intermediate: u32,
    },
    /// A mixture of SwiGLU experts with a linear router; each token runs `top_k` routed
    /// experts and every shared expert.
    Moe {
        /// Routed experts per layer.
        experts: u32,
        /// Experts each token is routed to.
        top_k: u32,
        /// Intermediate size of one expert.
        expert_intermediate: u32,
        /// Shared experts per layer: SwiGLU MLPs every token runs (never dispatched), split
        /// by TP like the dense MLP, their parameters dense (reduced over DP, not EDP).
        #[serde(default)]
        shared_experts: u32,
        /// Intermediate size of one shared expert.
        #[serde(default)]
        shared_expert_intermediate: u32,
    },
}

/// `[ffn]` as written: every key a plain field, so a bad value is reported at its key
/// (an internally tagged enum would report it at the table).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FfnFile {
    kind: String,
    intermediate: Option<u32>,
    experts: Option<u32>,
    top_k: Option<u32>,
    expert_intermediate: Option<u32>,
    #[serde(default)]
    shared_experts: u32,
    #[serde(default)]
    shared_expert_intermediate: u32,
}

impl TryFrom<FfnFile> for Ffn {
    type Error = String;

    fn try_from(f: FfnFile) -> std::result::Result<Self, String> {
        let need =
            |key: &str, v: Option<u32>| v.ok_or(format!("ffn.{key} missing ({} ffn)", f.kind));
        let dense_only = [("intermediate", f.intermediate.is_some())];
        let moe_only = [
            ("experts", f.experts.is_some()),
            ("top_k", f.top_k.is_some()),
            ("expert_intermediate", f.expert_intermediate.is_some()),
            ("shared_experts", f.shared_experts != 0),
            (
                "shared_expert_intermediate",
                f.shared_expert_intermediate != 0,
            ),
        ];
        let stray = |keys: &[(&str, bool)]| match keys.iter().find(|(_, set)| *set) {
            Some((k, _)) => Err(format!("ffn.{k} does not apply to a {} ffn", f.kind)),
            None => Ok(()),
        };
        match f.kind.as_str() {
            "dense" => {
                stray(&moe_only)?;
                Ok(Ffn::Dense {
                    intermediate: need("intermediate", f.intermediate)?,
                })
            }
            "moe" => {
                stray(&dense_only)?;
                Ok(Ffn::Moe {
                    experts: need("experts", f.experts)?,
                    top_k: need("top_k", f.top_k)?,
                    expert_intermediate: need("expert_intermediate", f.expert_intermediate)?,
                    shared_experts: f.shared_experts,
                    shared_expert_intermediate: f.shared_expert_intermediate,
                })
            }
            k => Err(format!("invalid ffn.kind = {k:?}: dense or moe")),
        }
    }
}

/// A decoder-only transformer, as far as pricing its work needs it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Name, as `--model` spells it.
    pub name: String,
    /// Decoder layers.
    pub layers: u32,
    /// Hidden size.
    pub hidden: u32,
    /// Query heads.
    pub heads_q: u32,
    /// Key/value heads.
    pub heads_kv: u32,
    /// Head dimension.
    pub head_dim: u32,
    /// Vocabulary size.
    pub vocab: u32,
    /// Input embedding and LM head share one matrix.
    pub tie_embeddings: bool,
    /// Bytes per activation/weight element in compute (2 for bf16).
    pub dtype_bytes: u32,
    /// The feed-forward block.
    pub ffn: Ffn,
    /// Per-layer attention masks, a pattern repeating over the layers
    /// (`attention = ["3*sliding:4096", "causal"]`); left out: every layer causal.
    #[serde(default, skip_serializing_if = "AttentionPattern::all_causal")]
    pub attention: AttentionPattern,
}

/// The built-in model files.
const BUILTINS: &[(&str, &str)] = &[
    (
        "qwen3-30b-a3b",
        include_str!("../../models/qwen3-30b-a3b.toml"),
    ),
    ("llama3-8b", include_str!("../../models/llama3-8b.toml")),
    ("llama-34b", include_str!("../../models/llama-34b.toml")),
];

/// The names of the built-in models.
pub fn builtin_names() -> Vec<&'static str> {
    BUILTINS.iter().map(|(n, _)| *n).collect()
}

impl ModelConfig {
    /// A built-in model by name.
    pub fn builtin(name: &str) -> Result<Self> {
        let text = super::builtin_text(BUILTINS, "model", name, "")?;
        Self::from_toml_str(text, &format!("built-in model {name}"))
    }

    /// Parse and validate a model file's text; `context` names it in errors.
    pub fn from_toml_str(text: &str, context: &str) -> Result<Self> {
        let m: ModelConfig =
            toml::from_str(text).map_err(|e| parse_error(context, e.to_string()))?;
        m.validate(context)?;
        Ok(m)
    }

    fn validate(&self, ctx: &str) -> Result<()> {
        let heads = super::fit::MAX_HEADS;
        // (field, value, least, most); shared experts may be absent (0)
        let mut sizes = vec![
            ("layers", self.layers, 1, MAX_LAYERS),
            ("hidden", self.hidden, 1, MAX_WIDTH),
            ("heads_q", self.heads_q, 1, heads),
            ("heads_kv", self.heads_kv, 1, heads),
            ("head_dim", self.head_dim, 1, MAX_HEAD_DIM),
            ("vocab", self.vocab, 1, MAX_VOCAB),
            ("dtype_bytes", self.dtype_bytes, 1, MAX_DTYPE_BYTES),
        ];
        match self.ffn {
            Ffn::Dense { intermediate } => {
                sizes.push(("ffn.intermediate", intermediate, 1, MAX_WIDTH));
            }
            Ffn::Moe {
                experts,
                top_k,
                expert_intermediate,
                shared_experts,
                shared_expert_intermediate,
            } => sizes.extend([
                ("ffn.experts", experts, 1, MAX_EXPERTS),
                ("ffn.top_k", top_k, 1, experts),
                ("ffn.expert_intermediate", expert_intermediate, 1, MAX_WIDTH),
                ("ffn.shared_experts", shared_experts, 0, MAX_EXPERTS),
                (
                    "ffn.shared_expert_intermediate",
                    shared_expert_intermediate,
                    0,
                    MAX_WIDTH,
                ),
            ]),
        }
        for (f, v, least, most) in sizes {
            if !(least..=most).contains(&v) {
                return Err(invalid(
                    format!("{ctx}: {f}"),
                    v,
                    format!("a whole number in {least}..={most}"),
                ));
            }
        }
        self.attention
            .check_layers(self.layers, &format!("{ctx}: attention"))?;
        if self.heads_q % self.heads_kv != 0 {
            return Err(invalid(
                format!("{ctx}: heads_kv"),
                self.heads_kv,
                format!("a divisor of heads_q = {}", self.heads_q),
            ));
        }
        match self.ffn {
            Ffn::Moe {
                shared_experts: n,
                shared_expert_intermediate: i,
                ..
            } if (n == 0) != (i == 0) => Err(invalid(
                format!("{ctx}: ffn.shared_expert_intermediate"),
                i,
                format!("> 0 with shared_experts = {n} > 0, and 0 (or absent) with none"),
            )),
            _ => Ok(()),
        }
    }

    /// The share of the model one tensor-parallel rank of a TP group of `tp` holds
    /// (Megatron-style column/row-parallel layers): h_q/TP query heads; h_kv/TP KV heads,
    /// or one (replicated) when TP exceeds h_kv; the MLP's intermediate size / TP; the
    /// vocabulary / TP, padded up (vocab-parallel embedding and LM head); the hidden size
    /// whole. An MoE layer's experts are split like an MLP when `split_experts` (expert
    /// tensor parallelism = TP, the layout without EP); otherwise each expert stays whole
    /// (expert parallelism shards experts, not their matrices). `tp = 1` is the model.
    ///
    /// Errors name `tp` and what it must divide.
    pub fn tp_shard(&self, tp: u32, split_experts: bool) -> Result<ModelConfig> {
        if tp == 1 {
            return Ok(self.clone());
        }
        let bad = |what: String| Err(invalid("tp", tp, what));
        if tp == 0 {
            return bad("a positive integer".into());
        }
        let m = &self.name;
        if self.heads_q % tp != 0 {
            return bad(format!(
                "a divisor of {m}'s {} query heads (each TP rank holds whole heads)",
                self.heads_q
            ));
        }
        let kv = if self.heads_kv >= tp {
            if self.heads_kv % tp != 0 {
                return bad(format!(
                    "a divisor or a multiple of {m}'s {} KV heads",
                    self.heads_kv
                ));
            }
            self.heads_kv / tp
        } else {
            if tp % self.heads_kv != 0 {
                return bad(format!(
                    "a divisor or a multiple of {m}'s {} KV heads (KV heads are replicated \
                     when TP exceeds them)",
                    self.heads_kv
                ));
            }
            1
        };
        if self.hidden % tp != 0 {
            return bad(format!("a divisor of {m}'s hidden size {}", self.hidden));
        }
        let ffn = match self.ffn {
            Ffn::Dense { intermediate } => {
                if intermediate % tp != 0 {
                    return bad(format!(
                        "a divisor of {m}'s MLP intermediate size {intermediate}"
                    ));
                }
                Ffn::Dense {
                    intermediate: intermediate / tp,
                }
            }
            Ffn::Moe {
                experts,
                top_k,
                expert_intermediate,
                shared_experts,
                shared_expert_intermediate: si,
            } => {
                if split_experts && expert_intermediate % tp != 0 {
                    return bad(format!(
                        "a divisor of {m}'s expert intermediate size {expert_intermediate} \
                         (experts are split by TP when EP = 1)"
                    ));
                }
                if si % tp != 0 {
                    return bad(format!(
                        "a divisor of {m}'s shared-expert intermediate size {si} (shared \
                         experts are split by TP like the dense MLP)"
                    ));
                }
                Ffn::Moe {
                    experts,
                    top_k,
                    expert_intermediate: if split_experts {
                        expert_intermediate / tp
                    } else {
                        expert_intermediate
                    },
                    shared_experts,
                    shared_expert_intermediate: si / tp,
                }
            }
        };
        Ok(ModelConfig {
            heads_q: self.heads_q / tp,
            heads_kv: kv,
            vocab: self.vocab.div_ceil(tp),
            ffn,
            ..self.clone()
        })
    }

    /// The attention shape a step's plan is made for: the heads and the widest mask of the
    /// layers ([`AttentionPattern::plan_mask`]; causal for a causal model).
    pub fn attn_shape(&self) -> AttnShape {
        self.attn_shape_masked(self.attention.plan_mask(self.layers))
    }

    /// The attention shape of layer `layer` (its own mask).
    pub fn attn_shape_of(&self, layer: u32) -> AttnShape {
        self.attn_shape_masked(self.attention.mask_of(layer))
    }

    /// The attention heads under `mask`.
    pub fn attn_shape_masked(&self, mask: Mask) -> AttnShape {
        AttnShape {
            heads_q: self.heads_q,
            heads_kv: self.heads_kv,
            head_dim: self.head_dim,
            dtype_bytes: self.dtype_bytes,
            mask,
        }
    }

    /// Check every layer's mask against the sequence length `seq_len` (a chunk larger
    /// than L, a block that does not tile L: named errors).
    pub fn check_masks(&self, seq_len: u32) -> Result<()> {
        for (m, _) in self.attention.classes(self.layers) {
            m.check_len(seq_len, &format!("model {}: attention", self.name))?;
        }
        Ok(())
    }

    /// Parameters of the Q, K, V and O projections of one layer.
    pub fn attn_proj_params(&self) -> u64 {
        let h = u64::from(self.hidden);
        let q = u64::from(self.heads_q) * u64::from(self.head_dim);
        let kv = u64::from(self.heads_kv) * u64::from(self.head_dim);
        h * q + 2 * h * kv + q * h
    }

    /// Parameters of one layer's feed-forward block (all experts, shared ones included, and
    /// the router).
    pub fn ffn_params(&self) -> u64 {
        let h = u64::from(self.hidden);
        match self.ffn {
            Ffn::Dense { intermediate } => 3 * h * u64::from(intermediate),
            Ffn::Moe {
                experts,
                expert_intermediate,
                ..
            } => {
                u64::from(experts) * 3 * h * u64::from(expert_intermediate)
                    + h * u64::from(experts)
                    + self.shared_expert_params()
            }
        }
    }

    /// Parameters of one layer's shared experts (0 for a dense model or none).
    pub fn shared_expert_params(&self) -> u64 {
        match self.ffn {
            Ffn::Dense { .. } => 0,
            Ffn::Moe {
                shared_experts,
                shared_expert_intermediate,
                ..
            } => {
                u64::from(shared_experts)
                    * 3
                    * u64::from(self.hidden)
                    * u64::from(shared_expert_intermediate)
            }
        }
    }

    /// Feed-forward parameters one token multiplies with (top-k experts, the shared
    /// experts and the router).
    pub fn ffn_active_params(&self) -> u64 {
        let h = u64::from(self.hidden);
        match self.ffn {
            Ffn::Dense { intermediate } => 3 * h * u64::from(intermediate),
            Ffn::Moe {
                experts,
                top_k,
                expert_intermediate,
                ..
            } => {
                u64::from(top_k) * 3 * h * u64::from(expert_intermediate)
                    + h * u64::from(experts)
                    + self.shared_expert_params()
            }
        }
    }

    /// Parameters of one decoder layer (projections, feed-forward, two RMSNorms).
    pub fn layer_params(&self) -> u64 {
        self.attn_proj_params() + self.ffn_params() + 2 * u64::from(self.hidden)
    }

    /// Embedding and LM head parameters (one matrix when tied) plus the final norm.
    pub fn embedding_params(&self) -> u64 {
        let e = u64::from(self.vocab) * u64::from(self.hidden);
        (if self.tie_embeddings { e } else { 2 * e }) + u64::from(self.hidden)
    }

    /// All parameters.
    pub fn total_params(&self) -> u64 {
        u64::from(self.layers) * self.layer_params() + self.embedding_params()
    }

    /// Parameters a token is multiplied with (what "activated" counts for an MoE model).
    pub fn active_params(&self) -> u64 {
        u64::from(self.layers)
            * (self.attn_proj_params() + self.ffn_active_params() + 2 * u64::from(self.hidden))
            + self.embedding_params()
    }

    /// Forward FLOPs per token of one layer's linear work (2 per multiply-add).
    pub fn layer_linear_fwd_flops_per_token(&self) -> f64 {
        2.0 * (self.attn_proj_params() + self.ffn_active_params()) as f64
    }

    /// Forward FLOPs per token of the LM head.
    pub fn lm_head_fwd_flops_per_token(&self) -> f64 {
        2.0 * f64::from(self.vocab) * f64::from(self.hidden)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn near(a: f64, b: f64, rel: f64) -> bool {
        (a - b).abs() <= rel * b.abs()
    }

    #[test]
    fn per_layer_attention_from_the_model_file() {
        let base = include_str!("../../models/llama3-8b.toml");
        let with =
            |line: &str| base.replace("dtype_bytes = 2\n", &format!("dtype_bytes = 2\n{line}\n"));
        let m = ModelConfig::from_toml_str(
            &with(r#"attention = ["3*sliding:4096", "causal"]"#),
            "m.toml",
        )
        .unwrap();
        assert_eq!(m.attn_shape_of(2).mask, Mask::Sliding { w: 4096 });
        assert_eq!(m.attn_shape_of(3).mask, Mask::Causal);
        // the plan is made for the widest class
        assert_eq!(m.attn_shape().mask, Mask::Causal);
        assert!(m.check_masks(131072).is_ok());
        // a causal model writes no `attention` field
        let plain = ModelConfig::from_toml_str(base, "m.toml").unwrap();
        assert!(!toml::to_string(&plain).unwrap().contains("attention"));
        assert!(toml::to_string(&m)
            .unwrap()
            .contains(r#"attention = ["sliding:4096", "sliding:4096", "sliding:4096", "causal"]"#));
        // named errors: W <= 0, a pattern that does not tile the layers, chunk > L
        for (line, want) in [
            (
                r#"attention = ["sliding:0"]"#,
                "attention[0] = \"sliding:0\"",
            ),
            (r#"attention = ["sliding:-4"]"#, "window W"),
            (
                r#"attention = ["3*sliding:64", "2*causal"]"#,
                "divides the model's 32 layers",
            ),
        ] {
            let e = ModelConfig::from_toml_str(&with(line), "m.toml")
                .unwrap_err()
                .to_string();
            assert!(e.contains("m.toml") && e.contains(want), "{line}: {e}");
        }
        let c =
            ModelConfig::from_toml_str(&with(r#"attention = ["chunked:8192"]"#), "m.toml").unwrap();
        let e = c.check_masks(4096).unwrap_err().to_string();
        assert!(
            e.contains("attention") && e.contains("chunked:8192") && e.contains("L = 4096"),
            "{e}"
        );
    }

    #[test]
    fn builtins_match_published_sizes() {
        // Published totals: Qwen3-30B-A3B 30.5B total / 3.3B activated (model card);
        // Llama 3 8B 8.03B; Code Llama 34B 33.7B.
        let q = ModelConfig::builtin("qwen3-30b-a3b").unwrap();
        assert_eq!(
            (q.layers, q.hidden, q.heads_q, q.heads_kv, q.head_dim),
            (48, 2048, 32, 4, 128)
        );
        assert!(
            near(q.total_params() as f64, 30.5e9, 0.01),
            "{}",
            q.total_params()
        );
        assert!(
            near(q.active_params() as f64, 3.3e9, 0.03),
            "{}",
            q.active_params()
        );
        let l8 = ModelConfig::builtin("llama3-8b").unwrap();
        assert!(
            near(l8.total_params() as f64, 8.03e9, 0.005),
            "{}",
            l8.total_params()
        );
        let l34 = ModelConfig::builtin("llama-34b").unwrap();
        assert!(
            near(l34.total_params() as f64, 33.7e9, 0.005),
            "{}",
            l34.total_params()
        );
    }

    #[test]
    fn model_files_match_published_sizes() {
        // Published sizes: Llama 3.1 70B and 405B (the names; arXiv:2407.21783 Table 3),
        // GPT-3 175.0B (arXiv:2005.14165 Table 2.1). By hand, L·(attn + ffn + 2h) + emb:
        // 70B: 80·(2·8192·8192 + 2·8192·1024 + 3·8192·28672 + 2·8192) + 2·128256·8192 + 8192;
        // 405B: 126·(2·16384·16384 + 2·16384·1024 + 3·16384·53248 + 2·16384)
        //   + 2·128256·16384 + 16384;
        // GPT-3: 96·(4·12288² + 3·12288·32768 + 2·12288) + 51200·12288 + 12288 (tied).
        let file = |text: &str| ModelConfig::from_toml_str(text, "m.toml").unwrap();
        let l70 = file(include_str!("../../models/llama3.1-70b.toml"));
        assert_eq!(l70.total_params(), 70_553_706_496);
        assert!(near(l70.total_params() as f64, 70e9, 0.01));
        let l405 = file(include_str!("../../models/llama3.1-405b.toml"));
        assert_eq!(l405.total_params(), 405_853_388_800);
        assert!(near(l405.total_params() as f64, 405e9, 0.005));
        let g = file(include_str!("../../models/gpt3-175b.toml"));
        assert_eq!(g.total_params(), 174_577_692_672);
        assert!(near(g.total_params() as f64, 175.0e9, 0.005));
        // the SwiGLU stand-in for GPT-3's two-matrix GELU MLP (h → 4h → h): same weights,
        // hence the same linear FLOPs per token
        assert_eq!(g.ffn_params(), 2 * 12288 * 49152);
        assert_eq!(
            g.layer_linear_fwd_flops_per_token(),
            2.0 * (4.0 * 12288.0 * 12288.0 + 2.0 * 12288.0 * 49152.0)
        );
    }

    #[test]
    fn hand_count_of_qwen_layer_projections() {
        let q = ModelConfig::builtin("qwen3-30b-a3b").unwrap();
        // 2048*4096 (Q) + 2*2048*512 (K,V) + 4096*2048 (O)
        assert_eq!(q.attn_proj_params(), 8_388_608 + 2_097_152 + 8_388_608);
        // 8 experts * 3 * 2048 * 768 + router 2048*128
        assert_eq!(q.ffn_active_params(), 37_748_736 + 262_144);
    }

    #[test]
    fn tp_shards_by_hand() {
        let l8 = ModelConfig::builtin("llama3-8b").unwrap();
        let s = l8.tp_shard(8, true).unwrap();
        // 32/8 query heads, 8/8 KV heads, 14336/8, 128256/8.
        assert_eq!(
            (s.heads_q, s.heads_kv, s.hidden, s.vocab),
            (4, 1, 4096, 16032)
        );
        assert_eq!(s.ffn, Ffn::Dense { intermediate: 1792 });
        // Per rank: Q 4096·512 + K,V 2·4096·128 + O 512·4096 + MLP 3·4096·1792 + norms.
        assert_eq!(
            s.layer_params(),
            4096 * 512 + 2 * 4096 * 128 + 512 * 4096 + 3 * 4096 * 1792 + 2 * 4096
        );
        // Qwen3: 4 KV heads replicated at TP 8; experts whole under EP, split without.
        let q = ModelConfig::builtin("qwen3-30b-a3b").unwrap();
        let s = q.tp_shard(8, false).unwrap();
        assert_eq!((s.heads_q, s.heads_kv), (4, 1));
        assert_eq!(s.ffn, q.ffn);
        let s = q.tp_shard(4, true).unwrap();
        assert!(matches!(
            s.ffn,
            Ffn::Moe {
                expert_intermediate: 192,
                ..
            }
        ));
        for (tp, want) in [(3, "query heads"), (64, "query heads")] {
            let e = l8.tp_shard(tp, true).unwrap_err().to_string();
            assert!(e.contains("tp") && e.contains(want), "{tp}: {e}");
        }
        let odd = ModelConfig {
            ffn: Ffn::Dense { intermediate: 1000 },
            ..l8.clone()
        };
        let e = odd.tp_shard(16, true).unwrap_err().to_string();
        assert!(e.contains("intermediate size 1000"), "{e}");
        let e = ModelConfig {
            heads_kv: 16,
            ..l8.clone()
        }
        .tp_shard(32, true);
        assert!(e.is_ok());
        let e = ModelConfig {
            heads_kv: 4,
            heads_q: 24,
            ..l8
        }
        .tp_shard(6, true)
        .unwrap_err()
        .to_string();
        assert!(e.contains("4 KV heads"), "{e}");
    }

    #[test]
    fn bad_models_are_rejected_with_the_field() {
        assert!(matches!(
            ModelConfig::builtin("gpt-5"),
            Err(crate::Error::Invalid { .. })
        ));
        let text =
            include_str!("../../models/llama3-8b.toml").replace("heads_kv = 8", "heads_kv = 5");
        let e = ModelConfig::from_toml_str(&text, "x.toml").unwrap_err();
        assert!(e.to_string().contains("heads_kv"), "{e}");
        let e = ModelConfig::from_toml_str("name = 1", "x.toml").unwrap_err();
        assert!(matches!(e, crate::Error::Parse { .. }));
    }

    /// A bad `[ffn]` value is reported at its key, and every dimension has a ceiling.
    #[test]
    fn ffn_keys_and_dimension_limits_are_named() {
        let dense = include_str!("../../models/llama3-8b.toml");
        let moe = include_str!("../../models/qwen3-30b-a3b.toml");
        for (base, from, to, key) in [
            (
                dense,
                "intermediate = 14336",
                "intermediate = -1",
                "intermediate = -1",
            ),
            (moe, "top_k = 8", "top_k = 0.5", "top_k = 0.5"),
            (moe, "experts = 128", "experts = \"x\"", "experts = \"x\""),
            (dense, "kind = \"dense\"", "kind = \"sparse\"", "ffn.kind"),
            (dense, "intermediate = 14336", "experts = 8", "ffn.experts"),
        ] {
            assert!(base.contains(from), "{from}");
            let e = ModelConfig::from_toml_str(&base.replace(from, to), "x.toml")
                .unwrap_err()
                .to_string();
            assert!(e.contains(key), "{to}: {e}");
        }
        for (base, from, to, field) in [
            (dense, "hidden = 4096", "hidden = 4294967295", "hidden"),
            (dense, "head_dim = 128", "head_dim = 4096", "head_dim"),
            (dense, "vocab = 128256", "vocab = 4294967295", "vocab"),
            (dense, "layers = 32", "layers = 100000", "layers"),
            (dense, "dtype_bytes = 2", "dtype_bytes = 16", "dtype_bytes"),
            (
                dense,
                "intermediate = 14336",
                "intermediate = 4294967295",
                "ffn.intermediate",
            ),
            (moe, "experts = 128", "experts = 4294967295", "ffn.experts"),
            (moe, "top_k = 8", "top_k = 129", "ffn.top_k"),
            (moe, "top_k = 8", "top_k = 0", "ffn.top_k"),
        ] {
            let e = ModelConfig::from_toml_str(&base.replace(from, to), "x.toml").unwrap_err();
            assert!(
                matches!(&e, crate::Error::Invalid { field: f, .. } if *f == format!("x.toml: {field}")),
                "{to}: {e:?}"
            );
        }
    }
}
