//! The fits' tests: records, pricing, summaries and every fit recovering known parameters.

use super::*;
use crate::cost::blocks::{BlockModel, BlockTimes, BwdBlockModel};
use crate::cost::{Calibration, EffPoint, EffTable, Hardware, LaunchCosts, Mask};

/// A deterministic draw in [0, m) (64-bit LCG, high bits) for synthetic launches.
fn lcg(mut x: u64) -> impl FnMut(u64) -> u64 {
    move |m| {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) % m
    }
}

/// Launch `i`'s segments for the block-model recovery tests, by `i % 3`: one long-KV
/// query chunk (few blocks of many steps: bound by the last wave; many dK/dV blocks),
/// many short whole documents (thousands of short blocks of mixed rows: bound by steps
/// and fixed costs), or a few medium documents cut into query chunks.
fn mixed_segs(next: &mut impl FnMut(u64) -> u64, i: usize) -> Vec<SegCount> {
    match i % 3 {
        0 => vec![SegCount {
            q: 128 + 128 * next(24) as u32,
            kv: 16_384 + next(40_000) as u32,
            n: 1,
        }],
        1 => (0..(4 + next(8)))
            .map(|_| {
                let kv = 1 + next(2000) as u32;
                SegCount {
                    q: kv,
                    kv,
                    n: 20 + next(40) as u32,
                }
            })
            .collect(),
        _ => (0..(2 + next(3)))
            .map(|_| {
                let kv = 1024 + next(15_000) as u32;
                SegCount {
                    q: (kv / (1 + next(4) as u32)).max(1),
                    kv,
                    n: 1 + next(3) as u32,
                }
            })
            .collect(),
    }
}

fn row(kind: MeasureKind, heads: u32, segs: Vec<SegCount>, bytes: u64, ms: f64) -> Measurement {
    Measurement {
        kind,
        pass: Pass::Fwd,
        plan: "p".into(),
        seed: 1,
        scheme: "libra".into(),
        step: 0,
        ga: 0,
        pool: 0,
        worker: 0,
        chunk: 0,
        units: 1,
        segments: segs.iter().map(|s| u64::from(s.n)).sum(),
        tiles: 0,
        heads,
        kv_heads: heads,
        head_dim: 128,
        q_tokens: 0,
        flops: 0.0,
        bytes,
        predicted_ms: Some(1.5),
        measured_ms: ms,
        p10_ms: ms * 0.98,
        p90_ms: ms * 1.02,
        segs,
        mask: Mask::Causal,
    }
}

