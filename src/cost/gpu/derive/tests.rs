use super::*;
use crate::cost::elementwise::ElementwiseModel;
use crate::cost::gemm::GemmModel;
use crate::cost::profile::Kernel;
use crate::cost::{CostModel, LinearPiece, ModelConfig};

fn gpu(name: &str) -> Gpu {
    Gpu::builtin("gpu", name).unwrap()
}

/// The default prices (`experiment::calfile::cost_model` without a file): the torch-flash
/// profile at the model's head_dim, the built-in GEMM and elementwise models.
fn measured(model: &str) -> CostModel {
    let m = ModelConfig::builtin(model).unwrap();
    let c = Kernel::TorchFlash.calibration_for(m.head_dim).unwrap();
    CostModel::calibrated(m, &c, "torch-flash")
        .unwrap()
        .with_gemm(GemmModel::h200_default().unwrap())
        .with_elementwise(ElementwiseModel::h200_default().unwrap())
}

#[test]
fn the_ratios_by_hand() {
    let s = Scaling::between(&gpu("h200"), &gpu("b200"));
    // (2250 / 148) / (989 / 132), 2250 / 989, 8000 / 4800.
    assert!((s.per_sm - (2250.0 / 148.0) / (989.0 / 132.0)).abs() < 1e-12);
    assert!((s.peak - 2250.0 / 989.0).abs() < 1e-12);
    assert!((s.hbm - 8000.0 / 4800.0).abs() < 1e-12);
    assert_eq!(s.sms, 148);
    // The H100 has the H200's SMs and peak: only the memory rate moves.
    let h = Scaling::between(&gpu("h200"), &gpu("h100"));
    assert_eq!((h.per_sm, h.peak, h.sms), (1.0, 1.0, 132));
    assert!((h.hbm - 3350.0 / 4800.0).abs() < 1e-12);
}

#[test]
fn every_model_is_derived_by_its_kind_of_term() {
    let base = measured("llama3-8b");
    let b = base.for_gpu(&gpu("b200")).unwrap();
    let s = b.derived.unwrap();
    let r = 2250.0 / 148.0 / (989.0 / 132.0);
    let (g0, g1) = (base.gemm.as_ref().unwrap(), b.gemm.as_ref().unwrap());
    // Main loop: the per-SM rate over 148 SMs; operands at 8/4.8 the rate; call terms kept.
    assert!((g1.tflops - g0.tflops / 132.0 * r * 148.0).abs() < 1e-9);
    assert!((g1.tflops - g0.tflops * 2250.0 / 989.0).abs() < 1e-9);
    assert!((g1.bytes_per_s - g0.bytes_per_s * 8000.0 / 4800.0).abs() < 1.0);
    assert_eq!(g1.sms, 148);
    assert_eq!(
        (g1.call_us, g1.floor_us, g1.sustain_us, &g1.tiles),
        (g0.call_us, g0.floor_us, g0.sustain_us, &g0.tiles)
    );
    // Forward blocks: key-loop steps faster by the per-SM ratio; the fixed parts kept.
    let (f0, f1) = (base.attn_blocks.unwrap(), b.attn_blocks.unwrap());
    assert!((f1.iter_ns - f0.iter_ns / r).abs() < 1e-9);
    assert!((f1.diag_ns - f0.diag_ns / r).abs() < 1e-9);
    assert!((f1.window_ns - f0.window_ns / r).abs() < 1e-9);
    assert_eq!(
        (f1.block_ns, f1.empty_ns, f1.sms),
        (f0.block_ns, f0.empty_ns, 148)
    );
    assert_eq!(
        (f1.pair_slowdown, f1.blocks_per_sm),
        (f0.pair_slowdown, f0.blocks_per_sm)
    );
    // Backward: steps by compute, the per-row·head term and the reduction by bandwidth.
    let (b0, b1) = (base.attn_bwd_blocks.unwrap(), b.attn_bwd_blocks.unwrap());
    assert!((b1.dkdv.iter_ns - b0.dkdv.iter_ns / r).abs() < 1e-9);
    assert_eq!(b1.dkdv.block_ns, b0.dkdv.block_ns);
    assert!((b1.row_head_ns - b0.row_head_ns * 4800.0 / 8000.0).abs() < 1e-12);
    assert!((b1.reduce_ps_per_byte - b0.reduce_ps_per_byte * 0.6).abs() < 1e-12);
    // Elementwise: rates by bandwidth, call terms kept.
    let (e0, e1) = (
        base.elementwise.as_ref().unwrap(),
        b.elementwise.as_ref().unwrap(),
    );
    for (k0, k1) in e0.kinds.iter().zip(&e1.kinds) {
        assert!((k1.bytes_per_s - k0.bytes_per_s * 8000.0 / 4800.0).abs() < 1.0);
        assert_eq!(k1.call_us, k0.call_us);
    }
    // The table by the whole-GPU peak ratio; launch terms kept; copies by bandwidth.
    let t = |c: &CostModel| c.attn_eff.tflops(8, 4096, 4096);
    assert!((t(&b) - t(&base) * s.peak).abs() < 1e-9);
    assert_eq!(b.launch.attn_launch_us, base.launch.attn_launch_us);
    assert!((b.launch.copy_bytes_per_s - base.launch.copy_bytes_per_s * s.hbm).abs() < 1.0);
    // The datasheet figures.
    assert_eq!(b.hw.peak_tflops, 2250.0);
    assert_eq!(b.hw.hbm_bytes_per_s, 8e12);
    assert_eq!(b.hw.memory_bytes, 180_000_000_000);
    // The measured-table ablation stays on the GPU.
    let bt = b.by_measured_table().unwrap();
    assert!((t(&bt) - t(&base.by_measured_table().unwrap()) * s.peak).abs() < 1e-9);
}

