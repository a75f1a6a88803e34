//! Float64 CPU reference of causal attention over work units, and the error measures the
//! correctness checks use.
//!
//! softmax(q·kᵀ·scale) v over keys `j <= p` of the unit's sample, computed in f64 from the same
//! bf16 inputs the kernel reads (so the only error measured is the kernel's own arithmetic).

use crate::bf16;
use crate::error::{invalid, Error};
use crate::units::{Batch, Heads, Layout};

/// Reference outputs: O `[q_rows, h_q, d]` and the natural-log softmax normaliser LSE `[q_rows, h_q]`.
pub struct Reference {
    pub out: Vec<f64>,
    pub lse: Vec<f64>,
}

/// Forward causal attention in f64. `q` is `[q_rows, h_q, d]`, `k`/`v` are `[kv_rows, h_kv, d]`
/// bf16 words laid out by `layout`.
pub fn attention(
    batch: &Batch,
    layout: &Layout,
    heads: Heads,
    q: &[u16],
    k: &[u16],
    v: &[u16],
    scale: f64,
) -> Result<Reference, Error> {
    let d = heads.head_dim as usize;
    let (hq, hkv) = (heads.h_q as usize, heads.h_kv as usize);
    if q.len() != layout.q_rows * hq * d {
        return Err(invalid(
            "q length",
            q.len(),
            format!("{}", layout.q_rows * hq * d),
        ));
    }
    for (name, t) in [("k length", k), ("v length", v)] {
        if t.len() != layout.kv_rows * hkv * d {
            return Err(invalid(
                name,
                t.len(),
                format!("{}", layout.kv_rows * hkv * d),
            ));
        }
    }
    let f = |x: &[u16]| -> Vec<f64> { x.iter().map(|&h| f64::from(bf16::to_f32(h))).collect() };
    let (qf, kf, vf) = (f(q), f(k), f(v));
    let mut out = vec![0.0f64; q.len()];
    let mut lse = vec![0.0f64; layout.q_rows * hq];
    let mut scores = Vec::new();
    for (ui, u) in batch.units.iter().enumerate() {
        let kv0 = layout.kv_off[u.sample];
        for p in u.a..u.e {
            let qrow = layout.q_off[ui] + (p - u.a) as usize;
            for h in 0..hq {
                let kh = h / (hq / hkv);
                let qv = &qf[(qrow * hq + h) * d..][..d];
                scores.clear();
                let mut mx = f64::NEG_INFINITY;
                for j in 0..=p as usize {
                    let kv = &kf[((kv0 + j) * hkv + kh) * d..][..d];
                    let s = qv.iter().zip(kv).map(|(a, b)| a * b).sum::<f64>() * scale;
                    mx = mx.max(s);
                    scores.push(s);
                }
                let mut sum = 0.0;
                for s in scores.iter_mut() {
                    *s = (*s - mx).exp();
                    sum += *s;
                }
                let o = &mut out[(qrow * hq + h) * d..][..d];
                for (j, &w) in scores.iter().enumerate() {
                    let vv = &vf[((kv0 + j) * hkv + kh) * d..][..d];
                    for (oo, &x) in o.iter_mut().zip(vv) {
                        *oo += w * x;
                    }
                }
                for oo in o.iter_mut() {
                    *oo /= sum;
                }
                lse[qrow * hq + h] = mx + sum.ln();
            }
        }
    }
    Ok(Reference { out, lse })
}

/// Reference gradients (f64) in the layouts of Q and K/V.
pub struct Grads {
    pub dq: Vec<f64>,
    pub dk: Vec<f64>,
    pub dv: Vec<f64>,
}