#[test]
fn csv_round_trips_and_names_bad_fields() {
    let segs = vec![
        SegCount {
            q: 64,
            kv: 300,
            n: 2,
        },
        SegCount { q: 5, kv: 5, n: 1 },
    ];
    let rows = vec![
        row(MeasureKind::Attn, 2, segs, 0, 1.25),
        row(MeasureKind::Dispatch, 2, vec![], 4096, 0.01),
    ];
    let text = measurements_to_csv(&rows).unwrap();
    assert!(text.contains("64:300*2;5:5*1"), "{text}");
    let back = measurements_from_csv(&text, "m.csv").unwrap();
    assert_eq!(back.len(), 2);
    assert_eq!(back[0].segs, rows[0].segs);
    assert_eq!(back[0].measured_ms, 1.25);
    assert_eq!(back[1].kind, MeasureKind::Dispatch);
    assert_eq!(back[1].bytes, 4096);
    let bad = text.replace("64:300*2", "400:300*2");
    let e = measurements_from_csv(&bad, "m.csv")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("m.csv: line 3: segs") && e.contains("400:300*2"),
        "{e}"
    );
    // KV heads: written, read back, optional (a file without the column has a KV head
    // per query head) and refused by name unless they divide the query heads.
    let mut gqa = rows.clone();
    gqa[0].kv_heads = 1;
    let text = measurements_to_csv(&gqa).unwrap();
    assert_eq!(
        measurements_from_csv(&text, "m.csv").unwrap()[0].kv_heads,
        1
    );
    let mut lines: Vec<Vec<String>> = text
        .lines()
        .skip(1)
        .map(|l| l.split(',').map(str::to_string).collect())
        .collect();
    let col = lines[0].iter().position(|c| c == "kv_heads").unwrap();
    for l in &mut lines {
        l.remove(col);
    }
    let without = std::iter::once(CSV_VERSION_LINE.to_string())
        .chain(lines.iter().map(|l| l.join(",")))
        .collect::<Vec<_>>()
        .join("\n");
    assert_eq!(
        measurements_from_csv(&without, "m.csv").unwrap()[0].kv_heads,
        2
    );
    let odd = text.replacen(",2,1,128,", ",2,3,128,", 1);
    assert_ne!(odd, text);
    let e = format!("{:?}", measurements_from_csv(&odd, "m.csv").map(|_| ()));
    assert!(
        e.contains("m.csv: line 3: kv_heads") && e.contains('3'),
        "{e}"
    );
    // times in [0, a minute], each refused by its column
    type Set = fn(&mut Measurement, f64);
    let sets: [(&str, Set); 4] = [
        ("measured_ms", |m, v| m.measured_ms = v),
        ("p10_ms", |m, v| m.p10_ms = v),
        ("p90_ms", |m, v| m.p90_ms = v),
        ("predicted_ms", |m, v| m.predicted_ms = Some(v)),
    ];
    for (name, set) in sets {
        for v in [-1.0, 60_001.0, 1e300] {
            let mut r = rows[0].clone();
            set(&mut r, v);
            let e = measurements_from_csv(&measurements_to_csv(&[r]).unwrap(), "m.csv")
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!("m.csv: line 3: {name}")) && e.contains("60000] ms"),
                "{name} = {v}: {e}"
            );
        }
    }
    let bad = text.replace("dispatch", "teleport");
    let e = measurements_from_csv(&bad, "m.csv")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("line 4: kind") && e.contains("attn, dispatch or return"),
        "{e}"
    );
    let e = measurements_from_csv(&format!("{CSV_VERSION_LINE}\nkind,plan\n"), "m.csv")
        .unwrap_err()
        .to_string();
    assert!(e.contains("missing column `pass`"), "{e}");
    // Backward rows round-trip; a backward copy row is refused.
    let mut b = rows[0].clone();
    b.pass = Pass::Bwd;
    let text = measurements_to_csv(&[rows[0].clone(), b.clone()]).unwrap();
    assert!(
        text.starts_with("#skewsim-measurements,v2\nkind,pass,plan,"),
        "{text}"
    );
    let back = measurements_from_csv(&text, "m.csv").unwrap();
    assert_eq!(back[1], b);
    assert_eq!(back[0].pass, Pass::Fwd);
    let bad = text.replacen("attn,fwd", "dispatch,bwd", 1);
    let e = measurements_from_csv(&bad, "m.csv")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("m.csv: line 3: pass") && e.contains("only attention rows"),
        "{e}"
    );
    let bad = text.replacen("attn,fwd", "attn,sideways", 1);
    let e = measurements_from_csv(&bad, "m.csv")
        .unwrap_err()
        .to_string();
    assert!(e.contains("fwd or bwd"), "{e}");
}

#[test]
fn old_and_other_csv_versions_are_refused_by_name() {
    // Version 1: the header first, no `pass` column (as `validate/results/plans_run13/` holds it).
    let v1 = "kind,plan,seed,scheme,step,ga,pool,worker,chunk,units,segments,tiles,heads,head_dim,q_tokens,flops,bytes,predicted_ms,measured_ms,p10_ms,p90_ms,segs\n\
              attn,p,1,libra,0,0,0,0,0,1,1,1,2,128,64,1e9,0,,1.0,1.0,1.0,64:64*1\n";
    let e = measurements_from_csv(v1, "old.csv")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("old.csv: measurement CSV format")
            && e.contains("version 1")
            && e.contains("#skewsim-measurements,v2")
            && e.contains("re-run `skewsim validate`"),
        "{e}"
    );
    let v3 = v1.replacen("kind,plan", "#skewsim-measurements,v3\nkind,plan", 1);
    let e = measurements_from_csv(&v3, "new.csv")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("new.csv: measurement CSV format") && e.contains("version `v3`"),
        "{e}"
    );
    let e = measurements_from_csv("a,b,c\n1,2,3\n", "x.csv")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("x.csv: first line") && e.contains("a,b,c"),
        "{e}"
    );
    let e = measurements_from_csv("", "empty.csv")
        .unwrap_err()
        .to_string();
    assert!(e.contains("empty.csv: first line"), "{e}");
    // The committed `plans_run13` record, converted to version 2, reads back whole.
    let v2 = include_str!("../../../validate/results/plans_run13/measurements_v2.csv");
    let rows = measurements_from_csv(v2, "measurements_v2.csv").unwrap();
    assert_eq!(rows.len(), 1104);
    assert!(rows.iter().all(|r| r.pass == Pass::Fwd));
}