#[test]
fn the_h200_is_priced_by_the_measured_models_bit_for_bit() {
    let base = measured("llama3-8b");
    let h = base.for_gpu(&gpu("h200")).unwrap();
    assert!(h.derived.is_none());
    assert_eq!(h.hw, base.hw);
    assert_eq!(h.gemm, base.gemm);
    assert_eq!(h.attn_blocks, base.attn_blocks);
    assert_eq!(h.attn_bwd_blocks, base.attn_bwd_blocks);
    assert_eq!(h.elementwise, base.elementwise);
    let docs = [4096u32, 1000, 30000];
    assert_eq!(
        h.attn_fwd_ps_f(docs, 8).to_bits(),
        base.attn_fwd_ps_f(docs, 8).to_bits()
    );
    assert_eq!(
        h.piece_fwd_ps_f(LinearPiece::Ffn, 8192, 8192).to_bits(),
        base.piece_fwd_ps_f(LinearPiece::Ffn, 8192, 8192).to_bits()
    );
}

#[test]
fn a_compute_bound_gemm_scales_by_the_peak_and_a_memory_bound_one_by_bandwidth() {
    let base = measured("llama3-8b");
    let b = base.for_gpu(&gpu("b200")).unwrap();
    let (g0, g1) = (base.gemm.unwrap(), b.gemm.unwrap());
    // 8192³: 2,048 tiles of 128 × 256, 15.5 waves on 132 SMs and 13.8 on 148 (the partial
    // last wave moves the ratio by under 2 %); 1.3 ms on the H200, short of the power cap's
    // 2.5 ms (a longer call is capped for longer on the slower GPU, widening the ratio).
    let big = g0.time_ps(8192, 8192, 8192) / g1.time_ps(8192, 8192, 8192);
    assert!((big / (2250.0 / 989.0) - 1.0).abs() < 0.03, "{big}");
    // A skinny GEMM (M = 16) streams its K × N operand: HBM bound.
    let thin = g0.time_ps(16, 16384, 16384) / g1.time_ps(16, 16384, 16384);
    assert!((thin / (8000.0 / 4800.0) - 1.0).abs() < 0.03, "{thin}");
}

