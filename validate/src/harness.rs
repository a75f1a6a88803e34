//! Correctness checks, speed benchmark and jitter measurement of the forward kernel.
//!
//! Inputs are fresh random bf16 values from a seeded stream (the seed is printed so a failing
//! check can be replayed); outputs are poisoned before each launch and must be fully written.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::bf16;
use crate::error::Error;
use crate::gpu::{FwdBuffers, FwdVariant, Gpu};
use crate::reference::{attention, rel_l2};
use crate::stats::Jitter;
use crate::units::{Batch, Heads, Layout, WorkUnit};

/// Error bound of the correctness check (bf16 operands, fp32 accumulation).
pub const MAX_REL_L2: f64 = 1e-2;

/// Random bf16 words uniform in [-1, 1).
pub fn random_bf16(n: usize, rng: &mut ChaCha8Rng) -> Vec<u16> {
    (0..n)
        .map(|_| bf16::from_f32(rng.random_range(-1.0f32..1.0)))
        .collect()
}

/// One correctness case.
#[derive(Clone, Debug)]
pub struct CheckCase {
    pub name: &'static str,
    pub batch: Batch,
    pub heads: Heads,
}

/// The shapes the correctness check covers: whole documents of odd lengths, suffix units with
/// bottom-right alignment sharing a sample's KV, GQA ratios 1/4/8, head dims 64 and 128.
pub fn check_cases() -> Result<Vec<CheckCase>, Error> {
    let u = |sample, a, e| WorkUnit { sample, a, e };
    Ok(vec![
        CheckCase {
            name: "docs-d128-mha",
            batch: Batch::documents(&[1, 17, 64, 200, 513]),
            heads: Heads::new(4, 4, 128)?,
        },
        CheckCase {
            name: "units-d128-gqa4",
            batch: Batch {
                sample_lens: vec![700, 130],
                units: vec![u(0, 0, 100), u(0, 100, 389), u(0, 389, 700), u(1, 5, 130)],
            },
            heads: Heads::new(8, 2, 128)?,
        },
        CheckCase {
            name: "units-d64-gqa8",
            batch: Batch {
                sample_lens: vec![300, 1000],
                units: vec![u(0, 0, 300), u(1, 640, 1000), u(1, 3, 67)],
            },
            heads: Heads::new(8, 1, 64)?,
        },
        CheckCase {
            name: "docs-d64-mha",
            batch: Batch::documents(&[128, 255, 1]),
            heads: Heads::new(2, 2, 64)?,
        },
    ])
}

/// Result of one correctness case.
#[derive(Clone, Debug)]
pub struct CheckResult {
    pub case: String,
    pub variant: String,
    pub rel_l2_out: f64,
    pub rel_l2_lse: f64,
    pub unwritten: usize,
}

impl CheckResult {
    pub fn passed(&self) -> bool {
        self.unwritten == 0 && self.rel_l2_out < MAX_REL_L2 && self.rel_l2_lse < MAX_REL_L2
    }
}

/// Runs one case on the GPU against the f64 reference.
pub fn check_case(
    gpu: &mut Gpu,
    case: &CheckCase,
    var: FwdVariant,
    seed: u64,
) -> Result<CheckResult, Error> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let var = FwdVariant {
        head_dim: case.heads.head_dim,
        ..var
    };
    let layout = Layout::new(&case.batch, var.block_m())?;
    let d = case.heads.head_dim as usize;
    let q = random_bf16(layout.q_rows * case.heads.h_q as usize * d, &mut rng);
    let k = random_bf16(layout.kv_rows * case.heads.h_kv as usize * d, &mut rng);
    let v = random_bf16(layout.kv_rows * case.heads.h_kv as usize * d, &mut rng);
    let scale = 1.0 / (d as f64).sqrt();
    let mut buf = gpu.upload(&layout, case.heads, &q, &k, &v)?;
    gpu.launch_fwd(var, case.heads, &mut buf, scale as f32)?;
    gpu.sync()?;
    let (o, lse) = gpu.download(&buf)?;
    let want = attention(&case.batch, &layout, case.heads, &q, &k, &v, scale)?;
    let got_o: Vec<f64> = o.iter().map(|&h| f64::from(bf16::to_f32(h))).collect();
    let got_l: Vec<f64> = lse.iter().map(|&x| f64::from(x)).collect();
    let unwritten = got_o.iter().chain(&got_l).filter(|x| x.is_nan()).count();
    Ok(CheckResult {
        case: case.name.to_string(),
        variant: var.label(),
        rel_l2_out: rel_l2(&got_o, &want.out),
        rel_l2_lse: rel_l2(&got_l, &want.lse),
        unwritten,
    })
}