#[test]
fn prediction_by_hand() {
    // One 1024-token document at 2 heads: 4·128·2·(1024·1025/2) FLOPs at the default
    // table's 177.7 TFLOP/s (heads 2, len 1024), plus 3 µs launch.
    let mut p = Pricing::h200_default().unwrap();
    p.launch.attn_launch_us = 3.0;
    let r = row(
        MeasureKind::Attn,
        2,
        vec![SegCount {
            q: 1024,
            kv: 1024,
            n: 1,
        }],
        0,
        1.0,
    );
    let flops = 4.0 * 128.0 * 2.0 * (1024.0 * 1025.0 / 2.0);
    let want = 3e-3 + flops / 177.7e12 * 1e3;
    assert!(
        (p.predict_ms(&r) - want).abs() < 1e-12,
        "{}",
        p.predict_ms(&r)
    );
    // Copy: 1 MB at 2e12 B/s + 5 µs.
    p.launch.copy_bytes_per_s = 2e12;
    p.launch.copy_launch_us = 5.0;
    let c = row(MeasureKind::Return, 2, vec![], 1_000_000, 1.0);
    assert!((p.predict_ms(&c) - (5e-3 + 1e6 / 2e12 * 1e3)).abs() < 1e-15);
    // Backward without a table: forward compute × 2.5 / 0.8 + the forward launch.
    let mut b = r.clone();
    b.pass = Pass::Bwd;
    let want_b = 3e-3 + flops / 177.7e12 * 1e3 * 2.5 / 0.8;
    assert!(
        (p.predict_ms(&b) - want_b).abs() < 1e-12,
        "{}",
        p.predict_ms(&b)
    );
    // With a backward table (one node, 90 TFLOP/s of 2.5× the forward FLOPs) and a
    // 40 µs backward call.
    p.bwd = Some(
        EffTable::from_points(
            &[EffPoint {
                heads: 2,
                len: 1024,
                tflops: 90.0,
            }],
            "b",
        )
        .unwrap(),
    );
    p.launch.attn_bwd_launch_us = 40.0;
    let want_b = 40e-3 + 2.5 * flops / 90e12 * 1e3;
    assert!(
        (p.predict_ms(&b) - want_b).abs() < 1e-12,
        "{}",
        p.predict_ms(&b)
    );
    // The cost model prices the same backward through the same formula.
    let cal = Calibration {
        attn_fwd: vec![EffPoint {
            heads: 2,
            len: 1024,
            tflops: 177.7,
        }],
        attn_bwd: Some(vec![EffPoint {
            heads: 2,
            len: 1024,
            tflops: 90.0,
        }]),
        hardware: Hardware::default(),
        launch: p.launch.clone(),
        attn_blocks: None,
        attn_bwd_blocks: None,
    };
    let mut model = crate::cost::ModelConfig::builtin("qwen3-30b-a3b").unwrap();
    model.head_dim = 128;
    let cm = crate::cost::CostModel::calibrated(model, &cal, "cal").unwrap();
    let ps = cm.attn_bwd_ps([1024], 2) as f64;
    assert!((ps * 1e-9 - want_b).abs() < 1e-8, "{ps}");
}

#[test]
fn summary_errors_by_hand() {
    let p = Pricing::h200_default().unwrap();
    let seg = vec![SegCount {
        q: 1024,
        kv: 1024,
        n: 1,
    }];
    let truth = p.predict_ms(&row(MeasureKind::Attn, 2, seg.clone(), 0, 1.0));
    // Worker 0: two chunks measured 10% slow; worker 1: exact.
    let mut rows = Vec::new();
    for (w, f) in [(0, 1.1), (0, 1.1), (1, 1.0), (1, 1.0)] {
        let mut r = row(MeasureKind::Attn, 2, seg.clone(), 0, truth * f);
        r.worker = w;
        rows.push(r);
    }
    let s = summarize(&rows, &p);
    assert_eq!(s.workers.len(), 2);
    assert_eq!(s.worker_err.n, 2);
    // APEs |1 - 1.1|/1.1 = 9.0909 % and 0 %.
    assert!((s.worker_err.max_ape - 100.0 * 0.1 / 1.1).abs() < 1e-9);
    assert!((s.worker_err.median_ape - 50.0 * 0.1 / 1.1).abs() < 1e-9);
    // Slowest worker: predicted 2·truth vs measured 2.2·truth.
    assert_eq!(s.max_worker_err.n, 1);
    assert!((s.max_worker_err.median_ape - 100.0 * 0.1 / 1.1).abs() < 1e-9);
}

