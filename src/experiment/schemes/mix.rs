//! `[sweep.attention]` of the comparison kinds: the model's attention pattern as a sweep
//! axis, a share of sliding-window layers × a window W.
//!
//! ```toml
//! [sweep.attention]
//! sliding_share = [0.0, 0.25, 0.5, 0.75, 1.0]  # of every `period` layers, sliding first
//! window = [4096, 65536]                        # W, keys
//! period = 4                                    # optional: the simulated layers
//! ```
//!
//! Each mix replaces a causal model's pattern by `k × sliding:W` then `period − k × causal`
//! (k = share · period); share 0 is the causal model, run once whatever W. Beside the
//! comparison's table the summary reports each mix's skew — Libra Eq. 4 over the
//! per-sequence load summed over the pattern's layers (Σ over layers of 2·pairs(ℓ) − ℓ
//! under each layer's mask), next to random grouping's Monte-Carlo R − 1 — the speedups by
//! share and W, and for each scheme the share from which it no longer beats the baseline;
//! the plot's x axis is the share (one line per W).
//!
//! Prices nothing: loads come from `cost::Mask` through `study::trial_loads_under`, the
//! bound from `theory`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Deserialize;

use super::{short_topology, speedup, Arm, ArmResult, Sweep};
use crate::balance::libra::LibraParams;
use crate::cost::{AttentionPattern, Mask, ModelConfig};
use crate::error::{invalid, Context, Result};
use crate::experiment::study::{trial_loads_under, Source};
use crate::report::svg::{palette, Chart, Grid, Scale, Series};
use crate::workload::pack::Packing;

/// Global batches sampled per mix for its skew (as `skewsim theory --trials`).
const SKEW_TRIALS: u64 = 200;

/// The `[sweep.attention]` table.
#[derive(Deserialize, Clone, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct MixFile {
    sliding_share: Vec<f64>,
    window: Vec<i64>,
    #[serde(default)]
    period: Option<u32>,
}

/// One attention mix: the first `sliding` of every `period` layers under a window of
/// `window` keys, the rest causal (`sliding` = 0: the causal model).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Mix {
    pub(super) sliding: u32,
    pub(super) period: u32,
    pub(super) window: u32,
}

impl Mix {
    /// The share of sliding-window layers.
    fn share(&self) -> f64 {
        f64::from(self.sliding) / f64::from(self.period)
    }

    /// The model's per-layer attention under this mix.
    pub(super) fn pattern(&self) -> AttentionPattern {
        let w = Mask::Sliding { w: self.window };
        let mut masks = vec![w; self.sliding as usize];
        masks.resize(self.period as usize, Mask::Causal);
        AttentionPattern::new(masks)
    }

    /// `model` under this mix, as the results name it.
    pub(super) fn label(&self, model: &str) -> String {
        if self.sliding == 0 {
            format!("{model} · causal")
        } else {
            format!(
                "{model} · {}/{} sliding:{}",
                self.sliding, self.period, self.window
            )
        }
    }

    /// The W column: none for the causal model.
    fn w_text(&self) -> String {
        if self.sliding == 0 {
            "any".into()
        } else {
            self.window.to_string()
        }
    }
}