/// Result of one backward correctness case.
#[derive(Clone, Debug)]
pub struct BwdCheckResult {
    pub case: String,
    pub rel_l2_dq: f64,
    pub rel_l2_dk: f64,
    pub rel_l2_dv: f64,
    pub unwritten_dq: usize,
}

impl BwdCheckResult {
    pub fn passed(&self) -> bool {
        self.unwritten_dq == 0
            && self.rel_l2_dq < MAX_REL_L2
            && self.rel_l2_dk < MAX_REL_L2
            && self.rel_l2_dv < MAX_REL_L2
    }
}

/// Runs forward then backward on the GPU and compares dQ, dK, dV with the f64 reference.
pub fn check_bwd_case(gpu: &mut Gpu, case: &CheckCase, seed: u64) -> Result<BwdCheckResult, Error> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let var = FwdVariant::v1(case.heads.head_dim, 4);
    let layout = Layout::new(&case.batch, 64)?;
    let key_tiles = layout.key_tiles(&case.batch, 64)?;
    let d = case.heads.head_dim as usize;
    let q = random_bf16(layout.q_rows * case.heads.h_q as usize * d, &mut rng);
    let k = random_bf16(layout.kv_rows * case.heads.h_kv as usize * d, &mut rng);
    let v = random_bf16(layout.kv_rows * case.heads.h_kv as usize * d, &mut rng);
    let dout = random_bf16(q.len(), &mut rng);
    let scale = 1.0 / (d as f64).sqrt();
    let mut buf = gpu.upload(&layout, case.heads, &q, &k, &v)?;
    gpu.launch_fwd(var, case.heads, &mut buf, scale as f32)?;
    let g = gpu.backward(case.heads, &layout, &key_tiles, &buf, &dout, scale as f32)?;
    let want = crate::reference::attention_bwd(
        &case.batch,
        &layout,
        case.heads,
        &q,
        &k,
        &v,
        &dout,
        scale,
    )?;
    let f = |x: &[f32]| -> Vec<f64> { x.iter().map(|&y| f64::from(y)).collect() };
    Ok(BwdCheckResult {
        case: case.name.to_string(),
        rel_l2_dq: rel_l2(&f(&g.dq), &want.dq),
        rel_l2_dk: rel_l2(&f(&g.dk), &want.dk),
        rel_l2_dv: rel_l2(&f(&g.dv), &want.dv),
        unwritten_dq: g.dq.iter().filter(|x| x.is_nan()).count(),
    })
}