/// Synthetic measurements from known parameters: the fit must recover them.
#[test]
fn fit_recovers_known_parameters() {
    // Truth: a table over heads {2, 8} × lens {256, 1024, 4096, 16384} and a 6 µs
    // launch; copies at 2.1e12 B/s + 4 µs.
    let lens = [256u32, 1024, 4096, 16384];
    let truth_eff = |h: u32, l: u32| {
        let base = if h == 2 { 120.0 } else { 200.0 };
        base * (1.0 + (f64::from(l) / 256.0).ln() / 3.0)
    };
    let pts: Vec<EffPoint> = [2u32, 8]
        .iter()
        .flat_map(|&h| {
            lens.iter().map(move |&l| EffPoint {
                heads: h,
                len: l,
                tflops: truth_eff(h, l),
            })
        })
        .collect();
    let truth = Pricing {
        eff: EffTable::from_points(&pts, "truth").unwrap(),
        bwd: None,
        hw: Hardware::default(),
        launch: LaunchCosts {
            attn_launch_us: 6.0,
            copy_launch_us: 4.0,
            copy_bytes_per_s: 2.1e12,
            ..LaunchCosts::default()
        },
        blocks: None,
        bwd_blocks: None,
        head_dims: Vec::new(),
    };
    // Launches: mixes of whole documents and chunks at deterministic lengths.
    let mut rows = Vec::new();
    let mut next = lcg(12345);
    for i in 0..60 {
        let heads = if i % 2 == 0 { 2 } else { 8 };
        let mut segs = Vec::new();
        for _ in 0..(1 + next(4)) {
            let kv = 256 + next(16000) as u32;
            let q = if next(2) == 0 { kv } else { (kv / 4).max(1) };
            segs.push(SegCount {
                q,
                kv,
                n: 1 + next(3) as u32,
            });
        }
        // Very small launches make the launch overhead visible.
        if i % 5 == 0 {
            segs = vec![SegCount {
                q: 256,
                kv: 256,
                n: 1,
            }];
        }
        let mut r = row(MeasureKind::Attn, heads, segs, 0, 0.0);
        r.measured_ms = truth.predict_ms(&r);
        r.p10_ms = r.measured_ms * (-1.2816f64 * 0.02).exp();
        r.p90_ms = r.measured_ms * (1.2816f64 * 0.02).exp();
        rows.push(r);
    }
    for b in [1u64 << 16, 1 << 20, 1 << 24, 1 << 26, 3 << 20] {
        let mut r = row(MeasureKind::Dispatch, 2, vec![], b, 0.0);
        r.measured_ms = truth.predict_ms(&r);
        rows.push(r);
    }
    let start = Pricing::h200_default().unwrap();
    let opts = FitOptions {
        lens: lens.to_vec(),
        iterations: 40,
        prior_weight: 1e-5,
        blocks: None,
        bwd_blocks: None,
        ..FitOptions::default()
    };
    let f = fit(&rows, &start, &opts).unwrap();
    let c = &f.calibration;
    assert!(f.attn_rms_rel < 1e-4, "rms {}", f.attn_rms_rel);
    for p in &c.attn_fwd {
        let t = truth_eff(p.heads, p.len);
        assert!((p.tflops - t).abs() / t < 0.02, "{p:?} vs {t}");
    }
    assert!(
        (c.launch.attn_launch_us - 6.0).abs() < 0.3,
        "{:?}",
        c.launch
    );
    assert!(
        (c.launch.copy_bytes_per_s / 2.1e12 - 1.0).abs() < 1e-6,
        "{:?}",
        c.launch
    );
    assert!(
        (c.launch.copy_launch_us - 4.0).abs() < 1e-6,
        "{:?}",
        c.launch
    );
    let js = c.launch.jitter_sigma.unwrap();
    assert!((js - 0.02).abs() < 1e-9, "{js}");
    // The fitted pricing reproduces the launches.
    let fitted = Pricing::from_calibration(c, "fit").unwrap();
    let s = summarize(&rows, &fitted);
    assert!(s.worker_err.max_ape < 0.1, "{:?}", s.worker_err);
    // No attention rows: a clear error.
    let e = fit(&rows[60..], &start, &opts).unwrap_err().to_string();
    assert!(e.contains("at least one measured attention launch"), "{e}");
}