/// The mixes of `f` over `layers` simulated layers: share 0 once, then every positive
/// share for each W, in the file's order. Errors name the field, the value and what is
/// allowed.
pub(super) fn mixes(f: &MixFile, layers: u32) -> Result<Vec<Mix>> {
    const SHARE: &str = "[sweep.attention] sliding_share";
    const WINDOW: &str = "[sweep.attention] window";
    const PERIOD: &str = "[sweep.attention] period";
    if f.sliding_share.is_empty() {
        return Err(invalid(
            SHARE,
            "[]",
            "at least one share of sliding-window layers",
        ));
    }
    if f.window.is_empty() {
        return Err(invalid(WINDOW, "[]", "at least one window W ≥ 1 keys"));
    }
    let period = f.period.unwrap_or(layers);
    if period == 0 || layers % period != 0 {
        return Err(invalid(
            PERIOD,
            period,
            format!("a number of layers ≥ 1 that divides the {layers} simulated layers (the pattern repeats over them)"),
        ));
    }
    let mut windows = Vec::with_capacity(f.window.len());
    for &w in &f.window {
        let w = u32::try_from(w)
            .ok()
            .filter(|&w| w >= 1)
            .ok_or_else(|| invalid(WINDOW, w, "a window W ≥ 1 keys, at most 4294967295"))?;
        if windows.contains(&w) {
            return Err(invalid(WINDOW, w, "each window once"));
        }
        windows.push(w);
    }
    let mut counts = Vec::with_capacity(f.sliding_share.len());
    for &s in &f.sliding_share {
        let k = s * f64::from(period);
        if !(0.0..=1.0).contains(&s) || (k - k.round()).abs() > 1e-9 {
            return Err(invalid(
                SHARE,
                s,
                format!(
                    "a share in 0..=1 that is a whole number of the pattern's {period} layers \
                     (0, 1/{period}, …, 1)"
                ),
            ));
        }
        let k = k.round() as u32;
        if counts.contains(&k) {
            return Err(invalid(SHARE, s, "each share once"));
        }
        counts.push(k);
    }
    let mut out = Vec::new();
    if counts.contains(&0) {
        out.push(Mix {
            sliding: 0,
            period,
            window: windows[0],
        });
    }
    for &window in &windows {
        for &sliding in counts.iter().filter(|&&k| k > 0) {
            out.push(Mix {
                sliding,
                period,
                window,
            });
        }
    }
    Ok(out)
}

/// `model` (causal: the sweep sets its pattern) under `mix`.
pub(super) fn apply(mut model: ModelConfig, name: &str, mix: &Mix) -> Result<ModelConfig> {
    if !model.attention.all_causal() {
        return Err(invalid(
            "[sweep.attention] model",
            name,
            "a causal model (the sweep sets its attention pattern)",
        ));
    }
    model.attention = mix.pattern();
    Ok(model)
}

/// One result with its mix.
struct Row<'a> {
    r: &'a ArmResult,
    mix: Mix,
    /// The point's model without its mix.
    base: &'a str,
}

/// A panel's cell: (model, topology, corpus, L, DP, CP).
type Cell = (String, String, String, u32, u32, u32);

fn cell(row: &Row) -> Cell {
    let r = row.r;
    (
        row.base.to_string(),
        r.topology.clone(),
        r.corpus.clone(),
        r.seq_len,
        r.dp,
        r.cp,
    )
}

/// The skew of one mix at one cell: (load CV, Eq. 4's R − 1, Monte Carlo's R − 1, P).
type Skew = (f64, f64, f64, usize);

/// The summary's tables and the plot of a sweep with `[sweep.attention]`.
pub(super) fn report(sw: &Sweep, results: &[ArmResult]) -> Result<(String, String)> {
    let rows: Vec<Row> = results
        .iter()
        .enumerate()
        .filter_map(|(i, r)| {
            let (p, _) = sw.job(i);
            p.mix.map(|mix| Row {
                r,
                mix,
                base: &p.base_model,
            })
        })
        .collect();
    let v = View {
        skews: skews(sw, &rows)?,
        arms: &sw.arms,
        results,
        rows,
    };
    Ok((v.tables(), v.plot(&sw.title)))
}

/// What the tables and the plot read: the arms, every result, the mixes' rows and skews.
struct View<'a> {
    arms: &'a [Arm],
    results: &'a [ArmResult],
    rows: Vec<Row<'a>>,
    skews: BTreeMap<(Cell, u32, u32), Skew>,
}