/// Backward of [`attention`] for upstream gradient `dout` (layout of Q): with P the softmax
/// weights, dV_j += P_j dO, dP_j = dO·v_j, dS_j = P_j (dP_j − Σ_i P_i dP_i),
/// dQ = scale Σ_j dS_j k_j, dK_j += scale dS_j q.
#[allow(clippy::too_many_arguments)]
pub fn attention_bwd(
    batch: &Batch,
    layout: &Layout,
    heads: Heads,
    q: &[u16],
    k: &[u16],
    v: &[u16],
    dout: &[u16],
    scale: f64,
) -> Result<Grads, Error> {
    let d = heads.head_dim as usize;
    let (hq, hkv) = (heads.h_q as usize, heads.h_kv as usize);
    if dout.len() != q.len() {
        return Err(invalid(
            "dout length",
            dout.len(),
            format!("{} (as q)", q.len()),
        ));
    }
    let fwd = attention(batch, layout, heads, q, k, v, scale)?;
    let f = |x: &[u16]| -> Vec<f64> { x.iter().map(|&h| f64::from(bf16::to_f32(h))).collect() };
    let (qf, kf, vf, gf) = (f(q), f(k), f(v), f(dout));
    let mut dq = vec![0.0f64; q.len()];
    let mut dk = vec![0.0f64; k.len()];
    let mut dv = vec![0.0f64; v.len()];
    let mut p = Vec::new();
    let mut dp = Vec::new();
    for (ui, u) in batch.units.iter().enumerate() {
        let kv0 = layout.kv_off[u.sample];
        for pos in u.a..u.e {
            let qrow = layout.q_off[ui] + (pos - u.a) as usize;
            for h in 0..hq {
                let kh = h / (hq / hkv);
                let qi = (qrow * hq + h) * d;
                let qv = &qf[qi..][..d];
                let g = &gf[qi..][..d];
                let lse = fwd.lse[qrow * hq + h];
                p.clear();
                dp.clear();
                for j in 0..=pos as usize {
                    let ki = ((kv0 + j) * hkv + kh) * d;
                    let s = qv
                        .iter()
                        .zip(&kf[ki..][..d])
                        .map(|(a, b)| a * b)
                        .sum::<f64>()
                        * scale;
                    p.push((s - lse).exp());
                    dp.push(
                        g.iter()
                            .zip(&vf[ki..][..d])
                            .map(|(a, b)| a * b)
                            .sum::<f64>(),
                    );
                }
                let dsum: f64 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
                for j in 0..=pos as usize {
                    let ki = ((kv0 + j) * hkv + kh) * d;
                    let ds = p[j] * (dp[j] - dsum);
                    for x in 0..d {
                        dq[qi + x] += scale * ds * kf[ki + x];
                        dk[ki + x] += scale * ds * qv[x];
                        dv[ki + x] += p[j] * g[x];
                    }
                }
            }
        }
    }
    Ok(Grads { dq, dk, dv })
}

