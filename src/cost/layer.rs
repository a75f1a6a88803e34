//! One transformer layer of a dense model on one GPU (TP 1), forward and backward, over a
//! packed batch of documents: its GEMMs (the GEMM model, else FLOPs at the GEMM
//! efficiencies), its core attention (one varlen call over the documents, the kernel
//! profile's block models) and its elementwise kernels — the three parts a profiler
//! separates, each priced by this cost model alone.
//!
//! Elementwise kernels: what an unfused layer runs between its GEMMs and its attention
//! (each piece's [`CostModel::piece_elems`]: two RMSNorms, RoPE on the split QKV output, two
//! residual adds, SwiGLU; the backward the same kinds' gradients, the adds as the gradient
//! sums), each priced by the elementwise model ([`elementwise`]: measured per kind), else as
//! its counted bytes at `hbm_bytes_per_s`.

use super::elementwise;
use super::{CostModel, LinearPiece};

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
            elem_fwd: self.elementwise_ps(tokens, false),
            elem_bwd: self.elementwise_ps(tokens, true),
        }
    }

    /// The model's widths as the elementwise kernels see them (an MoE layer: no dense MLP).
    pub(crate) fn elem_dims(&self) -> elementwise::Dims {
        let m = &self.model;
        let d = f64::from(m.head_dim);
        elementwise::Dims {
            hidden: f64::from(m.hidden),
            q: f64::from(m.heads_q) * d,
            k: f64::from(m.heads_kv) * d,
            mlp: match m.ffn {
                super::Ffn::Dense { intermediate } => f64::from(intermediate),
                super::Ffn::Moe { .. } => 0.0,
            },
            dtype_bytes: f64::from(m.dtype_bytes),
        }
    }

    /// The layer's elementwise kernels over `tokens` tokens, one pass, ps: every kind of
    /// every piece ([`CostModel::piece_elems`]), each by [`CostModel::elem_ps`].
    fn elementwise_ps(&self, tokens: u64, bwd: bool) -> f64 {
        [LinearPiece::Qkv, LinearPiece::OutProj, LinearPiece::Ffn]
            .iter()
            .flat_map(|&p| self.piece_elems(p))
            .map(|&k| self.elem_ps(k, bwd, tokens))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use crate::cost::elementwise::{self, ElemKind, ElementwiseModel};
    use crate::cost::gemm::GemmModel;
    use crate::cost::profile::Kernel;
    use crate::cost::{CostModel, ModelConfig};

    /// The default pricing (torch-flash profile, the H200 GEMM and elementwise models) of
    /// llama3-8b.
    fn default_model() -> CostModel {
        let c = Kernel::TorchFlash.calibration_for(128).unwrap();
        CostModel::calibrated(ModelConfig::builtin("llama3-8b").unwrap(), &c, "t")
            .unwrap()
            .with_gemm(GemmModel::h200_default().unwrap())
            .with_elementwise(ElementwiseModel::h200_default().unwrap())
    }

    /// The parts by hand: the GEMMs are the GEMM model's seven shapes (and their input and
    /// weight gradients), attention the cost model's whole-document calls, the elementwise
    /// kernels the elementwise model's kinds (without it: the counted bytes at the HBM rate).
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
        let e = c.elementwise.clone().unwrap();
        let d = c.elem_dims();
        let kind = |k, n: f64, bwd| n * e.time_ps(k, bwd, &d, t);
        for bwd in [false, true] {
            let want = kind(ElemKind::RmsNorm, 2.0, bwd)
                + kind(ElemKind::Rope, 1.0, bwd)
                + kind(ElemKind::SwiGlu, 1.0, bwd)
                + kind(ElemKind::Add, 2.0, bwd);
            let got = if bwd { lt.elem_bwd } else { lt.elem_fwd };
            assert!((got - want).abs() < 1.0, "{got} vs {want}");
        }
        assert!(lt.fwd_bwd() > lt.fwd() && lt.elem_bwd > lt.elem_fwd);
        // Without the elementwise model: forward (10 · 4096 + 9 · 5120 + 5 · 14336)
        // elements × 2 bytes per token at the HBM rate.
        let plain = CostModel {
            elementwise: None,
            ..c.clone()
        };
        let bytes = 8192.0 * (10.0 * 4096.0 + 9.0 * 5120.0 + 5.0 * 14336.0) * 2.0;
        let lp = plain.layer_time(&[4096, 3000, 1096]);
        assert!((lp.elem_fwd - bytes / c.hw.hbm_bytes_per_s * 1e12).abs() < 1.0);
        assert_eq!(
            elementwise::bytes(ElemKind::Add, true, &d, 1),
            3.0 * 4096.0 * 2.0
        );
    }

    /// The step's linear blocks carry the layer's GEMMs and every elementwise kernel, each
    /// priced by the elementwise model; without it, their RMSNorms alone at the HBM rate.
    #[test]
    fn linear_blocks_carry_the_layers_elementwise_kernels() {
        use crate::cost::LinearPart::{PostAttn, PreAttn};
        let c = default_model();
        let t = 8192u64;
        let lt = c.layer_time(&[4096, 3000, 1096]);
        let fwd = c.linear_fwd_ps_f(PreAttn, t) + c.linear_fwd_ps_f(PostAttn, t);
        assert!(
            (fwd - (lt.gemm_fwd + lt.elem_fwd)).abs() < 1.0,
            "{fwd} vs {lt:?}"
        );
        let bwd = (c.linear_bwd_ps(PreAttn, t) + c.linear_bwd_ps(PostAttn, t)) as f64;
        assert!(
            (bwd - (lt.gemm_bwd + lt.elem_bwd)).abs() < 2.0,
            "{bwd} vs {lt:?}"
        );
        let plain = CostModel {
            elementwise: None,
            ..c.clone()
        };
        let norm = elementwise::bytes(ElemKind::RmsNorm, false, &c.elem_dims(), t)
            / c.hw.hbm_bytes_per_s
            * 1e12;
        let pf = plain.linear_fwd_ps_f(PreAttn, t) + plain.linear_fwd_ps_f(PostAttn, t);
        assert!((pf - (lt.gemm_fwd + 2.0 * norm)).abs() < 1.0, "{pf}");
    }

    /// The built-in H200 models are the fits to the grids timed with the GPU queue fed, as
    /// `validate/results/fed_run/refit/` keeps them (the torch-flash profiles, the elementwise
    /// model, the GEMM model with the power cap; BENCHMARKS.md, "Attention placement and GEMM
    /// clocks"): the shipped files are those fits, byte for byte.
    #[test]
    fn the_built_in_models_are_the_fed_refits() {
        let pairs = [
            (
                include_str!("../../calibrations/torch-flash-d128.json"),
                include_str!("../../validate/results/fed_run/refit/torch-flash-d128.json"),
            ),
            (
                include_str!("../../calibrations/torch-flash-d64.json"),
                include_str!("../../validate/results/fed_run/refit/torch-flash-d64.json"),
            ),
            (
                include_str!("../../calibrations/elementwise-h200.json"),
                include_str!("../../validate/results/fed_run/refit/elementwise-h200.json"),
            ),
            (
                include_str!("../../calibrations/gemm-h200.json"),
                include_str!("../../validate/results/fed_run/refit/gemm-h200-capped.json"),
            ),
        ];
        for (i, (shipped, fit)) in pairs.iter().enumerate() {
            assert_eq!(shipped, fit, "built-in model {i}");
        }
    }

    /// The measured llama3-8b layers (`validate/torch/torch_grid.py`'s layer on one H200:
    /// the fit runs' batches and held-out runs', drawn by their printed seeds; none of them
    /// fitted anything the pricing uses) against a pricing, part by part (the profiler's
    /// kernel times; where a run timed them, the GEMMs and attention call alone) and whole
    /// (CUDA events, fwd+bwd): the runs timed one call at a time, and those timed with the
    /// queue fed (`heldout_run`). The built-in pricing is within the 5 % target on the
    /// fed runs and within −7.8 % on the others (BENCHMARKS.md, "Attention placement and GEMM
    /// clocks").
    #[test]
    fn measured_layers() {
        let per_call = [
            include_str!("../../validate/results/torch_fit/layer.json"),
            include_str!("../../validate/results/production_fit/layer_fit.json"),
            include_str!("../../validate/results/production_check/layer_check.json"),
            include_str!("../../validate/results/layer_run/layer_fit.json"),
            include_str!("../../validate/results/layer_run/layer_check.json"),
        ];
        let fed = [
            include_str!("../../validate/results/heldout_run/layer_fit.json"),
            include_str!("../../validate/results/heldout_run/layer_check.json"),
        ];
        let d = default_model();
        let w = layer_errors(&d, &fed);
        assert!(w < 5.0, "{w}");
        // The runs timed one call at a time carry each call's host dispatch (the forward
        // attention call alone took 1.18–1.25× the fed figure): bounded, not a target.
        let w = layer_errors(&d, &per_call);
        assert!(w < 8.5, "{w}");
    }

    /// Print each measured batch of `files` against `c`'s pricing; the worst fwd+bwd error, %.
    fn layer_errors(c: &CostModel, files: &[&str]) -> f64 {
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
                // The same GEMMs and attention call timed alone, where the run did.
                if let Some(g) = r["gemm_isolated_ms"].as_object() {
                    let alone: f64 = g
                        .values()
                        .flat_map(|p| p.as_object().unwrap().values())
                        .map(|v| v.as_f64().unwrap())
                        .sum();
                    let p = (lt.gemm_fwd + lt.gemm_bwd) * 1e-9;
                    println!(
                        "    GEMMs alone {alone:.2} ms: predicted {:+.1} %, in the layer {:+.1} %",
                        err(p, alone),
                        err(prof("gemm"), alone)
                    );
                }
                if let Some(a) = r["attn_isolated_ms"].as_object() {
                    let (f, b) = (a["fwd"].as_f64().unwrap(), a["bwd"].as_f64().unwrap());
                    println!(
                        "    attention alone fwd {f:.2} / bwd {b:.2} ms: predicted {:+.1} / {:+.1} %",
                        err(lt.attn_fwd * 1e-9, f),
                        err(lt.attn_bwd * 1e-9, b)
                    );
                }
                worst = worst.max(err(p_fb, fb).abs());
            }
        }
        println!("worst fwd+bwd error {worst:.1} %");
        worst
    }
}
