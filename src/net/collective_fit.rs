//! The collective model against measured collectives: nccl-tests-style rows (op, GPUs,
//! bytes, time), each priced by [`CollectiveModel`] on a topology, and a per-algorithm
//! latency and bandwidth fitted to them.
//!
//! A row's *algorithm* is the one the model picks for it on the topology (NCCL's choice:
//! ring, NVLS, tree or PAT for all-gather, reduce-scatter and all-reduce; all-to-all and
//! all-to-all-v are grouped send/recv, `p2p`). Its *port bytes* are what the model puts on
//! the most loaded GPU port: the largest transfer of the lowered phase (each GPU sends one,
//! shift by one) for the NCCL algorithms in their Simple protocol (a fitted line stands
//! for the algorithm's bulk protocol), a GPU's sends to the others for the all-to-alls.
//! The fitted price of a row is `latency + port bytes / bandwidth` of its algorithm: the
//! model's own form (its latency table + the bottleneck link's bytes ÷ its achieved
//! capacity) with both numbers measured instead of taken from NCCL's table and the
//! topology's link efficiency. Fitted by least squares on relative error (weights 1/t²),
//! latency kept ≥ 0.
//!
//! Row sizes are nccl-tests': all-gather the gathered output, reduce-scatter one rank's
//! input, all-reduce the buffer, all-to-all one rank's send buffer (S/N to each rank). For
//! all-to-all-v, S is one rank's send buffer, rank i sending rank j the share
//! (1 + (j − i) mod N) / (N(N+1)/2) of it in bf16 elements — the pattern of
//! `validate/torch/collectives.py`.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::cluster::topology::CollectiveFitSpec;
use crate::cluster::{Topology, TopologySpec};
use crate::error::{invalid, parse_error, Result};
use crate::net::analytical::AnalyticalModel;
use crate::net::collective::{
    analytical_phases, lower, lower_alltoallv, lowered_time, Algo, CollOp, Collective,
    CollectiveModel, Proto,
};
use crate::net::GpuId;

/// Largest size of a row, bytes (1 TiB).
pub const MAX_ROW_BYTES: u64 = 1 << 40;
/// Most GPUs of a row.
pub const MAX_ROW_GPUS: u32 = 4096;

/// A measured operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CollMeasureOp {
    /// nccl-tests `all_gather_perf`.
    AllGather,
    /// nccl-tests `reduce_scatter_perf`.
    ReduceScatter,
    /// nccl-tests `all_reduce_perf`.
    AllReduce,
    /// nccl-tests `alltoall_perf`: equal parts to every peer.
    AllToAll,
    /// An all-to-all with unequal parts (all-to-all-v).
    AllToAllV,
}

impl CollMeasureOp {
    /// The names rows use (nccl-tests' and PyTorch's).
    pub const NAMES: [&'static str; 5] = [
        "all_gather",
        "reduce_scatter",
        "all_reduce",
        "all_to_all",
        "all_to_all_v",
    ];

    /// The op of `name`.
    pub fn parse(name: &str) -> Option<Self> {
        use CollMeasureOp::*;
        let all = [AllGather, ReduceScatter, AllReduce, AllToAll, AllToAllV];
        Self::NAMES.iter().position(|n| *n == name).map(|i| all[i])
    }

    /// The name rows use.
    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    /// The NCCL collective of the op (`None`: the all-to-alls, grouped send/recv).
    pub fn coll_op(self) -> Option<CollOp> {
        match self {
            CollMeasureOp::AllGather => Some(CollOp::AllGather),
            CollMeasureOp::ReduceScatter => Some(CollOp::ReduceScatter),
            CollMeasureOp::AllReduce => Some(CollOp::AllReduce),
            CollMeasureOp::AllToAll | CollMeasureOp::AllToAllV => None,
        }
    }
}

/// One measured collective.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CollRow {
    /// The collective measured.
    pub op: CollMeasureOp,
    /// GPUs taking part.
    pub gpus: u32,
    /// nccl-tests size, bytes.
    pub bytes: u64,
    /// Measured time, µs.
    pub time_us: f64,
}

