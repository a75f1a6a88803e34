//! The importer on the committed H200 profiler trace (traces/h200_sdpa_flash_fwd.json, made by
//! validate/scripts/torch_profile_trace.py: 3 shapes × 3 causal SDPA-flash calls).

use validate::trace::parse_kernels;

const TRACE: &str = include_str!("../../traces/h200_sdpa_flash_fwd.json");

#[test]
fn committed_trace_yields_the_nine_flash_kernels_with_their_shapes() {
    let ks = parse_kernels(TRACE, "flash_fwd").expect("trace parses");
    assert_eq!(ks.len(), 9, "3 shapes x 3 iterations");
    // Launch order = script order: (b, l, h) = (8, 512, 8), (2, 4096, 8), (1, 8192, 32).
    let want = [[8, 512, 8, 128], [2, 4096, 8, 128], [1, 8192, 32, 128]];
    for (i, k) in ks.iter().enumerate() {
        assert_eq!(
            k.op.as_deref(),
            Some("aten::_flash_attention_forward"),
            "{k:?}"
        );
        assert_eq!(k.input_dims[0], want[i / 3].to_vec());
        assert!(k.dur_us > 0.0);
    }
    // Durations in the file (µs): the first 512-token call took 33.248 µs.
    assert_eq!(ks[0].dur_us, 33.248);
    // Achieved rate of each kernel from the joined shape and duration must be a physical one
    // for an H200 (dense bf16 peak ~990 TFLOP/s), and the long documents must run faster per
    // FLOP than the 512-token ones, the shape the reference CSV shows.
    let tf: Vec<f64> = ks
        .iter()
        .map(|k| k.causal_flash_fwd_flops().expect("flash fwd shape") / (k.dur_us * 1e-6) / 1e12)
        .collect();
    for t in &tf {
        assert!((20.0..990.0).contains(t), "{tf:?}");
    }
    let mean = |s: &[f64]| s.iter().sum::<f64>() / s.len() as f64;
    assert!(mean(&tf[6..9]) > 1.5 * mean(&tf[0..3]), "{tf:?}");
    // Other kernels are there too but filtered out.
    assert!(parse_kernels(TRACE, "").expect("parses").len() >= 9);
}