/// Backward rows from a known backward table, call overhead and scalar efficiency: the
/// fit recovers them beside the forward.
#[test]
fn fit_recovers_known_backward_parameters() {
    let lens = [512u32, 2048, 8192];
    let fwd_eff =
        |h: u32, l: u32| if h == 4 { 150.0 } else { 250.0 } * (f64::from(l) / 512.0).powf(0.15);
    // Backward at 0.6 × the forward rate at short lengths rising to 0.7 at long ones.
    let bwd_eff =
        |h: u32, l: u32| fwd_eff(h, l) * (0.6 + 0.05 * (f64::from(l) / 512.0).log2() / 2.0);
    let grid = |f: &dyn Fn(u32, u32) -> f64| -> Vec<EffPoint> {
        [4u32, 16]
            .iter()
            .flat_map(|&h| lens.iter().map(move |&l| (h, l)))
            .map(|(heads, len)| EffPoint {
                heads,
                len,
                tflops: f(heads, len),
            })
            .collect()
    };
    let truth = Pricing {
        eff: EffTable::from_points(&grid(&fwd_eff), "f").unwrap(),
        bwd: Some(EffTable::from_points(&grid(&bwd_eff), "b").unwrap()),
        hw: Hardware::default(),
        launch: LaunchCosts {
            attn_launch_us: 5.0,
            attn_bwd_launch_us: 25.0,
            ..LaunchCosts::default()
        },
        blocks: None,
        bwd_blocks: None,
        head_dims: Vec::new(),
    };
    let mut rows = Vec::new();
    let mut next = lcg(777);
    for i in 0..48 {
        let heads = if i % 2 == 0 { 4 } else { 16 };
        let mut segs = Vec::new();
        for _ in 0..(1 + next(3)) {
            let kv = 512 + next(7700) as u32;
            let q = if next(2) == 0 { kv } else { (kv / 3).max(1) };
            segs.push(SegCount {
                q,
                kv,
                n: 1 + next(2) as u32,
            });
        }
        if i % 6 == 0 {
            segs = vec![SegCount {
                q: 512,
                kv: 512,
                n: 1,
            }];
        }
        for pass in [Pass::Fwd, Pass::Bwd] {
            let mut r = row(MeasureKind::Attn, heads, segs.clone(), 0, 0.0);
            r.pass = pass;
            r.measured_ms = truth.predict_ms(&r);
            r.p10_ms = r.measured_ms;
            r.p90_ms = r.measured_ms;
            rows.push(r);
        }
    }
    let start = Pricing::h200_default().unwrap();
    let opts = FitOptions {
        lens: lens.to_vec(),
        iterations: 60,
        prior_weight: 1e-5,
        blocks: None,
        bwd_blocks: None,
        ..FitOptions::default()
    };
    let f = fit(&rows, &start, &opts).unwrap();
    assert_eq!((f.attn_rows, f.bwd_rows), (48, 48));
    assert!(f.bwd_rms_rel.unwrap() < 1e-4, "{:?}", f.bwd_rms_rel);
    let c = &f.calibration;
    let b = c.attn_bwd.as_ref().unwrap();
    assert_eq!(b.len(), 6);
    for p in b {
        let t = bwd_eff(p.heads, p.len);
        assert!((p.tflops - t).abs() / t < 0.02, "{p:?} vs {t}");
    }
    assert!(
        (c.launch.attn_bwd_launch_us - 25.0).abs() < 1.0,
        "{:?}",
        c.launch
    );
    assert!(
        (c.launch.attn_launch_us - 5.0).abs() < 0.5,
        "{:?}",
        c.launch
    );
    // The scalar lies inside the truth's range of backward/forward ratios (0.6 … 0.7).
    let e = c.hardware.attn_bwd_efficiency;
    assert!((0.6..=0.7).contains(&e), "{e}");
    // The fitted calibration reproduces both passes, through JSON and back.
    let text = serde_json::to_string(c).unwrap();
    let p = Pricing::from_calibration_json(&text, "cal.json").unwrap();
    let s = summarize(&rows, &p);
    assert!(s.bwd_worker_err.max_ape < 0.1, "{:?}", s.bwd_worker_err);
    assert!(s.worker_err.max_ape < 0.1, "{:?}", s.worker_err);
    assert!(
        s.fb_worker_err.n == 1 && s.fb_worker_err.max_ape < 0.1,
        "{:?}",
        s.fb_worker_err
    );
    // Without backward rows: no backward table, the start's scalar kept.
    let fwd_only: Vec<Measurement> = rows
        .iter()
        .filter(|r| r.pass == Pass::Fwd)
        .cloned()
        .collect();
    let f2 = fit(&fwd_only, &start, &opts).unwrap();
    assert!(f2.calibration.attn_bwd.is_none());
    assert_eq!(f2.calibration.hardware.attn_bwd_efficiency, 0.8);
    assert_eq!(f2.bwd_rows, 0);
}