/// Rows of a CSV whose header names `op`, `gpus`, `bytes` and `time_us` (other columns are
/// read past; `#` lines are comments). A row with an empty `time_us` and a `busbw_gbs`
/// (published figures) gets the time that bus bandwidth means. Every field is checked:
/// ops by name, 1 ≤ gpus ≤ [`MAX_ROW_GPUS`], 1 ≤ bytes ≤ [`MAX_ROW_BYTES`], times finite
/// and > 0.
pub fn rows_from_csv(text: &str, source: &str) -> Result<Vec<CollRow>> {
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.starts_with('#') && !l.trim().is_empty());
    let (_, header) = lines
        .next()
        .ok_or_else(|| parse_error(source, "empty file: a header line op,gpus,bytes,time_us"))?;
    let cols: Vec<&str> = header.split(',').map(str::trim).collect();
    let col = |name: &str| {
        cols.iter()
            .position(|c| *c == name)
            .ok_or_else(|| parse_error(source, format!("no `{name}` column in the header")))
    };
    let (c_op, c_gpus, c_bytes, c_time) =
        (col("op")?, col("gpus")?, col("bytes")?, col("time_us")?);
    let c_busbw = cols.iter().position(|c| *c == "busbw_gbs");
    let mut rows = Vec::new();
    for (i, line) in lines {
        let at = format!("{source} line {}", i + 1);
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let get = |c: usize| {
            f.get(c).copied().ok_or_else(|| {
                parse_error(
                    &at,
                    format!("{} fields, header has {}", f.len(), cols.len()),
                )
            })
        };
        let op = CollMeasureOp::parse(get(c_op)?).ok_or_else(|| {
            invalid(
                format!("{at}: op"),
                get(c_op).unwrap_or_default(),
                CollMeasureOp::NAMES.join(", "),
            )
        })?;
        let gpus: u32 = get(c_gpus)?
            .parse()
            .ok()
            .filter(|g| (1..=MAX_ROW_GPUS).contains(g))
            .ok_or_else(|| {
                invalid(
                    format!("{at}: gpus"),
                    get(c_gpus).unwrap_or_default(),
                    format!("an integer in [1, {MAX_ROW_GPUS}]"),
                )
            })?;
        let bytes: u64 = get(c_bytes)?
            .parse()
            .ok()
            .filter(|b| (1..=MAX_ROW_BYTES).contains(b))
            .ok_or_else(|| {
                invalid(
                    format!("{at}: bytes"),
                    get(c_bytes).unwrap_or_default(),
                    format!("an integer in [1, {MAX_ROW_BYTES}]"),
                )
            })?;
        let positive = |field: &str, v: &str| -> Result<f64> {
            v.parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x > 0.0)
                .ok_or_else(|| invalid(format!("{at}: {field}"), v, "a finite number > 0"))
        };
        let t = get(c_time)?;
        let time_us = match (t.is_empty(), c_busbw) {
            (false, _) => positive("time_us", t)?,
            (true, Some(c)) => {
                let busbw = positive("busbw_gbs (time_us is empty)", get(c)?)?;
                let algbw = busbw / bus_factor(op, gpus).max(f64::MIN_POSITIVE);
                bytes as f64 / (algbw * 1e3)
            }
            (true, None) => positive("time_us", t)?,
        };
        rows.push(CollRow {
            op,
            gpus,
            bytes,
            time_us,
        });
    }
    if rows.is_empty() {
        return Err(parse_error(source, "no rows after the header"));
    }
    Ok(rows)
}

/// nccl-tests' bus-bandwidth factor of a row.
fn bus_factor(op: CollMeasureOp, n: u32) -> f64 {
    match op {
        CollMeasureOp::AllReduce => Collective::AllReduce.bus_factor(n as usize),
        _ => Collective::AllGather.bus_factor(n as usize),
    }
}

/// How the model sees one row.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Priced {
    /// The algorithm (NCCL's name, or `p2p` for the all-to-alls).
    pub algo: &'static str,
    /// Bytes on the most loaded GPU port.
    pub port_bytes: f64,
    /// The model's time, µs (NCCL's latency table, the topology's links).
    pub model_us: f64,
}

/// The all-to-all-v matrix of a row (bytes rank i sends rank j).
fn alltoallv_matrix(n: usize, bytes: u64) -> Vec<Vec<u64>> {
    let elems = bytes / 2;
    let tot = (n * (n + 1) / 2) as u64;
    let unit = elems / tot;
    (0..n)
        .map(|i| {
            let mut row: Vec<u64> = (0..n)
                .map(|j| 2 * unit * (1 + ((j + n - i) % n) as u64))
                .collect();
            let sent: u64 = row.iter().sum();
            row[i] += 2 * elems - sent;
            row
        })
        .collect()
}

/// Price `row` on GPUs 0..gpus of `topo` (consecutive, node-major). Rows on one GPU move
/// nothing over a link: an error naming the row.
pub fn price(row: &CollRow, topo: &Arc<Topology>, coll: &CollectiveModel) -> Result<Priced> {
    let n = row.gpus as usize;
    if n < 2 {
        return Err(invalid(
            "gpus",
            n,
            "at least 2 (on one GPU a collective crosses no link: nothing to fit)",
        ));
    }
    if row.gpus > topo.gpus() {
        return Err(invalid(
            "gpus",
            row.gpus,
            format!("at most the topology's {} GPUs", topo.gpus()),
        ));
    }
    let group: Vec<GpuId> = (0..row.gpus).collect();
    let mut net = AnalyticalModel::new(topo.clone());
    let ps_us = |ps: u64| ps as f64 * 1e-6;
    Ok(match row.op.coll_op() {
        Some(op) => {
            // the algorithm and port bytes in the bulk protocol, the one a fitted line
            // prices; the time in the protocol NCCL's choice gives
            let lw = coll.lower_in(&[Proto::Simple], op, &group, row.bytes, topo.gpus_per_node);
            let chosen = coll.lower(op, &group, row.bytes, topo.gpus_per_node);
            Priced {
                algo: lw.algo.name(),
                port_bytes: lw.xfers.iter().map(|t| t.bytes).max().unwrap_or(0) as f64,
                model_us: ps_us(lowered_time(&mut net, &chosen, 0)),
            }
        }
        None => {
            let phases = if row.op == CollMeasureOp::AllToAll {
                lower(Collective::AllToAll, &group, row.bytes)?
            } else {
                lower_alltoallv(&group, &alltoallv_matrix(n, row.bytes))?
            };
            let mut sent = vec![0u64; n];
            for t in phases.iter().flatten() {
                sent[t.src as usize] += t.bytes;
            }
            Priced {
                algo: "p2p",
                port_bytes: sent.into_iter().max().unwrap_or(0) as f64,
                model_us: ps_us(analytical_phases(&net, &phases, 0)),
            }
        }
    })
}