/// As [`check_bwd_case`], through the reusable plan-scale buffers that `skewsim validate`
/// uses: one upload of a larger batch (a single document of more rows than the case needs,
/// the case's Q, K, V as its first rows), [`Gpu::alloc_bwd_within`] (dO = Q), a backward on
/// that whole document first, then the case's layout over the first rows
/// ([`Gpu::set_layout_within`], [`Gpu::set_bwd_layout`]) with dQ poisoned, compared with the
/// f64 reference (dO = Q).
pub fn check_bwd_within_case(
    gpu: &mut Gpu,
    case: &CheckCase,
    seed: u64,
) -> Result<BwdCheckResult, Error> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let var = FwdVariant::v1(case.heads.head_dim, 4);
    let layout = Layout::new(&case.batch, 64)?;
    let key_tiles = layout.key_tiles(&case.batch, 64)?;
    let d = case.heads.head_dim as usize;
    let rows = u32::try_from(layout.q_rows.max(layout.kv_rows) + 77)
        .map_err(|_| crate::error::invalid("rows", layout.q_rows, "< 2^32"))?;
    let big = Batch::documents(&[rows]);
    let big_layout = Layout::new(&big, 64)?;
    let big_keys = big_layout.key_tiles(&big, 64)?;
    let n_q = rows as usize * case.heads.h_q as usize * d;
    let n_kv = rows as usize * case.heads.h_kv as usize * d;
    let q = random_bf16(n_q, &mut rng);
    let k = random_bf16(n_kv, &mut rng);
    let v = random_bf16(n_kv, &mut rng);
    let scale = 1.0 / (d as f64).sqrt();
    let mut buf = gpu.upload(&big_layout, case.heads, &q, &k, &v)?;
    let mut g = gpu.alloc_bwd_within(&buf, case.heads.head_dim)?;
    // The whole document first: leaves non-zero dK/dV and key tiles behind.
    gpu.set_bwd_layout(&mut g, &big_layout, &big_keys, case.heads)?;
    gpu.launch_fwd(var, case.heads, &mut buf, scale as f32)?;
    gpu.launch_bwd(case.heads, &buf, &mut g, scale as f32)?;
    gpu.sync()?;
    // Then the case over the first rows.
    gpu.set_layout_within(&mut buf, &layout, case.heads, false)?;
    gpu.set_bwd_layout(&mut g, &layout, &key_tiles, case.heads)?;
    gpu.poison(&mut buf)?;
    gpu.poison_dq(&mut g)?;
    gpu.launch_fwd(var, case.heads, &mut buf, scale as f32)?;
    gpu.launch_bwd(case.heads, &buf, &mut g, scale as f32)?;
    gpu.sync()?;
    let got = gpu.download_bwd_used(&g)?;
    let (nq, nkv) = (
        layout.q_rows * case.heads.h_q as usize * d,
        layout.kv_rows * case.heads.h_kv as usize * d,
    );
    let want = crate::reference::attention_bwd(
        &case.batch,
        &layout,
        case.heads,
        &q[..nq],
        &k[..nkv],
        &v[..nkv],
        &q[..nq],
        scale,
    )?;
    let f = |x: &[f32]| -> Vec<f64> { x.iter().map(|&y| f64::from(y)).collect() };
    Ok(BwdCheckResult {
        case: format!("{} (within)", case.name),
        rel_l2_dq: rel_l2(&f(&got.dq), &want.dq),
        rel_l2_dk: rel_l2(&f(&got.dk), &want.dk),
        rel_l2_dv: rel_l2(&f(&got.dv), &want.dv),
        unwritten_dq: got.dq.iter().filter(|x| x.is_nan()).count(),
    })
}

/// One benchmark row.
#[derive(Clone, Debug)]
pub struct BenchRow {
    pub kernel: String,
    pub heads: u32,
    pub h_kv: u32,
    pub doc_len: u32,
    pub total_tokens: u32,
    pub head_dim: u32,
    pub median_ms: f64,
    pub tflops: f64,
    pub jitter: Jitter,
}

impl BenchRow {
    pub const CSV_HEADER: &'static str =
        "kernel,heads,h_kv,doc_len,total_tokens,head_dim,median_ms,tflops,p90_factor,max_factor";
    pub fn csv(&self) -> String {
        format!(
            "{},{},{},{},{},{},{:.4},{:.1},{:.4},{:.4}",
            self.kernel,
            self.heads,
            self.h_kv,
            self.doc_len,
            self.total_tokens,
            self.head_dim,
            self.median_ms,
            self.tflops,
            self.jitter.p90,
            self.jitter.max
        )
    }
}