/// TFLOP/s of one M × N × K GEMM under `g`.
fn gemm_tflops(g: &GemmModel, (m, n, k): (u64, u64, u64)) -> f64 {
    2.0 * (m * n * k) as f64 / g.time_ps(m, n, k)
}

/// The derived models beside published kernel figures, printed as a table
/// (`cargo test --release --lib derived_models_against -- --nocapture`).
///
/// GEMMs: the "Maximum Achievable Matmul FLOPS" rows of stas00/ml-engineering
/// (compute/accelerator/README.md: the best cuBLAS(Lt) `matmul` of a shape search, mean of
/// 100 after 50 warm-up, at the shape it found), priced at that shape. The H200 row is the
/// measured model itself (the H100's row: "H200 is the same"): how far the model sits from
/// the published figure on the GPU it was fitted to (1.1 % low) is what a derived GPU can be
/// held to, plus the derivation's own error; the BF16 rows are held within 5 % (derived:
/// 1.6–3.0 % low). The FP8 rows price the BF16 model × the GPU file's FP8/BF16 ratio of the
/// same table, so they check the model at the FP8 rows' shapes, not the ratio: there the
/// model is 16 % low on the H200 itself (1280 × 4096 in the model's BF16 tiles is 2.4 waves
/// of 132 SMs, run as 3; cuBLASLt's FP8 kernels avoid that quantization), and the derived
/// rows sit within 5 points of that; held within 20 %.
///
/// Attention: one causal 16K-token forward over 16 heads of head_dim 128 (the
/// FlashAttention papers' benchmark shape). FlashAttention-2 on an H100 reaches about 35 %
/// of the 989 TFLOP/s peak (FlashAttention-3 paper, Shah et al. 2024, abstract) — the kernel
/// the H200 profile measured, on the same SMs: held within 10 % (derived: 6 % low; the 35 %
/// is a rounded figure over the paper's shapes). FlashAttention-3 (740 TFLOP/s, same abstract) and, on a B200,
/// FlashAttention-4 (1,613 TFLOP/s) and cuDNN 9.13 (1,613 / 1.3: FlashAttention-4 paper,
/// Zadouri et al. 2026, abstract) are other kernels: printed as the gap the derivation
/// leaves, held only below them.
#[test]
fn derived_models_against_published_kernel_figures() {
    let base = measured("llama3-8b");
    let mut rows = Vec::new();
    // (GPU, precision, shape, published TFLOP/s)
    let gemm_rows = [
        ("h200", false, (2048, 2048, 13312), 794.5),
        ("h100", false, (2048, 2048, 13312), 794.5),
        ("b200", false, (1792, 16128, 3072), 1745.0),
        ("gb200", false, (4096, 9728, 2048), 1822.0),
        ("h200", true, (1280, 4096, 12032), 1453.4),
        ("h100", true, (1024, 9216, 14336), 1402.6),
        ("b200", true, (15360, 4096, 3072), 3432.5),
        ("gb200", true, (19456, 5120, 1536), 3615.6),
    ];
    for (name, fp8, shape, published) in gemm_rows {
        let g = gpu(name);
        let c = base.for_gpu(&g).unwrap();
        let gm = c.gemm.clone().unwrap();
        let gm = if fp8 {
            gm.fp8(g.fp8_gemm_speedup().unwrap())
        } else {
            gm
        };
        let ours = gemm_tflops(&gm, shape);
        let what = format!(
            "{} GEMM {}x{}x{}",
            if fp8 { "fp8" } else { "bf16" },
            shape.0,
            shape.1,
            shape.2
        );
        let tol = if fp8 { 0.20 } else { 0.05 };
        rows.push((name, what, ours, published, "cuBLAS MAMF", Some(tol)));
    }
    let attn = |c: &CostModel| {
        let l = 16384u64;
        let flops = (l * (l + 1) / 2) as f64 * 16.0 * 4.0 * 128.0;
        flops / c.attn_fwd_ps_f([16384u32], 16)
    };
    for (name, published, source, tol) in [
        ("h100", 0.35 * 989.0, "FA2 on H100 (35 %)", Some(0.10)),
        ("h100", 740.0, "FA3 on H100", None),
        ("b200", 1613.0, "FA4 on B200", None),
        ("b200", 1613.0 / 1.3, "cuDNN 9.13 on B200", None),
    ] {
        let c = base.for_gpu(&gpu(name)).unwrap();
        rows.push((
            name,
            "attn fwd causal 16K h16 d128".into(),
            attn(&c),
            published,
            source,
            tol,
        ));
    }
    println!("| GPU | work | derived TFLOP/s | published | source | derived/published |");
    println!("|---|---|---:|---:|---|---:|");
    for (name, what, ours, published, source, _) in &rows {
        println!(
            "| {name} | {what} | {ours:.0} | {published:.0} | {source} | {:.3} |",
            ours / published
        );
    }
    for (name, what, ours, published, source, tol) in &rows {
        match tol {
            Some(t) => assert!(
                (ours / published - 1.0).abs() <= *t,
                "{name} {what}: {ours:.0} against {source}'s {published:.0}"
            ),
            // Another kernel: an FA2-class kernel scaled by peak stays below it.
            None => assert!(
                ours < published,
                "{name} {what}: {ours:.0} ≥ {published:.0}"
            ),
        }
    }
}