/// Launches priced by a known block model (and call overhead): the fit recovers its
/// figures from a start derived from the data, and the fitted calibration carries it.
#[test]
fn fit_recovers_a_known_block_model() {
    let truth_m = BlockModel::h200(300.0, 900.0, 0.2, 400.0, 1.35);
    let truth = Pricing {
        blocks: Some(truth_m),
        launch: LaunchCosts {
            attn_launch_us: 4.0,
            ..LaunchCosts::default()
        },
        ..Pricing::h200_default().unwrap()
    };
    let launches = |seed: u64| {
        let mut rows = Vec::new();
        let mut next = lcg(seed);
        for i in 0..40 {
            let heads = [1, 2, 8, 32][i % 4];
            let segs = mixed_segs(&mut next, i);
            let mut r = row(MeasureKind::Attn, heads, segs, 0, 0.0);
            r.measured_ms = truth.predict_ms(&r);
            rows.push(r);
        }
        rows
    };
    let rows = launches(4242);
    let start = Pricing::h200_default().unwrap();
    let opts = FitOptions {
        iterations: 80,
        blocks: Some(BlockModel::h200(0.0, 1.0, 0.0, 0.0, 1.0)),
        ..FitOptions::default()
    };
    let f = fit(&rows, &start, &opts).unwrap();
    let m = f.calibration.attn_blocks.unwrap();
    assert!(f.attn_rms_rel < 5e-3, "rms {} {m:?}", f.attn_rms_rel);
    // The step time and the sharing factor are pinned by the long blocks; the fixed,
    // row and diagonal shares trade off a little on this data.
    assert!((m.iter_ns / truth_m.iter_ns - 1.0).abs() < 0.01, "{m:?}");
    assert!(
        (m.pair_slowdown / truth_m.pair_slowdown - 1.0).abs() < 0.01,
        "{m:?}"
    );
    assert!((m.block_ns / truth_m.block_ns - 1.0).abs() < 0.35, "{m:?}");
    let us = f.calibration.launch.attn_launch_us;
    assert!((us - 4.0).abs() < 1.0, "{us}");
    // The table alone cannot price these launches as well.
    assert!(
        f.table_rms_rel > 10.0 * f.attn_rms_rel,
        "{}",
        f.table_rms_rel
    );
    // Through JSON and back, the fitted pricing reproduces the launches.
    let text = serde_json::to_string(&f.calibration).unwrap();
    assert!(text.contains("\"attn_blocks\""), "{text}");
    let mut p = Pricing::from_calibration_json(&text, "cal.json").unwrap();
    assert!(summarize(&rows, &p).launch_err.max_ape < 1.5);
    // Fresh launches of the same kinds, never fitted.
    let fresh = launches(99);
    let e = summarize(&fresh, &p).launch_err;
    assert!(e.median_ape < 0.5 && e.max_ape < 3.0, "{e:?}");
    p.blocks = None;
    assert!(summarize(&rows, &p).launch_err.max_ape > 5.0);
    // Without `blocks` in the options: no block model in the calibration.
    let f2 = fit(
        &rows,
        &start,
        &FitOptions {
            blocks: None,
            ..opts
        },
    )
    .unwrap();
    assert!(f2.calibration.attn_blocks.is_none());
    assert_eq!(f2.attn_rms_rel, f2.table_rms_rel);
}