/// Times the backward pass on `total / doc_len` documents (after one forward launch that writes
/// O and LSE); FLOPs counted as 2.5× the forward's (five matrix products instead of two).
#[allow(clippy::too_many_arguments)]
pub fn bench_bwd_docs(
    gpu: &mut Gpu,
    buf: &mut FwdBuffers,
    heads: Heads,
    total: u32,
    doc_len: u32,
    warmup: usize,
    reps: usize,
    seed: u64,
) -> Result<BenchRow, Error> {
    let var = FwdVariant::v1(heads.head_dim, 4);
    let batch = Batch::equal_documents(total, doc_len)?;
    let layout = Layout::new(&batch, 64)?;
    let key_tiles = layout.key_tiles(&batch, 64)?;
    gpu.set_layout(buf, &layout, heads)?;
    let scale = 1.0 / (heads.head_dim as f32).sqrt();
    gpu.launch_fwd(var, heads, buf, scale)?;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let dout = random_bf16(buf.q.len(), &mut rng);
    let mut g = gpu.alloc_bwd(heads, &layout, &key_tiles, buf, &dout)?;
    let ms = gpu.time_bwd(heads, buf, &mut g, scale, warmup, reps)?;
    let grads = gpu.download_bwd(&g)?;
    let bad = grads
        .dq
        .iter()
        .chain(&grads.dk)
        .chain(&grads.dv)
        .filter(|x| !x.is_finite())
        .count();
    if bad > 0 {
        return Err(Error::CheckFailed(format!(
            "bwd: {bad} gradient elements unwritten or non-finite at doc_len {doc_len}"
        )));
    }
    let jitter = Jitter::from_times(&ms)
        .ok_or_else(|| Error::CheckFailed(format!("no valid timings for doc_len {doc_len}")))?;
    Ok(BenchRow {
        kernel: format!("bwd-v1-d{}", heads.head_dim),
        heads: heads.h_q,
        h_kv: heads.h_kv,
        doc_len,
        total_tokens: total,
        head_dim: heads.head_dim,
        median_ms: jitter.median_ms,
        tflops: 2.5 * batch.flops(heads) / (jitter.median_ms * 1e-3) / 1e12,
        jitter,
    })
}

/// Random inputs for up to `q_rows` query rows and `kv_rows` key rows (buffers reused by
/// [`bench_units`] for many smaller batches).
pub fn upload_random_rows(
    gpu: &Gpu,
    heads: Heads,
    q_rows: u32,
    kv_rows: u32,
    seed: u64,
) -> Result<FwdBuffers, Error> {
    if q_rows == 0 || q_rows > kv_rows {
        return Err(crate::error::invalid(
            "q_rows",
            q_rows,
            format!("1..={kv_rows} (kv_rows)"),
        ));
    }
    let batch = Batch {
        sample_lens: vec![kv_rows],
        units: vec![WorkUnit {
            sample: 0,
            a: kv_rows - q_rows,
            e: kv_rows,
        }],
    };
    let layout = Layout::new(&batch, 64)?;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let d = heads.head_dim as usize;
    let q = random_bf16(layout.q_rows * heads.h_q as usize * d, &mut rng);
    let k = random_bf16(layout.kv_rows * heads.h_kv as usize * d, &mut rng);
    let v = random_bf16(layout.kv_rows * heads.h_kv as usize * d, &mut rng);
    gpu.upload(&layout, heads, &q, &k, &v)
}

/// Times one launch of `batch` over the first rows of `buf` (median of `reps` after
/// `warmup`); checks the batch's output rows are fully written. Returns (median ms, TFLOP/s).
#[allow(clippy::too_many_arguments)]
pub fn bench_units(
    gpu: &mut Gpu,
    buf: &mut FwdBuffers,
    var: FwdVariant,
    heads: Heads,
    batch: &Batch,
    warmup: usize,
    reps: usize,
) -> Result<(f64, f64), Error> {
    let layout = Layout::new(batch, var.block_m())?;
    gpu.set_layout_within(buf, &layout, heads, false)?;
    gpu.poison(buf)?;
    let scale = 1.0 / (var.head_dim as f32).sqrt();
    let ms = gpu.time_fwd(var, heads, buf, scale, warmup, reps)?;
    let (o, _) = gpu.download(buf)?;
    let used = layout.q_rows * heads.h_q as usize * heads.head_dim as usize;
    let unwritten = o
        .iter()
        .take(used)
        .filter(|&&h| bf16::to_f32(h).is_nan())
        .count();
    if unwritten > 0 {
        return Err(Error::CheckFailed(format!(
            "{}: {unwritten} output elements unwritten or NaN",
            var.label()
        )));
    }
    let med = crate::stats::quantile(&ms, 0.5)
        .ok_or_else(|| Error::CheckFailed("no valid timings".into()))?;
    Ok((med, batch.flops(heads) / (med * 1e-3) / 1e12))
}