/// Each (cell, mix)'s skew over [`SKEW_TRIALS`] global batches of the point's DP × GA
/// sequences, at Libra's pool size P (capped at DP).
fn skews(sw: &Sweep, rows: &[Row]) -> Result<BTreeMap<(Cell, u32, u32), Skew>> {
    let f = &sw.f;
    let seed = f.workload.seed;
    let pool = f
        .settings
        .pool_size
        .unwrap_or(LibraParams::default().pool_size);
    // per (corpus, L, D, mask): every trial's per-sequence loads
    let mut loads: BTreeMap<(String, u32, usize, String), Vec<Vec<u64>>> = BTreeMap::new();
    let mut out = BTreeMap::new();
    for row in rows {
        let (r, mix) = (row.r, row.mix);
        let key = (cell(row), mix.sliding, mix.window);
        if out.contains_key(&key) {
            continue;
        }
        let gbs = (r.dp * r.ga) as usize;
        let ctx = || format!("{}: skew of {} on {}", sw.file, row.r.model, r.corpus);
        let mut mixed: Vec<Vec<u64>> = Vec::new();
        for (mask, layers) in mix.pattern().classes(mix.period) {
            let k = (r.corpus.clone(), r.seq_len, gbs, mask.to_string());
            if !loads.contains_key(&k) {
                let src = Source::Corpus {
                    corpus: super::super::inputs::load_corpus(&r.corpus).with_context(ctx)?,
                    seq_len: r.seq_len,
                    packing: Packing::Sequential,
                };
                let l =
                    trial_loads_under(&src, gbs, SKEW_TRIALS, seed, &mask, ("skew trials", "gbs"))
                        .with_context(ctx)?;
                loads.insert(k.clone(), l);
            }
            let per = &loads[&k];
            if mixed.is_empty() {
                mixed = per.iter().map(|b| vec![0; b.len()]).collect();
            }
            for (m, b) in mixed.iter_mut().zip(per) {
                for (x, &y) in m.iter_mut().zip(b) {
                    *x += u64::from(layers) * y;
                }
            }
        }
        let p = pool.min(r.dp).max(1) as usize;
        let (stats, cmp) = crate::theory::compare(&mixed, &[p], seed).with_context(ctx)?;
        out.insert(key, (stats.cv, cmp[0].bound, cmp[0].mc.mean, p));
    }
    Ok(out)
}

/// The windows of `rows` in order, and their shares (0 shared by every W) in order.
fn axes(rows: &[Row]) -> (Vec<u32>, Vec<u32>) {
    let mut ws: Vec<u32> = Vec::new();
    let mut ks: Vec<u32> = Vec::new();
    for row in rows {
        if row.mix.sliding > 0 && !ws.contains(&row.mix.window) {
            ws.push(row.mix.window);
        }
        if !ks.contains(&row.mix.sliding) {
            ks.push(row.mix.sliding);
        }
    }
    ws.sort_unstable();
    ks.sort_unstable();
    (ws, ks)
}

/// The rows of `cell` along W's line (share 0 from the causal model), by share.
fn line<'a>(rows: &'a [Row<'a>], c: &Cell, w: u32, arm: &str) -> Vec<&'a Row<'a>> {
    let mut v: Vec<&Row> = rows
        .iter()
        .filter(|row| {
            row.r.arm == arm && &cell(row) == c && (row.mix.sliding == 0 || row.mix.window == w)
        })
        .collect();
    v.sort_by_key(|row| row.mix.sliding);
    v
}

fn cells(rows: &[Row]) -> Vec<Cell> {
    let mut cs: Vec<Cell> = Vec::new();
    for row in rows {
        let c = cell(row);
        if !cs.contains(&c) {
            cs.push(c);
        }
    }
    cs
}

fn cell_title(c: &Cell, all: &[Cell]) -> String {
    let mut t = format!("corpus {}", c.2);
    if all.iter().any(|o| o.2 == c.2 && o != c) {
        let _ = write!(
            t,
            " · {} · {} · {}K · {} GPUs",
            c.0,
            short_topology(&c.1),
            c.3 / 1024,
            c.4 * c.5
        );
    }
    t
}