/// One algorithm's fitted latency and bandwidth.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AlgoFit {
    /// The algorithm NCCL's choice gives these rows (ring, tree, NVLS, PAT).
    pub algo: &'static str,
    /// Rows fitted.
    pub rows: usize,
    /// µs.
    pub latency_us: f64,
    /// Achieved bytes per second of the bottleneck port, GB/s.
    pub bandwidth_gbs: f64,
}

impl AlgoFit {
    /// The fitted time of `port_bytes`, µs.
    pub fn predict_us(&self, port_bytes: f64) -> f64 {
        self.latency_us + port_bytes / (self.bandwidth_gbs * 1e3)
    }
}

/// What a `skewsim calibrate --collectives -o FILE` report sets in `spec`: its fitted
/// model parameters ([`ParamFit::apply_to`]) where it has them, else its per-algorithm
/// lines as `[[collectives.fit]]` (replacing the file's). Checked again when `spec` is
/// validated.
pub fn apply_report(text: &str, source: &str, spec: &mut TopologySpec) -> Result<()> {
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| parse_error(source, format!("not JSON: {e}")))?;
    match v.get("params") {
        Some(p) => serde_json::from_value::<ParamFit>(p.clone())
            .map_err(|e| parse_error(source, format!("params: {e}")))?
            .apply_to(spec),
        None => spec.collectives.fit = fit_specs(&v, source)?,
    }
    Ok(())
}

/// The `fit` of a report as topology `[[collectives.fit]]` entries (each checked when the
/// topology is validated). An entry of `p2p` (the all-to-alls) is not a collective
/// algorithm and is left out.
fn fit_specs(v: &serde_json::Value, source: &str) -> Result<Vec<CollectiveFitSpec>> {
    let fit = v.get("fit").and_then(|f| f.as_array()).ok_or_else(|| {
        parse_error(
            source,
            "no `fit` array (expected the -o report of `skewsim calibrate --collectives`)",
        )
    })?;
    let mut out = Vec::new();
    for (i, e) in fit.iter().enumerate() {
        let field = |name: &str| {
            e.get(name)
                .ok_or_else(|| parse_error(source, format!("fit[{i}]: no `{name}` field")))
        };
        let algo = field("algo")?.as_str().ok_or_else(|| {
            invalid(
                format!("{source}: fit[{i}].algo"),
                field("algo").map(|v| v.to_string()).unwrap_or_default(),
                "a string",
            )
        })?;
        let num = |name: &str| -> Result<f64> {
            let v = field(name)?;
            v.as_f64().ok_or_else(|| {
                invalid(
                    format!("{source}: fit[{i}].{name}"),
                    v.to_string(),
                    "a number",
                )
            })
        };
        if algo == "p2p" {
            continue;
        }
        out.push(CollectiveFitSpec {
            algo: algo.to_string(),
            latency_us: num("latency_us")?,
            bandwidth_gbyte_s: num("bandwidth_gbs")?,
        });
    }
    Ok(out)
}

