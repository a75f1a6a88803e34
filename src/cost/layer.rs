//! One transformer layer of a dense model on one GPU (TP 1), forward and backward, over a
//! packed batch of documents: its GEMMs (the GEMM model, else FLOPs at the GEMM
//! efficiencies), its core attention (one varlen call over the documents, the kernel
//! profile's block models) and its elementwise kernels as memory-bound passes — the three
//! parts a profiler separates, each priced by this cost model alone.
//!
//! Elementwise kernels (what an unfused layer runs between its GEMMs and its attention),
//! bytes per token with hidden H, query width Q = h_q·d, key width K = h_kv·d and MLP width
//! I, each op reading its inputs and writing its output once, at `hbm_bytes_per_s`:
//! - forward: two RMSNorms (read x, write y: 2 × 2H elements), RoPE by rotate-half on Q
//!   and K (four products and a sum and a difference over halves, then the halves joined:
//!   9 elements read or written per element), two residual adds (3H each), SiLU (2I) and
//!   the gating product (3I);
//! - backward: the norms' input and weight gradients (3H + 2H each), the residual
//!   gradients' accumulation (3H each), the gating and SiLU gradients (3I each, three of
//!   them) and the joined gate/up gradient (2 × 2I), RoPE's gradients (the four products'
//!   and the difference's, 2 elements each per half, and the two halves' sums, 3 each: 8
//!   per element) and the Q/K/V gradients joined (2 × (Q + 2K)).

use super::{CostModel, LinearPiece};

/// Elements read or written per token by the forward's elementwise kernels, per dimension:
/// (hidden, Q + K, MLP width).
const FWD_ELEMS: (f64, f64, f64) = (2.0 * 2.0 + 2.0 * 3.0, 9.0, 2.0 + 3.0);
/// The backward's, likewise (and Q + 2K for the joined projection gradient).
const BWD_ELEMS: (f64, f64, f64) = (2.0 * 5.0 + 2.0 * 3.0, 8.0, 3.0 * 3.0 + 4.0);

/// One layer's time by part, ps.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LayerTime {
    /// Forward GEMMs (QKV, O, MLP).
    pub gemm_fwd: f64,
    /// Backward GEMMs (input and weight gradients).
    pub gemm_bwd: f64,
    /// The forward attention call.
    pub attn_fwd: f64,
    /// The backward attention call.
    pub attn_bwd: f64,
    /// Forward elementwise kernels.
    pub elem_fwd: f64,
    /// Backward elementwise kernels.
    pub elem_bwd: f64,
}

impl LayerTime {
    /// Forward, ps.
    pub fn fwd(&self) -> f64 {
        self.gemm_fwd + self.attn_fwd + self.elem_fwd
    }

    /// Forward and backward, ps.
    pub fn fwd_bwd(&self) -> f64 {
        self.fwd() + self.gemm_bwd + self.attn_bwd + self.elem_bwd
    }
}

impl CostModel {
    /// One layer over documents of lengths `docs` packed into one batch, at the model's
    /// query heads per attention call.
    pub fn layer_time(&self, docs: &[u32]) -> LayerTime {
        let tokens: u64 = docs.iter().map(|&l| u64::from(l)).sum();
        let gemms: Vec<(u64, u64, u64, bool)> =
            [LinearPiece::Qkv, LinearPiece::OutProj, LinearPiece::Ffn]
                .iter()
                .flat_map(|&p| self.piece_gemms(p, tokens))
                .collect();
        let heads = self.model.heads_q;
        LayerTime {
            gemm_fwd: self.gemms_ps_f(&gemms, false),
            gemm_bwd: self.gemms_ps_f(&gemms, true),
            attn_fwd: self.attn_fwd_ps_f(docs.iter().copied(), heads),
            attn_bwd: self.attn_bwd_ps(docs.iter().copied(), heads) as f64,
            elem_fwd: self.elementwise_ps(tokens, FWD_ELEMS, 0.0),
            elem_bwd: self.elementwise_ps(tokens, BWD_ELEMS, 2.0),
        }
    }

    /// Elementwise kernels over `tokens` tokens moving (hidden, Q + K, MLP) × `elems`
    /// elements per token, plus `qkv` × (Q + 2K), at the HBM rate, ps.
    fn elementwise_ps(&self, tokens: u64, elems: (f64, f64, f64), qkv: f64) -> f64 {
        let m = &self.model;
        let d = f64::from(m.head_dim);
        let (q, k) = (f64::from(m.heads_q) * d, f64::from(m.heads_kv) * d);
        let i = match m.ffn {
            super::Ffn::Dense { intermediate } => f64::from(intermediate),
            super::Ffn::Moe { .. } => 0.0,
        };
        let per_token =
            elems.0 * f64::from(m.hidden) + elems.1 * (q + k) + elems.2 * i + qkv * (q + 2.0 * k);
        tokens as f64 * per_token * f64::from(m.dtype_bytes) / self.hw.hbm_bytes_per_s * 1e12
    }
}