impl View<'_> {
    fn tables(&self) -> String {
        let (arms, results, rows, skews) = (self.arms, self.results, &self.rows[..], &self.skews);
        let (ws, _) = axes(rows);
        let cs = cells(rows);
        let others = &arms[1..];
        let base = &arms[0].label;
        let mut t = format!(
            "\n## Skew and speedup by share of sliding-window layers\n\n\
         The first k of every pattern of layers slide (window W keys), the rest are causal. \
         Skew: the CV of each sequence's load summed over the pattern's layers (Σ 2·pairs(ℓ) \
         − ℓ under each layer's mask; Σℓ² per causal layer) over {SKEW_TRIALS} global batches \
         of the point's DP × GA sequences, Libra Eq. 4's bound on R − 1 at Libra's pool size P \
         and random grouping's Monte-Carlo mean; speedups in training tokens/s over {base}.\n\n\
         | corpus | W | sliding share | load CV | Eq. 4 R − 1 | MC R − 1 | P |"
        );
        for a in others {
            let _ = write!(t, " {} |", a.label);
        }
        t += "\n|---|---|---|---|---|---|---|";
        t += &"---|".repeat(others.len());
        t += "\n";
        for c in &cs {
            let title = cell_title(c, &cs).replace("corpus ", "");
            let mut done: Vec<(u32, u32)> = Vec::new();
            for &w in &ws {
                for row in line(rows, c, w, base) {
                    let m = row.mix;
                    let key = (m.sliding, if m.sliding == 0 { 0 } else { m.window });
                    if done.contains(&key) {
                        continue;
                    }
                    done.push(key);
                    let s = skews[&(c.clone(), m.sliding, m.window)];
                    let _ = write!(
                        t,
                        "| {title} | {} | {}/{} | {:.3} | {:.3} | {:.3} | {} |",
                        m.w_text(),
                        m.sliding,
                        m.period,
                        s.0,
                        s.1,
                        s.2,
                        s.3
                    );
                    for a in others {
                        let v = rows
                            .iter()
                            .find(|o| o.r.arm == a.label && cell(o) == *c && o.mix == m)
                            .map(|o| speedup(arms, results, o.r));
                        let _ = write!(t, " {} |", v.map_or("—".into(), |v| format!("{v:.2}x")));
                    }
                    t += "\n";
                }
            }
        }
        t += &format!(
        "\n## When balancing stops paying\n\n\
         Per scheme and W: its best speedup over {base} along the shares, the shares at which \
         it beats {base} (> 1.00×, at two decimals), and the share from which it no longer \
         does at any larger share.\n\n\
         | corpus | W | arm | best speedup (share) | beats {base} at shares | stops paying from share |\n\
         |---|---|---|---|---|---|\n"
    );
        for c in &cs {
            let title = cell_title(c, &cs).replace("corpus ", "");
            for &w in &ws {
                for a in others {
                    let l = line(rows, c, w, &a.label);
                    let sp: Vec<(Mix, f64)> = l
                        .iter()
                        .map(|o| (o.mix, speedup(arms, results, o.r)))
                        .collect();
                    let Some(best) = sp
                        .iter()
                        .copied()
                        .reduce(|b, x| if x.1 > b.1 { x } else { b })
                    else {
                        continue;
                    };
                    let pays = |v: f64| (v * 100.0).round() > 100.0;
                    let share = |m: &Mix| format!("{}/{}", m.sliding, m.period);
                    let paying: Vec<String> = sp
                        .iter()
                        .filter(|x| pays(x.1))
                        .map(|x| share(&x.0))
                        .collect();
                    // the smallest share from which no larger share pays
                    let stops = match sp.iter().rposition(|x| pays(x.1)) {
                        None => "never beats it".to_string(),
                        Some(i) if i + 1 == sp.len() => "pays at the largest share".to_string(),
                        Some(i) => share(&sp[i + 1].0),
                    };
                    let _ = writeln!(
                        t,
                        "| {title} | {w} | {} | {:.2}x ({}) | {} | {} |",
                        a.label,
                        best.1,
                        share(&best.0),
                        if paying.is_empty() {
                            "none".to_string()
                        } else {
                            paying.join(", ")
                        },
                        stops
                    );
                }
            }
        }
        t
    }

    /// plot.svg: one row of panels per cell (corpus), x = the share of sliding-window layers:
    /// the load CV, then each scheme's speedup over the baseline (its flat line at 1), one line
    /// per W.
    fn plot(&self, title: &str) -> String {
        let (arms, results, rows, skews) = (self.arms, self.results, &self.rows[..], &self.skews);
        let (ws, ks) = axes(rows);
        let cs = cells(rows);
        let period = rows.first().map_or(1, |r| r.mix.period);
        let x = |m: &Mix| m.share();
        let x_label = "share of sliding-window layers";
        let ticks: Vec<f64> = ks
            .iter()
            .map(|&k| f64::from(k) / f64::from(period))
            .collect();
        let base = &arms[0].label;
        let (mut lo, mut hi) = (1.0f64, 1.0f64);
        for row in rows {
            let v = speedup(arms, results, row.r);
            if v.is_finite() {
                (lo, hi) = (lo.min(v), hi.max(v));
            }
        }
        let pad = ((hi - lo) * 0.08).max(0.02);
        let cv_hi = skews.values().map(|s| s.0).fold(0.0, f64::max);
        let mut grid = Grid::new(format!(
            "{title}: skew and speedup over {base} against the share of sliding-window layers \
         (one line per window W), per corpus (rows)"
        ))
        .columns(arms.len());
        let w_name = |w: u32| format!("W = {}K", w / 1024);
        for c in &cs {
            let head = cell_title(c, &cs);
            let mut chart = Chart::new(format!("{head} · skew"))
                .x(x_label, Scale::Linear)
                .y("CV of per-sequence load", Scale::Linear)
                .x_range(-0.05, 1.05)
                .x_ticks(ticks.clone())
                .y_range(0.0, cv_hi * 1.08 + 0.02)
                .size(420.0, 340.0);
            for (wi, &w) in ws.iter().enumerate() {
                let pts: Vec<(f64, f64)> = line(rows, c, w, base)
                    .iter()
                    .map(|o| {
                        (
                            x(&o.mix),
                            skews[&(c.clone(), o.mix.sliding, o.mix.window)].0,
                        )
                    })
                    .collect();
                chart = chart.series(Series::line(w_name(w), pts).color(palette(wi)));
            }
            grid = grid.panel(chart);
            for a in &arms[1..] {
                let mut chart = Chart::new(format!("{head} · {}", a.label))
                    .x(x_label, Scale::Linear)
                    .y(format!("speedup over {base} (×)"), Scale::Linear)
                    .x_range(-0.05, 1.05)
                    .x_ticks(ticks.clone())
                    .y_range(lo - pad, hi + pad)
                    .size(420.0, 340.0);
                chart = chart.series(
                    Series::line(
                        format!("{base} (baseline = 1)"),
                        vec![(0.0, 1.0), (1.0, 1.0)],
                    )
                    .color("#808080"),
                );
                for (wi, &w) in ws.iter().enumerate() {
                    let pts: Vec<(f64, f64)> = line(rows, c, w, &a.label)
                        .iter()
                        .map(|o| (x(&o.mix), speedup(arms, results, o.r)))
                        .collect();
                    chart = chart.series(Series::line(w_name(w), pts).color(palette(wi)));
                }
                grid = grid.panel(chart);
            }
        }
        grid.render()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(shares: &[f64], windows: &[i64], period: Option<u32>) -> MixFile {
        MixFile {
            sliding_share: shares.to_vec(),
            window: windows.to_vec(),
            period,
        }
    }

    fn field(e: crate::error::Error) -> String {
        match e.root() {
            crate::error::Error::Invalid { field, value, .. } => format!("{field} = {value}"),
            other => panic!("not a named error: {other}"),
        }
    }

    /// Share 0 once, then each W's positive shares; the patterns by hand.
    #[test]
    fn mixes_and_patterns_by_hand() {
        let m = mixes(&file(&[0.0, 0.5, 1.0], &[4096, 65536], None), 4).unwrap();
        let got: Vec<(u32, u32)> = m.iter().map(|m| (m.sliding, m.window)).collect();
        assert_eq!(
            got,
            [(0, 4096), (2, 4096), (4, 4096), (2, 65536), (4, 65536)]
        );
        let p = m[1].pattern();
        let w = Mask::Sliding { w: 4096 };
        assert_eq!(
            (0..8).map(|l| p.mask_of(l)).collect::<Vec<_>>(),
            [
                w,
                w,
                Mask::Causal,
                Mask::Causal,
                w,
                w,
                Mask::Causal,
                Mask::Causal
            ]
        );
        assert_eq!(m[0].pattern().classes(4), [(Mask::Causal, 4)]);
        assert_eq!(m[2].pattern().classes(4), [(w, 4)]);
        assert_eq!(m[1].label("llama3-8b"), "llama3-8b · 2/4 sliding:4096");
        assert_eq!(m[0].label("llama3-8b"), "llama3-8b · causal");
        // a period of 2 over 4 layers: a quarter does not tile it
        let m = mixes(&file(&[0.5], &[8], Some(2)), 4).unwrap();
        assert_eq!((m[0].sliding, m[0].period), (1, 2));
    }

    /// Bad input: W ≤ 0, a share outside 0..=1 or not a whole number of layers, a period
    /// that does not tile the layers, empty lists, repeats, a model with its own pattern.
    #[test]
    fn bad_mixes_are_named() {
        let bad = |f: MixFile| field(mixes(&f, 4).unwrap_err());
        assert_eq!(
            bad(file(&[0.5], &[0], None)),
            "[sweep.attention] window = 0"
        );
        assert_eq!(
            bad(file(&[0.5], &[-4096], None)),
            "[sweep.attention] window = -4096"
        );
        assert_eq!(
            bad(file(&[0.3], &[64], None)),
            "[sweep.attention] sliding_share = 0.3"
        );
        assert_eq!(
            bad(file(&[1.5], &[64], None)),
            "[sweep.attention] sliding_share = 1.5"
        );
        assert_eq!(
            bad(file(&[f64::NAN], &[64], None)),
            "[sweep.attention] sliding_share = NaN"
        );
        assert_eq!(
            bad(file(&[0.5, 0.5], &[64], None)),
            "[sweep.attention] sliding_share = 0.5"
        );
        assert_eq!(
            bad(file(&[0.5], &[64, 64], None)),
            "[sweep.attention] window = 64"
        );
        assert_eq!(
            bad(file(&[], &[64], None)),
            "[sweep.attention] sliding_share = []"
        );
        assert_eq!(
            bad(file(&[0.5], &[], None)),
            "[sweep.attention] window = []"
        );
        assert_eq!(
            bad(file(&[0.5], &[64], Some(0))),
            "[sweep.attention] period = 0"
        );
        assert_eq!(
            bad(file(&[0.5], &[64], Some(3))),
            "[sweep.attention] period = 3"
        );
        let mut m = ModelConfig::builtin("llama3-8b").unwrap();
        let mix = mixes(&file(&[0.5], &[64], None), 4).unwrap()[0];
        m = apply(m, "llama3-8b", &mix).unwrap();
        assert_eq!(m.attention, mix.pattern());
        assert_eq!(
            field(apply(m, "swa.toml", &mix).unwrap_err()),
            "[sweep.attention] model = swa.toml"
        );
    }
}