/// Llama 3.1 405B's shape (huggingface.co/meta-llama/Llama-3.1-405B, config.json: hidden
/// 16384, 126 layers, 128 query and 8 KV heads, MLP 53248, vocabulary 128256).
const LLAMA_405B: &str = r#"
name = "llama3.1-405b"
layers = 126
hidden = 16384
heads_q = 128
heads_kv = 8
head_dim = 128
vocab = 128256
tie_embeddings = false
dtype_bytes = 2

[ffn]
kind = "dense"
intermediate = 53248
"#;

#[test]
fn the_memory_limit_is_the_gpu_files() {
    use crate::schedule::step::{stage_layers, stage_rank_memory};
    use crate::schedule::Parallelism;
    let m = ModelConfig::from_toml_str(LLAMA_405B, "405b").unwrap();
    let h200 = CostModel::h200(m).unwrap();
    let gb200 = h200.for_gpu(&gpu("gb200")).unwrap();
    assert_eq!(h200.hw.memory_bytes, 141_000_000_000);
    assert_eq!(gb200.hw.memory_bytes, 186_000_000_000);
    // The first stage of TP 8 × PP 16 × DP 8, ZeRO-1, 16 micro-batches of 16K tokens in
    // flight under 1F1B, no recomputation: 8 layers of one TP rank.
    let par = Parallelism {
        tp: 8,
        zero_stage: 1,
        ..Parallelism::plain(8, 16, 1, 16)
    };
    let shard = h200.tp_shard(8, 1).unwrap();
    let split = crate::cost::head_split(shard.model.heads_q, shard.model.heads_kv, 1).unwrap();
    let stage = stage_layers(126, 16);
    let need = stage_rank_memory(&shard, par, &stage, 0, split, 16384).total();
    let gb = need as f64 / 1e9;
    assert!(
        need > h200.hw.memory_bytes && need <= gb200.hw.memory_bytes,
        "{gb:.1} GB"
    );
    // The same rank, priced for the GB200, is the same bytes: only the limit moved.
    let on_gb200 = gb200.tp_shard(8, 1).unwrap();
    assert_eq!(
        stage_rank_memory(&on_gb200, par, &stage, 0, split, 16384).total(),
        need
    );
}