/// ‖got − want‖₂ / ‖want‖₂; infinite if any `got` is NaN or the lengths differ.
pub fn rel_l2(got: &[f64], want: &[f64]) -> f64 {
    if got.len() != want.len() || got.iter().any(|x| !x.is_finite()) {
        return f64::INFINITY;
    }
    let num: f64 = got.iter().zip(want).map(|(a, b)| (a - b) * (a - b)).sum();
    let den: f64 = want.iter().map(|b| b * b).sum();
    (num / den).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::WorkUnit;

    fn w(x: f32) -> u16 {
        bf16::from_f32(x)
    }

    #[test]
    fn hand_computed_two_token_case() {
        // One sample of 2 tokens, d = 64, one head. q0 = q1 = e_0, k0 = 0, k1 = e_0 (so scores
        // for p = 1 are 0 and 1·scale), v0 = 1·e_1, v1 = 3·e_1.
        let d = 64;
        let mut q = vec![w(0.0); 2 * d];
        q[0] = w(1.0);
        q[d] = w(1.0);
        let mut k = vec![w(0.0); 2 * d];
        k[d] = w(1.0);
        let mut v = vec![w(0.0); 2 * d];
        v[1] = w(1.0);
        v[d + 1] = w(3.0);
        let batch = Batch::documents(&[2]);
        let layout = Layout::new(&batch, 64).unwrap();
        let heads = Heads::new(1, 1, 64).unwrap();
        let scale = 0.5;
        let r = attention(&batch, &layout, heads, &q, &k, &v, scale).unwrap();
        // p = 0 sees only key 0: out = v0, lse = 0.
        assert!((r.out[1] - 1.0).abs() < 1e-12);
        assert!(r.lse[0].abs() < 1e-12);
        // p = 1: weights ∝ (1, e^0.5): out = (1 + 3e^0.5)/(1 + e^0.5), lse = ln(1 + e^0.5).
        let e = 0.5f64.exp();
        assert!((r.out[d + 1] - (1.0 + 3.0 * e) / (1.0 + e)).abs() < 1e-12);
        assert!((r.lse[1] - (1.0 + e).ln()).abs() < 1e-12);
        assert!(r.out[d].abs() < 1e-12);
    }

    #[test]
    fn backward_matches_finite_differences() {
        // L = Σ dO∘O; dL/dq[x] ≈ (L(q + h e_x) − L(q − h e_x)) / 2h, with q values bf16-exact
        // perturbations (h = 1/64 on values that are multiples of 1/64).
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let (len, d) = (6usize, 64usize);
        let heads = Heads::new(2, 1, 64).unwrap();
        let gen = |n: usize, rng: &mut rand_chacha::ChaCha8Rng| -> Vec<u16> {
            (0..n)
                .map(|_| w(f32::from(rng.random_range(-32i8..32)) / 64.0))
                .collect()
        };
        let q = gen(len * 2 * d, &mut rng);
        let k = gen(len * d, &mut rng);
        let v = gen(len * d, &mut rng);
        let g = gen(len * 2 * d, &mut rng);
        let batch = Batch::documents(&[len as u32]);
        let lay = Layout::new(&batch, 64).unwrap();
        let grads = attention_bwd(&batch, &lay, heads, &q, &k, &v, &g, 0.7).unwrap();
        let loss = |q: &[u16], k: &[u16], v: &[u16]| -> f64 {
            let r = attention(&batch, &lay, heads, q, k, v, 0.7).unwrap();
            r.out
                .iter()
                .zip(&g)
                .map(|(o, &gg)| o * f64::from(bf16::to_f32(gg)))
                .sum()
        };
        let hstep = 1.0 / 64.0;
        let bump = |x: &[u16], i: usize, s: f32| -> Vec<u16> {
            let mut y = x.to_vec();
            y[i] = w(bf16::to_f32(y[i]) + s);
            y
        };
        for &i in &[0usize, 70, 3 * 2 * d + 5, 11 * d - 1] {
            let num = (loss(&bump(&q, i, hstep as f32), &k, &v)
                - loss(&bump(&q, i, -hstep as f32), &k, &v))
                / (2.0 * hstep);
            assert!(
                (num - grads.dq[i]).abs() < 2e-3,
                "dq[{i}] {num} vs {}",
                grads.dq[i]
            );
        }
        for &i in &[0usize, 64 + 7, 5 * d + 63] {
            let nk = (loss(&q, &bump(&k, i, hstep as f32), &v)
                - loss(&q, &bump(&k, i, -hstep as f32), &v))
                / (2.0 * hstep);
            assert!(
                (nk - grads.dk[i]).abs() < 2e-3,
                "dk[{i}] {nk} vs {}",
                grads.dk[i]
            );
            let nv = (loss(&q, &k, &bump(&v, i, hstep as f32))
                - loss(&q, &k, &bump(&v, i, -hstep as f32)))
                / (2.0 * hstep);
            assert!(
                (nv - grads.dv[i]).abs() < 1e-9,
                "dv[{i}] {nv} vs {}",
                grads.dv[i]
            );
        }
    }

    #[test]
    fn suffix_unit_equals_the_same_rows_of_the_whole_document_with_gqa() {
        // A unit [a, e) of a sample must reproduce rows a..e of the whole-document attention.
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        let (len, d) = (20usize, 64usize);
        let heads = Heads::new(4, 2, 64).unwrap();
        let gen = |n: usize, rng: &mut rand_chacha::ChaCha8Rng| -> Vec<u16> {
            (0..n).map(|_| w(rng.random_range(-1.0..1.0))).collect()
        };
        let q = gen(len * 4 * d, &mut rng);
        let k = gen(len * 2 * d, &mut rng);
        let v = gen(len * 2 * d, &mut rng);
        let whole = Batch::documents(&[len as u32]);
        let lw = Layout::new(&whole, 64).unwrap();
        let rw = attention(&whole, &lw, heads, &q, &k, &v, 0.3).unwrap();
        let (a, e) = (7usize, 15usize);
        let part = Batch {
            sample_lens: vec![len as u32],
            units: vec![WorkUnit {
                sample: 0,
                a: a as u32,
                e: e as u32,
            }],
        };
        let lp = Layout::new(&part, 64).unwrap();
        let qp = q[a * 4 * d..e * 4 * d].to_vec();
        let rp = attention(&part, &lp, heads, &qp, &k, &v, 0.3).unwrap();
        let want = &rw.out[a * 4 * d..e * 4 * d];
        assert!(rel_l2(&rp.out, want) < 1e-14);
        // GQA: query head 3 reads KV head 1 (group of 2): single-head attention on the
        // extracted slices must give the same rows.
        let pick = |x: &[u16], nh: usize, h: usize| -> Vec<u16> {
            (0..len)
                .flat_map(|t| x[(t * nh + h) * d..][..d].to_vec())
                .collect()
        };
        let one = Heads::new(1, 1, 64).unwrap();
        let r1 = attention(
            &whole,
            &lw,
            one,
            &pick(&q, 4, 3),
            &pick(&k, 2, 1),
            &pick(&v, 2, 1),
            0.3,
        )
        .unwrap();
        let got: Vec<f64> = (0..len)
            .flat_map(|t| rw.out[(t * 4 + 3) * d..][..d].to_vec())
            .collect();
        assert!(rel_l2(&got, &r1.out) < 1e-14);
        let wrong = attention(
            &whole,
            &lw,
            one,
            &pick(&q, 4, 3),
            &pick(&k, 2, 0),
            &pick(&v, 2, 0),
            0.3,
        )
        .unwrap();
        assert!(rel_l2(&got, &wrong.out) > 1e-3);
        assert!(rel_l2(&[1.0, f64::NAN], &[1.0, 1.0]).is_infinite());
    }
}