/// Backward calls priced by a known backward block model (both launches' block times
/// alike, a per-row·head term and a call overhead): the fit recovers it and reproduces
/// fresh calls it never saw, better than the backward table can.
#[test]
fn fit_recovers_a_known_backward_block_model() {
    let t = |iter_ns: f64| BlockTimes {
        block_ns: 2.0 * iter_ns,
        iter_ns,
        row_share: 0.3,
        diag_ns: 0.0,
        empty_ns: 0.0,
    };
    let truth_m = BwdBlockModel::h200(0.0, t(2000.0), t(2000.0), 1.6);
    let truth = Pricing {
        bwd_blocks: Some(truth_m),
        launch: LaunchCosts {
            attn_launch_us: 4.0,
            attn_bwd_launch_us: 30.0,
            ..LaunchCosts::default()
        },
        ..Pricing::h200_default().unwrap()
    };
    let calls = |seed: u64| {
        let mut rows = Vec::new();
        let mut next = lcg(seed);
        for i in 0..30 {
            let heads = [8, 16, 32][i % 3];
            let segs = mixed_segs(&mut next, i);
            for pass in [Pass::Fwd, Pass::Bwd] {
                let mut r = row(MeasureKind::Attn, heads, segs.clone(), 0, 0.0);
                r.pass = pass;
                r.measured_ms = truth.predict_ms(&r);
                rows.push(r);
            }
        }
        rows
    };
    let rows = calls(2024);
    let start = Pricing::h200_default().unwrap();
    let unit = t(1.0);
    let opts = FitOptions {
        iterations: 40,
        bwd_blocks: Some(BwdBlockModel::h200(0.0, unit, unit, 1.0)),
        ..FitOptions::default()
    };
    let f = fit(&rows, &start, &opts).unwrap();
    let m = f.calibration.attn_bwd_blocks.unwrap();
    let rms = f.bwd_rms_rel.unwrap();
    assert!(rms < 1e-2, "rms {rms} {m:?}");
    // One step time for both launches, near the truth's. The search does NOT recover
    // the truth exactly: the fixed time and the row·head term trade off (a call's dQ
    // blocks number its rows × heads / 64) and the one descent stops in a local
    // minimum (measured: rms 0.67 %, step 2101 ns, block_ns 0.19 × iter_ns, 0.60 ns
    // per row·head, row_share 0.03, pair 1.54 against the truth's 0 %, 2000, 1.0, 0,
    // 0.3, 1.6; fresh calls median 0.64 %, max 4.9 %). The fit is judged by the calls
    // it reproduces.
    assert!(m.dq == m.dkdv, "{m:?}");
    assert!((m.dq.iter_ns / 2000.0 - 1.0).abs() < 0.1, "{m:?}");
    assert!((m.pair_slowdown / 1.6 - 1.0).abs() < 0.15, "{m:?}");
    // The backward table cannot price these calls as well.
    let table = f.bwd_table_rms_rel.unwrap();
    assert!(table > 5.0 * rms, "{table} vs {rms}");
    // Through JSON and back, the calibration reproduces fresh calls.
    let text = serde_json::to_string(&f.calibration).unwrap();
    assert!(text.contains("\"attn_bwd_blocks\""), "{text}");
    let mut p = Pricing::from_calibration_json(&text, "cal.json").unwrap();
    let fresh = calls(77);
    let e = summarize(&fresh, &p).bwd_launch_err;
    assert!(e.median_ape < 1.0 && e.max_ape < 5.0, "{e:?}");
    p.bwd_blocks = None;
    assert!(summarize(&fresh, &p).bwd_launch_err.max_ape > 3.0);
    // Without `bwd_blocks` in the options: none, and the table's residual reported.
    let f2 = fit(
        &rows,
        &start,
        &FitOptions {
            bwd_blocks: None,
            ..opts
        },
    )
    .unwrap();
    assert!(f2.calibration.attn_bwd_blocks.is_none());
    assert_eq!(f2.bwd_rms_rel, f2.bwd_table_rms_rel);
}