/// Random inputs for `total` tokens of `heads`, uploaded once and reused across document
/// lengths (the buffers' token count does not depend on how the tokens are cut into documents).
pub fn upload_random(
    gpu: &Gpu,
    heads: Heads,
    total: u32,
    block_m: u32,
    seed: u64,
) -> Result<FwdBuffers, Error> {
    let layout = Layout::new(&Batch::documents(&[total]), block_m)?;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let d = heads.head_dim as usize;
    let q = random_bf16(layout.q_rows * heads.h_q as usize * d, &mut rng);
    let k = random_bf16(layout.kv_rows * heads.h_kv as usize * d, &mut rng);
    let v = random_bf16(layout.kv_rows * heads.h_kv as usize * d, &mut rng);
    gpu.upload(&layout, heads, &q, &k, &v)
}

/// Times the kernel on `total / doc_len` documents of `doc_len` tokens over the inputs in `buf`
/// (median of `reps` event-timed launches after `warmup`), checking the output is fully written.
#[allow(clippy::too_many_arguments)]
pub fn bench_docs(
    gpu: &mut Gpu,
    buf: &mut FwdBuffers,
    var: FwdVariant,
    heads: Heads,
    total: u32,
    doc_len: u32,
    warmup: usize,
    reps: usize,
) -> Result<(BenchRow, Vec<f64>), Error> {
    let batch = Batch::equal_documents(total, doc_len)?;
    bench_batch(gpu, buf, var, heads, &batch, doc_len, warmup, reps)
}

/// Times the kernel on `batch` (whose Q and K/V row counts must match `buf`); `doc_len` is only
/// the label of the row.
#[allow(clippy::too_many_arguments)]
pub fn bench_batch(
    gpu: &mut Gpu,
    buf: &mut FwdBuffers,
    var: FwdVariant,
    heads: Heads,
    batch: &Batch,
    doc_len: u32,
    warmup: usize,
    reps: usize,
) -> Result<(BenchRow, Vec<f64>), Error> {
    let total = batch.sample_lens.iter().sum::<u32>();
    let layout = Layout::new(batch, var.block_m())?;
    gpu.set_layout(buf, &layout, heads)?;
    gpu.poison(buf)?;
    let scale = 1.0 / (var.head_dim as f32).sqrt();
    let ms = gpu.time_fwd(var, heads, buf, scale, warmup, reps)?;
    let (o, lse) = gpu.download(buf)?;
    let unwritten = o.iter().filter(|&&h| bf16::to_f32(h).is_nan()).count()
        + lse.iter().filter(|x| x.is_nan()).count();
    if unwritten > 0 {
        return Err(Error::CheckFailed(format!(
            "{}: {unwritten} output elements unwritten or NaN at doc_len {doc_len}, heads {}",
            var.label(),
            heads.h_q
        )));
    }
    let jitter = Jitter::from_times(&ms)
        .ok_or_else(|| Error::CheckFailed(format!("no valid timings for doc_len {doc_len}")))?;
    let flops = batch.flops(heads);
    Ok((
        BenchRow {
            kernel: var.label(),
            heads: heads.h_q,
            h_kv: heads.h_kv,
            doc_len,
            total_tokens: total,
            head_dim: var.head_dim,
            median_ms: jitter.median_ms,
            tflops: flops / (jitter.median_ms * 1e-3) / 1e12,
            jitter,
        },
        ms,
    ))
}