/// Fit `latency + port bytes / bandwidth` per algorithm to (algorithm, port bytes, measured
/// µs) points, minimising the squared relative error, latency ≥ 0. An algorithm needs two
/// distinct sizes; the error names one that has fewer, or whose bytes do not take longer.
pub fn fit(points: &[(&'static str, f64, f64)]) -> Result<Vec<AlgoFit>> {
    let mut algos: Vec<&'static str> = points.iter().map(|p| p.0).collect();
    algos.sort_unstable();
    algos.dedup();
    let mut out = Vec::new();
    for a in algos {
        let pts: Vec<(f64, f64)> = points
            .iter()
            .filter(|p| p.0 == a)
            .map(|p| (p.1, p.2))
            .collect();
        two_sizes(a, pts.iter().map(|p| p.0 as u64))?;
        // weighted least squares of m = l + b·x with weights 1/m²
        let (mut s1, mut sx, mut sxx, mut sm, mut sxm) = (0.0, 0.0, 0.0, 0.0, 0.0);
        for &(x, m) in &pts {
            let w = 1.0 / (m * m);
            s1 += w;
            sx += w * x;
            sxx += w * x * x;
            sm += w * m;
            sxm += w * x * m;
        }
        let det = s1 * sxx - sx * sx;
        let (mut l, mut b) = ((sm * sxx - sx * sxm) / det, (s1 * sxm - sx * sm) / det);
        if l.is_nan() || l < 0.0 {
            l = 0.0;
            b = sxm / sxx;
        }
        if !(b > 0.0 && b.is_finite()) {
            return Err(invalid(
                format!("rows of algorithm {a}"),
                format!("time per byte {b:e} µs"),
                "larger sizes taking longer (a positive bandwidth)",
            ));
        }
        out.push(AlgoFit {
            algo: a,
            rows: pts.len(),
            latency_us: l,
            bandwidth_gbs: 1.0 / b * 1e-3,
        });
    }
    Ok(out)
}

/// The collective model's own parameters fitted to measured rows ([`fit_params`]): what
/// a topology file's `[nvlink]` and `[collectives]` sections take.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ParamFit {
    /// Rows NCCL's choice runs as rings, inside one NVLink domain: they give
    /// `nvlink_efficiency` and `latency_scale`.
    pub ring_rows: usize,
    /// Rows it runs as NVLS: they give `sharp_efficiency` and `nvls_copy_us`.
    pub nvls_rows: usize,
    /// `[nvlink] efficiency`.
    pub nvlink_efficiency: f64,
    /// `[collectives] latency_scale`.
    pub latency_scale: f64,
    /// `[nvlink] sharp_efficiency` (the topology's own where no row runs NVLS).
    pub sharp_efficiency: Option<f64>,
    /// `[collectives] nvls_copy_us` (the topology's own where no row runs NVLS or it has
    /// no `nvls_channels`).
    pub nvls_copy_us: Option<f64>,
    /// Rounds of choosing and fitting until NCCL's choice for every row stood still (at
    /// most [`MAX_ROUNDS`]).
    pub rounds: usize,
}

impl ParamFit {
    /// The parameters of `spec`, before any fit.
    fn of(spec: &TopologySpec) -> Self {
        ParamFit {
            ring_rows: 0,
            nvls_rows: 0,
            nvlink_efficiency: spec.nvlink.efficiency,
            latency_scale: spec.collectives.latency_scale,
            sharp_efficiency: spec.nvlink.sharp_efficiency,
            nvls_copy_us: spec.collectives.nvls_copy_us,
            rounds: 0,
        }
    }

    /// Set in `spec` the parameters rows were fitted to: the ring's where ring rows were
    /// fitted, NVLS's where NVLS rows were; the rest stays the file's.
    pub fn apply_to(&self, spec: &mut TopologySpec) {
        if self.ring_rows > 0 {
            spec.nvlink.efficiency = self.nvlink_efficiency;
            spec.collectives.latency_scale = self.latency_scale;
        }
        if self.nvls_rows > 0 {
            spec.nvlink.sharp_efficiency = self.sharp_efficiency;
            if self.nvls_copy_us.is_some() {
                spec.collectives.nvls_copy_us = self.nvls_copy_us;
            }
        }
    }

    /// `spec` with all these parameters, fitted or not.
    fn applied(&self, spec: &TopologySpec) -> TopologySpec {
        let mut s = spec.clone();
        s.nvlink.efficiency = self.nvlink_efficiency;
        s.collectives.latency_scale = self.latency_scale;
        s.nvlink.sharp_efficiency = self.sharp_efficiency;
        s.collectives.nvls_copy_us = self.nvls_copy_us;
        s
    }
}

/// The fewest nodes of `spec` that hold `gpus` GPUs, in whole multi-node NVLink domains
/// where it has them.
pub fn nodes_for(spec: &TopologySpec, gpus: u32) -> u32 {
    let nodes = gpus.div_ceil(spec.gpus_per_node.max(1)).max(1);
    match &spec.super_node {
        Some(s) => nodes
            .div_ceil(s.nodes.max(1))
            .saturating_mul(s.nodes.max(1)),
        None => nodes,
    }
}

/// Most rounds of choosing and fitting in [`fit_params`].
pub const MAX_ROUNDS: usize = 8;
/// The smallest latency scale a fit gives (a topology's must be > 0).
const MIN_LATENCY_SCALE: f64 = 1e-3;
/// A latency-scale probe, and an inverse-efficiency probe as a factor: the model's time is
/// linear in the latency scale and, at a fixed algorithm and protocol, in 1 / efficiency
/// (LL's rate cap aside, which a small probe does not cross).
const SCALE_STEP: f64 = 0.1;
const INV_EFF_STEP: f64 = 1.01;
/// A chunk-copy probe, µs.
const COPY_STEP_US: f64 = 0.1;
/// The largest chunk-copy cost a fit gives, µs (a topology's `nvls_copy_us` limit).
const MAX_COPY_US: f64 = 1e6;

/// Fit the collective model's own parameters to `rows` on `spec` (NVLS allowed when
/// `nvls`): the form that prices every size, rather than one line per algorithm
/// ([`fit`]). Rows of all-gather, reduce-scatter and all-reduce inside one NVLink domain
/// are fitted; the all-to-alls and rows across domains are left to the topology's figures.
/// Each row is run as NCCL's choice gives it on the current parameters (algorithm and
/// protocol); with that choice held, its time is `a + latency_scale · L + B /
/// efficiency` (ring) or `a' + B' / sharp_efficiency + nvls_copy_us · K` (NVLS), the
/// coefficients read off the model itself by probing each parameter. Least squares on
/// relative error, the ring first, then NVLS at the ring's latency scale; efficiencies
/// kept in (0, 1], the latency scale and the copy cost ≥ 0. The choice is made again on
/// the fitted parameters, until it stands still. An algorithm with rows of fewer than two
/// sizes is an error naming it.
pub fn fit_params(spec: &TopologySpec, rows: &[CollRow], nvls: bool) -> Result<ParamFit> {
    let mut spec = spec.clone();
    spec.collectives.fit.clear();
    let most = rows.iter().map(|r| r.gpus).max().unwrap_or(2);
    let nodes = nodes_for(&spec, most);
    let build = |s: &TopologySpec| -> Result<(Arc<Topology>, CollectiveModel)> {
        let t = Arc::new(s.build(Some(nodes))?);
        let c = CollectiveModel::of(&t, nvls);
        Ok((t, c))
    };
    let domain = build(&spec)?.1.domain_gpus().unwrap_or(0);
    let fitted: Vec<(CollOp, &CollRow)> = rows
        .iter()
        .filter(|r| (2..=domain).contains(&r.gpus))
        .filter_map(|r| Some((r.op.coll_op()?, r)))
        .collect();
    let group = |r: &CollRow| (0..r.gpus).collect::<Vec<GpuId>>();
    let mut fit = ParamFit::of(&spec);
    let mut choice: Vec<(Algo, Proto)> = Vec::new();
    for round in 1..=MAX_ROUNDS {
        let (t, c) = build(&fit.applied(&spec))?;
        let now: Vec<(Algo, Proto)> = fitted
            .iter()
            .map(|(op, r)| {
                let lw = c.lower(*op, &group(r), r.bytes, t.gpus_per_node);
                (lw.algo, lw.proto)
            })
            .collect();
        if now == choice {
            break;
        }
        choice = now;
        fit.rounds = round;
        // The rows `algo` runs, timed on `base` with `set` applied, µs.
        let times = |base: &TopologySpec,
                     algo: Algo,
                     set: &dyn Fn(&mut TopologySpec)|
         -> Result<Vec<f64>> {
            let mut s = base.clone();
            set(&mut s);
            let (t, c) = build(&s)?;
            let mut net = AnalyticalModel::new(t.clone());
            let mut out = Vec::new();
            for (&(op, r), &(a, p)) in fitted.iter().zip(&choice) {
                if a != algo {
                    continue;
                }
                let lw = c
                    .lower_as(a, p, op, &group(r), r.bytes, t.gpus_per_node)
                    .ok_or_else(|| {
                        invalid(
                            format!("{} on {} GPUs, {} bytes", r.op.name(), r.gpus, r.bytes),
                            format!("{} {}", a.name(), p.name()),
                            "an algorithm and protocol the group can run",
                        )
                    })?;
                out.push(lowered_time(&mut net, &lw, 0) as f64 * 1e-6);
            }
            Ok(out)
        };
        let measured = |algo: Algo| -> Vec<&CollRow> {
            fitted
                .iter()
                .zip(&choice)
                .filter(|(_, c)| c.0 == algo)
                .map(|(f, _)| f.1)
                .collect()
        };
        let ring = measured(Algo::Ring);
        fit.ring_rows = ring.len();
        if !ring.is_empty() {
            two_sizes("ring", ring.iter().map(|r| r.bytes))?;
            let (s, u) = (fit.latency_scale, 1.0 / fit.nvlink_efficiency);
            let base = fit.applied(&spec);
            let t0 = times(&base, Algo::Ring, &|_| {})?;
            let ts = times(&base, Algo::Ring, &|p| {
                p.collectives.latency_scale = s + SCALE_STEP;
            })?;
            let tu = times(&base, Algo::Ring, &|p| {
                p.nvlink.efficiency = 1.0 / (u * INV_EFF_STEP);
            })?;
            let pts = linear_parts(
                &ring,
                &t0,
                [&ts, &tu],
                [s, u],
                [SCALE_STEP, u * (INV_EFF_STEP - 1.0)],
            );
            let [s, u] = wls2(&pts, [MIN_LATENCY_SCALE, 1.0], [1e6, f64::INFINITY]);
            fit.latency_scale = s;
            fit.nvlink_efficiency = 1.0 / u;
        }
        let nv = measured(Algo::Nvls);
        fit.nvls_rows = nv.len();
        if let (false, Some(e)) = (nv.is_empty(), fit.sharp_efficiency) {
            two_sizes("NVLS", nv.iter().map(|r| r.bytes))?;
            let (v, k) = (1.0 / e, fit.nvls_copy_us.unwrap_or(0.0));
            let base = fit.applied(&spec);
            let t0 = times(&base, Algo::Nvls, &|_| {})?;
            let tv = times(&base, Algo::Nvls, &|p| {
                p.nvlink.sharp_efficiency = Some(1.0 / (v * INV_EFF_STEP));
            })?;
            // the copy cost is a parameter only where the topology counts NVLS channels
            let copies = spec.collectives.nvls_channels.is_some();
            let tk = if copies {
                times(&base, Algo::Nvls, &|p| {
                    p.collectives.nvls_copy_us = Some(k + COPY_STEP_US);
                })?
            } else {
                t0.clone()
            };
            let pts = linear_parts(
                &nv,
                &t0,
                [&tv, &tk],
                [v, k],
                [v * (INV_EFF_STEP - 1.0), COPY_STEP_US],
            );
            let (lo_k, hi_k) = if copies { (0.0, MAX_COPY_US) } else { (k, k) };
            let [v, k] = wls2(&pts, [1.0, lo_k], [f64::INFINITY, hi_k]);
            fit.sharp_efficiency = Some(1.0 / v);
            fit.nvls_copy_us = copies.then_some(k);
        }
    }
    Ok(fit)
}

/// An error naming `algo` unless its rows have at least two distinct `sizes`.
fn two_sizes(algo: &str, sizes: impl Iterator<Item = u64>) -> Result<()> {
    let mut sizes: Vec<u64> = sizes.collect();
    sizes.sort_unstable();
    sizes.dedup();
    if sizes.len() < 2 {
        return Err(invalid(
            format!("rows of algorithm {algo}"),
            format!("{} distinct size(s)", sizes.len()),
            "at least 2 distinct sizes to fit two parameters (a latency and a rate)",
        ));
    }
    Ok(())
}

/// Each row's (constant, coefficient of p1, coefficient of p2, measured µs) from its time
/// `t0` at parameters `p` and its times `probes` with one parameter moved by `step`.
fn linear_parts(
    rows: &[&CollRow],
    t0: &[f64],
    probes: [&[f64]; 2],
    p: [f64; 2],
    step: [f64; 2],
) -> Vec<[f64; 4]> {
    (0..rows.len())
        .map(|i| {
            let x = [
                (probes[0][i] - t0[i]) / step[0],
                (probes[1][i] - t0[i]) / step[1],
            ];
            [
                t0[i] - p[0] * x[0] - p[1] * x[1],
                x[0],
                x[1],
                rows[i].time_us,
            ]
        })
        .collect()
}

/// `[p1, p2]` in the box `lo..=hi` minimising Σ ((a + p1·x1 + p2·x2 − t) / t)² over
/// `pts` = (a, x1, x2, t): the unconstrained optimum when it lies in the box, else the
/// best of the optima along its edges (the objective is a convex quadratic).
fn wls2(pts: &[[f64; 4]], lo: [f64; 2], hi: [f64; 2]) -> [f64; 2] {
    let (mut m, mut v) = ([[0.0f64; 2]; 2], [0.0f64; 2]);
    for &[a, x1, x2, t] in pts {
        let (w, x, y) = (1.0 / (t * t), [x1, x2], t - a);
        for i in 0..2 {
            v[i] += w * x[i] * y;
            for j in 0..2 {
                m[i][j] += w * x[i] * x[j];
            }
        }
    }
    let obj = |p: [f64; 2]| {
        p[0] * p[0] * m[0][0] + 2.0 * p[0] * p[1] * m[0][1] + p[1] * p[1] * m[1][1]
            - 2.0 * (p[0] * v[0] + p[1] * v[1])
    };
    let inside = |p: [f64; 2]| (0..2).all(|i| p[i] >= lo[i] && p[i] <= hi[i] && p[i].is_finite());
    let det = m[0][0] * m[1][1] - m[0][1] * m[1][0];
    let mut cands = Vec::new();
    if det > 1e-12 * m[0][0] * m[1][1] {
        cands.push([
            (v[0] * m[1][1] - v[1] * m[0][1]) / det,
            (m[0][0] * v[1] - m[1][0] * v[0]) / det,
        ]);
    }
    for i in 0..2 {
        let j = 1 - i;
        for b in [lo[i], hi[i]].into_iter().filter(|b| b.is_finite()) {
            let free = if m[j][j] > 0.0 {
                (v[j] - m[j][i] * b) / m[j][j]
            } else {
                lo[j]
            };
            let mut p = [0.0; 2];
            p[i] = b;
            p[j] = free.clamp(lo[j], hi[j]);
            cands.push(p);
        }
    }
    cands
        .into_iter()
        .filter(|&p| inside(p))
        .min_by(|a, b| obj(*a).total_cmp(&obj(*b)))
        .unwrap_or(lo)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::TopologySpec;

    fn node(gpus: u32) -> Arc<Topology> {
        let text = include_str!("../../topologies/dgx-h200-roce.toml");
        let spec = TopologySpec::parse(text, "dgx-h200-roce.toml").unwrap();
        Arc::new(spec.build(Some(nodes_for(&spec, gpus))).unwrap())
    }

    #[test]
    fn rows_get_whole_nodes_and_whole_nvlink_domains() {
        let dgx = include_str!("../../topologies/dgx-h200-roce.toml");
        let dgx = TopologySpec::parse(dgx, "dgx-h200-roce.toml").unwrap();
        let gb = include_str!("../../topologies/gb200-nvl72.toml");
        let gb = TopologySpec::parse(gb, "gb200-nvl72.toml").unwrap();
        let got: Vec<u32> = [
            (&dgx, 1),
            (&dgx, 8),
            (&dgx, 9),
            (&gb, 8),
            (&gb, 72),
            (&gb, 73),
        ]
        .iter()
        .map(|&(s, g)| nodes_for(s, g))
        .collect();
        assert_eq!(got, [1, 1, 2, 18, 18, 36]);
        // an 8-GPU row on an NVL72 topology is priced, inside one rack
        let t = Arc::new(gb.build(Some(nodes_for(&gb, 8))).unwrap());
        let row = CollRow {
            op: CollMeasureOp::AllGather,
            gpus: 8,
            bytes: 1 << 30,
            time_us: 1.0,
        };
        assert_eq!(
            price(&row, &t, &CollectiveModel::of(&t, false))
                .unwrap()
                .algo,
            "ring"
        );
    }

    #[test]
    fn rows_are_checked_by_field() {
        let ok = "op,gpus,bytes,time_us,busbw_gbs\nall_gather,8,8388608,40.5,\nall_reduce,8,1073741824,,400\n";
        let r = rows_from_csv(ok, "c.csv").unwrap();
        assert_eq!(r.len(), 2);
        // the published-figures form: time from bus bandwidth, 2(n-1)/n for all-reduce
        let want = 1073741824.0 / (400.0 / 1.75 * 1e3);
        assert!(
            (r[1].time_us - want).abs() < 1e-6 * want,
            "{}",
            r[1].time_us
        );
        for (bad, field) in [
            ("op,gpus,bytes,time_us\nbroadcast,8,8,1\n", "op"),
            ("op,gpus,bytes,time_us\nall_gather,0,8,1\n", "gpus"),
            ("op,gpus,bytes,time_us\nall_gather,8,0,1\n", "bytes"),
            ("op,gpus,bytes,time_us\nall_gather,8,8,NaN\n", "time_us"),
            ("op,gpus,bytes,time_us\nall_gather,8,8,-1\n", "time_us"),
            ("op,gpus,bytes\nall_gather,8,8\n", "time_us"),
            ("op,gpus,bytes,time_us\n", "no rows"),
        ] {
            let e = rows_from_csv(bad, "c.csv").unwrap_err().to_string();
            assert!(e.contains(field) && e.contains("c.csv"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_model_prices_rows_by_its_own_algorithm_choice() {
        let t = node(8);
        let off = CollectiveModel::of(&t, false);
        let row = |op, gpus, bytes| CollRow {
            op,
            gpus,
            bytes,
            time_us: 1.0,
        };
        // Ring all-gather on 8 GPUs: each port carries 7/8 S.
        let p = price(&row(CollMeasureOp::AllGather, 8, 8 << 20), &t, &off).unwrap();
        assert_eq!(
            (p.algo, p.port_bytes),
            ("ring", (7 * (8u64 << 20) / 8) as f64)
        );
        // All-to-all: a GPU sends S/N to each of the other 7.
        let p = price(&row(CollMeasureOp::AllToAll, 8, 8 << 20), &t, &off).unwrap();
        assert_eq!((p.algo, p.port_bytes), ("p2p", (7 * (1u64 << 20)) as f64));
        // All-to-all-v on 2 GPUs: shares 1/3 to itself, 2/3 to the other.
        let m = alltoallv_matrix(2, 6 << 20);
        assert_eq!(m, vec![vec![2 << 20, 4 << 20], vec![4 << 20, 2 << 20]]);
        let p = price(&row(CollMeasureOp::AllToAllV, 2, 6 << 20), &t, &off).unwrap();
        assert_eq!(p.port_bytes, (4u64 << 20) as f64);
        assert!(p.model_us > 0.0);
        // NVLS for a large 8-GPU all-reduce only when allowed.
        let on = CollectiveModel::of(&t, true);
        let p = price(&row(CollMeasureOp::AllReduce, 8, 1 << 30), &t, &on).unwrap();
        assert_eq!(p.algo, "NVLS");
        let e = price(&row(CollMeasureOp::AllReduce, 1, 1 << 30), &t, &on).unwrap_err();
        assert!(e.to_string().contains("gpus"), "{e}");
        let e = price(&row(CollMeasureOp::AllReduce, 16, 1 << 30), &t, &on).unwrap_err();
        assert!(
            e.to_string().contains("at most the topology's 8 GPUs"),
            "{e}"
        );
    }

    #[test]
    fn a_report_sets_its_fitted_parameters_else_its_lines() {
        let text = include_str!("../../topologies/dgx-h200-roce.toml");
        let file = TopologySpec::parse(text, "dgx-h200-roce.toml").unwrap();
        let load = |json: &str| {
            let mut spec = file.clone();
            apply_report(json, "fit.json", &mut spec).map(|()| spec)
        };
        // without `params` (a hand-written report): the lines, `p2p` left out
        let json = r#"{"fit": [{"algo": "p2p", "rows": 4, "latency_us": 1.0, "bandwidth_gbs": 100.0},
            {"algo": "ring", "rows": 8, "latency_us": 30.5, "bandwidth_gbs": 343.0}]}"#;
        let spec = load(json).unwrap();
        assert_eq!(
            spec.collectives.fit,
            vec![CollectiveFitSpec {
                algo: "ring".into(),
                latency_us: 30.5,
                bandwidth_gbyte_s: 343.0
            }]
        );
        assert_eq!(spec.nvlink, file.nvlink);
        // with `params`: the parameters its rows were fitted to, not the lines
        let params = |ring: u32, nvls: u32| {
            format!(
                r#"{{"fit": [], "params": {{"ring_rows": {ring}, "nvls_rows": {nvls},
                "nvlink_efficiency": 0.8, "latency_scale": 0.7, "sharp_efficiency": 0.6,
                "nvls_copy_us": 0.3, "rounds": 1}}}}"#
            )
        };
        let spec = load(&params(5, 5)).unwrap();
        assert_eq!(
            (
                spec.nvlink.efficiency,
                spec.collectives.latency_scale,
                spec.nvlink.sharp_efficiency,
                spec.collectives.nvls_copy_us
            ),
            (0.8, 0.7, Some(0.6), Some(0.3))
        );
        assert!(spec.collectives.fit.is_empty());
        // no NVLS rows: NVLS keeps the file's figures
        let spec = load(&params(5, 0)).unwrap();
        assert_eq!(spec.nvlink.efficiency, 0.8);
        assert_eq!(spec.nvlink.sharp_efficiency, file.nvlink.sharp_efficiency);
        assert_eq!(spec.collectives.nvls_copy_us, file.collectives.nvls_copy_us);
        for (bad, part) in [
            ("[1, 2]", "no `fit` array"),
            (
                "{\"fit\": [{\"algo\": \"ring\", \"latency_us\": 1.0}]}",
                "fit[0]: no `bandwidth_gbs`",
            ),
            (
                "{\"fit\": [{\"algo\": 3, \"latency_us\": 1.0, \"bandwidth_gbs\": 1.0}]}",
                "fit[0].algo",
            ),
            (
                "{\"fit\": [{\"algo\": \"ring\", \"latency_us\": \"x\", \"bandwidth_gbs\": 1.0}]}",
                "fit[0].latency_us",
            ),
            ("{\"params\": {\"ring_rows\": 1}}", "params: missing field"),
            ("not json", "not JSON"),
        ] {
            let e = load(bad).unwrap_err().to_string();
            assert!(e.contains("fit.json") && e.contains(part), "{bad}: {e}");
        }
    }

    #[test]
    fn the_fit_recovers_latency_and_bandwidth() {
        // ring: 10 µs + bytes / 300 GB/s; p2p: 0 µs + bytes / 150 GB/s (measured exactly)
        let mut pts = Vec::new();
        for k in 0..6 {
            let x = (8u64 << 20 << k) as f64;
            pts.push(("ring", x, 10.0 + x / 300e3));
            pts.push(("p2p", x, x / 150e3));
        }
        let f = fit(&pts).unwrap();
        let get = |a| f.iter().find(|g| g.algo == a).unwrap();
        assert!((get("ring").latency_us - 10.0).abs() < 1e-6);
        assert!((get("ring").bandwidth_gbs - 300.0).abs() < 1e-6);
        assert!(get("p2p").latency_us.abs() < 1e-6);
        assert!((get("p2p").bandwidth_gbs - 150.0).abs() < 1e-6);
        assert!((get("ring").predict_us(3e8) - (10.0 + 1e3)).abs() < 1e-6);
        // one size cannot separate latency from bandwidth
        let e = fit(&[("ring", 1e6, 5.0), ("ring", 1e6, 6.0)]).unwrap_err();
        assert!(e.to_string().contains("algorithm ring"), "{e}");
    }
    #[test]
    fn the_parameter_fit_recovers_what_rows_were_priced_with() {
        // Rows priced by the model itself on other parameters than the file's, on 2, 4 and
        // 8 GPUs from 64 KiB (LL and LL128 rings) to 4 GiB (Simple, NVLS on 8), plus rows
        // the fit leaves to the topology: an all-to-all and a 16-GPU ring across nodes.
        let text = include_str!("../../topologies/dgx-h200-roce.toml");
        let shipped = TopologySpec::parse(text, "dgx-h200-roce.toml").unwrap();
        let truth = ParamFit {
            nvlink_efficiency: 0.78,
            latency_scale: 0.45,
            sharp_efficiency: Some(0.66),
            nvls_copy_us: Some(0.31),
            ..ParamFit::of(&shipped)
        };
        let spec = truth.applied(&shipped);
        let t = Arc::new(spec.build(Some(2)).unwrap());
        let coll = CollectiveModel::of(&t, true);
        let mut rows = Vec::new();
        for op in [
            CollMeasureOp::AllGather,
            CollMeasureOp::ReduceScatter,
            CollMeasureOp::AllReduce,
        ] {
            for gpus in [2, 4, 8] {
                for k in (16..=32).step_by(2) {
                    let mut r = CollRow {
                        op,
                        gpus,
                        bytes: 1 << k,
                        time_us: 1.0,
                    };
                    r.time_us = price(&r, &t, &coll).unwrap().model_us;
                    rows.push(r);
                }
            }
        }
        for (op, gpus) in [(CollMeasureOp::AllToAll, 8), (CollMeasureOp::AllReduce, 16)] {
            rows.push(CollRow {
                op,
                gpus,
                bytes: 1 << 30,
                time_us: 1.0,
            });
        }
        let f = fit_params(&shipped, &rows, true).unwrap();
        let close = |a: f64, b: f64| (a / b - 1.0).abs() < 1e-3;
        assert!(close(f.nvlink_efficiency, 0.78), "{f:?}");
        assert!(close(f.latency_scale, 0.45), "{f:?}");
        assert!(close(f.sharp_efficiency.unwrap(), 0.66), "{f:?}");
        assert!(close(f.nvls_copy_us.unwrap(), 0.31), "{f:?}");
        // the 8-GPU all-reduces from 256 KiB run NVLS (64 KiB: an LL ring), the other
        // priced rows rings; the last two are not fitted
        assert_eq!((f.ring_rows, f.nvls_rows), (73, 8), "{f:?}");
        // NVLS off: every priced row runs as a ring and nothing fits NVLS
        let f = fit_params(&shipped, &rows, false).unwrap();
        assert_eq!((f.ring_rows, f.nvls_rows), (81, 0));
        assert_eq!(f.sharp_efficiency, shipped.nvlink.sharp_efficiency);
        // one GPU per NVLink domain: no row is fitted, and applying the fit changes nothing
        let mut apart = shipped.clone();
        apart.gpus_per_node = 1;
        apart.nic.as_mut().unwrap().per_node = 1;
        let f = fit_params(&apart, &rows, true).unwrap();
        assert_eq!((f.ring_rows, f.nvls_rows, f.rounds), (0, 0, 0));
        let mut same = apart.clone();
        f.apply_to(&mut same);
        assert_eq!(same, apart);
        // one size cannot separate a latency from a bandwidth
        let e = fit_params(&shipped, &rows[..1], true).unwrap_err();
        assert!(e.to_string().contains("algorithm ring"), "{e}");
    }

    #[test]
    fn the_bounded_fit_stays_in_its_box() {
        // t = 2 + 3·x1 exactly, with x2 ignored: the unconstrained optimum p = (3, 0)
        let pts: Vec<[f64; 4]> = (1..6)
            .map(|i| {
                let x = i as f64;
                [2.0, x, x * x, 2.0 + 3.0 * x]
            })
            .collect();
        let p = wls2(&pts, [0.0, 0.0], [10.0, 10.0]);
        assert!((p[0] - 3.0).abs() < 1e-9 && p[1].abs() < 1e-9, "{p:?}");
        // p1 held to ≤ 2: p2 takes up what it can
        let p = wls2(&pts, [0.0, 0.0], [2.0, 10.0]);
        assert_eq!(p[0], 2.0);
        assert!(p[1] > 0.0, "{p:?}");
        // a parameter fixed by lo = hi stays put
        let p = wls2(&pts, [0.0, 0.5], [10.0, 0.5]);
        assert_eq!(p[1], 0.5);
        assert!(p[0] < 3.0, "{p:?}");
    }
}