#[cfg(test)]
mod tests {
    use crate::cost::gemm::GemmModel;
    use crate::cost::profile::Kernel;
    use crate::cost::{CostModel, ModelConfig};

    /// The default pricing (torch-flash profile, the H200 GEMM model) of llama3-8b.
    fn default_model() -> CostModel {
        let c = Kernel::TorchFlash.calibration_for(128).unwrap();
        CostModel::calibrated(ModelConfig::builtin("llama3-8b").unwrap(), &c, "t")
            .unwrap()
            .with_gemm(GemmModel::h200_default().unwrap())
    }

    /// The parts by hand: the GEMMs are the GEMM model's seven shapes (and their input and
    /// weight gradients), attention the cost model's whole-document calls, the elementwise
    /// bytes the counted passes at the HBM rate.
    #[test]
    fn the_parts_by_hand() {
        let c = default_model();
        let g = c.gemm.clone().unwrap();
        let t = 8192u64;
        let lt = c.layer_time(&[4096, 3000, 1096]);
        let shapes = [
            (t, 6144, 4096),
            (t, 4096, 4096),
            (t, 28672, 4096),
            (t, 4096, 14336),
        ];
        let fwd: f64 = shapes.iter().map(|&(m, n, k)| g.time_ps(m, n, k)).sum();
        let bwd: f64 = shapes
            .iter()
            .map(|&(m, n, k)| g.time_ps(m, k, n) + g.time_ps(k, n, m))
            .sum();
        assert_eq!((lt.gemm_fwd, lt.gemm_bwd), (fwd, bwd));
        assert_eq!(lt.attn_fwd, c.attn_fwd_ps_f([4096, 3000, 1096], 32));
        // Forward: (10 · 4096 + 9 · 5120 + 5 · 14336) elements × 2 bytes per token.
        let bytes = 8192.0 * (10.0 * 4096.0 + 9.0 * 5120.0 + 5.0 * 14336.0) * 2.0;
        assert!((lt.elem_fwd - bytes / c.hw.hbm_bytes_per_s * 1e12).abs() < 1.0);
        assert!(lt.fwd_bwd() > lt.fwd() && lt.elem_bwd > lt.elem_fwd);
    }

    /// The measured llama3-8b layers (`validate/torch/torch_grid.py`'s layer on one H200:
    /// the fit runs' batches and a held-out run's, drawn by its printed seed) against the
    /// default pricing, part by part (the profiler's kernel times) and whole (CUDA events).
    #[test]
    fn measured_layers() {
        let c = default_model();
        let files = [
            include_str!("../../validate/results/torch_fit/layer.json"),
            include_str!("../../validate/results/production_fit/layer_fit.json"),
            include_str!("../../validate/results/production_check/layer_check.json"),
        ];
        let mut worst: f64 = 0.0;
        for (f, text) in files.iter().enumerate() {
            let runs: Vec<serde_json::Value> = serde_json::from_str(text).unwrap();
            for r in runs {
                let docs: Vec<u32> = r["docs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| d.as_u64().unwrap() as u32)
                    .collect();
                let mask = r["mask"].as_str().unwrap_or("causal");
                let m = c.for_mask(crate::cost::Mask::parse(mask, "mask").unwrap());
                let lt = m.layer_time(&docs);
                let ms = |v: &serde_json::Value| v[0].as_f64().unwrap();
                let prof = |k: &str| r["profile_fwd_bwd"][k]["us"].as_f64().unwrap() * 1e-3;
                let (fwd, fb) = (ms(&r["fwd_ms"]), ms(&r["fwd_bwd_ms"]));
                let err = |p: f64, m: f64| 100.0 * (p - m) / m;
                let (p_fwd, p_fb) = (lt.fwd() * 1e-9, lt.fwd_bwd() * 1e-9);
                println!(
                    "file {f} tokens {} {mask}: fwd {p_fwd:.2}/{fwd:.2} ({:+.1} %), fwd+bwd {p_fb:.2}/{fb:.2} ({:+.1} %); gemm {:.2}/{:.2} ({:+.1} %), attention {:.2}/{:.2} ({:+.1} %), elementwise {:.2}/{:.2} ({:+.1} %)",
                    r["tokens"],
                    err(p_fwd, fwd),
                    err(p_fb, fb),
                    (lt.gemm_fwd + lt.gemm_bwd) * 1e-9,
                    prof("gemm"),
                    err((lt.gemm_fwd + lt.gemm_bwd) * 1e-9, prof("gemm")),
                    (lt.attn_fwd + lt.attn_bwd) * 1e-9,
                    prof("attention"),
                    err((lt.attn_fwd + lt.attn_bwd) * 1e-9, prof("attention")),
                    (lt.elem_fwd + lt.elem_bwd) * 1e-9,
                    prof("other"),
                    err((lt.elem_fwd + lt.elem_bwd) * 1e-9, prof("other")),
                );
                worst = worst.max(err(p_fb, fb).abs());
            }
        }
        println!("worst fwd+bwd error {worst:.1} %");
        assert!(worst < 25.0, "{worst}");
    }
}
