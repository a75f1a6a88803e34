//! `skewsim topo FILE [--nodes N]`: build a topology, print its summary (GPUs, links,
//! bisection bandwidth, diameter, and nccl-tests-style collective figures under the
//! analytical model) and write a picture (DOT and SVG) to `runs/topo-NAME/`.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use serde::Serialize;

use skewsim::cluster::analysis::{bisection_bandwidth, diameter};
use skewsim::cluster::{LinkKind, Topology, TopologySpec};
use skewsim::experiment::inputs::{read_input_text, MAX_SPEC_BYTES};
use skewsim::net::collective::{
    analytical_phases, bus_bandwidth, lower, lowered_time, BusBw, CollOp, Collective,
    CollectiveModel, Transfer,
};
use skewsim::net::collective_fit;
use skewsim::net::{AnalyticalModel, GpuId};

use super::{topo_draw, Output};

#[derive(clap::Args)]
pub struct Args {
    /// The topology file (TOML), e.g. topologies/dgx-h200-roce.toml.
    pub file: PathBuf,
    /// Node count (default: the file's `nodes`; at most 65536).
    #[arg(long, value_parser = super::limits::count::<u32>(1, super::limits::MAX_GPUS))]
    pub nodes: Option<u32>,
    /// Draw a topology of more than 1,024 nodes (its DOT and SVG grow by ~2.5 KB per node:
    /// ~245 MB at 100,000 nodes).
    #[arg(long)]
    pub large: bool,
    /// Where to write NAME.dot and NAME.svg (default: runs/topo-NAME).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Price collectives without NVLink SHARP, as a cluster run with `NCCL_NVLS_ENABLE=0`
    /// (the file's `[collectives] nvls = false` does the same).
    #[arg(long)]
    pub no_nvls: bool,
    /// Price collectives by a measured fit: the `-o` report of `skewsim calibrate
    /// --collectives`. Its fitted model parameters (NVLink and NVLS efficiency, latency
    /// scale, NVLS chunk copy) replace the file's; a report without them (hand-written)
    /// gives its per-algorithm latency and bandwidth, which replace the file's
    /// `[[collectives.fit]]`.
    #[arg(long, value_name = "FIT.json")]
    pub collectives: Option<PathBuf>,
    /// Also list every link (its name, as fault injection spells it, and bandwidth).
    #[arg(long)]
    pub links: bool,
    /// Refused: the cluster-model benchmarks are `skewsim bench` arms (the error names
    /// them).
    #[arg(long, hide = true)]
    pub bench: bool,
    /// Refused with `--bench`.
    #[arg(long, hide = true)]
    pub bench_rounds: Option<usize>,
}

#[derive(Serialize)]
struct Summary {
    name: String,
    file: String,
    nodes: u32,
    gpus: u32,
    nvlink_domains: u32,
    gpus_per_domain: u32,
    leaves: u32,
    spines: u32,
    vertices: usize,
    links: usize,
    bisection_gbyte_s: f64,
    bisection_half_gpus: u32,
    diameter_hops: u32,
    gpu_faults: usize,
    link_faults: usize,
    collectives: Vec<BusBw>,
    dot: String,
    svg: String,
    link_list: Vec<(String, f64)>,
}

pub fn run(args: Args, out: Output) -> Result<()> {
    if args.bench || args.bench_rounds.is_some() {
        bail!(
            "`skewsim topo --bench` was removed: the cluster-model benchmarks are arms of the \
             one benchmark registry now — run `skewsim bench topo-16k flow-a2a-4096 \
             recompute-scaling` (and `flow-a2a-4096-full` for all 4,095 all-to-all rounds, \
             which `--bench-rounds 4095` ran)"
        );
    }
    let name = args.file.display().to_string();
    let text = read_input_text(&args.file, MAX_SPEC_BYTES)
        .with_context(|| format!("reading topology {name}"))?;
    let mut spec = TopologySpec::parse(&text, &name)?;
    if args.no_nvls {
        spec.collectives.nvls = false;
    }
    if let Some(f) = &args.collectives {
        let fname = f.display().to_string();
        let text = read_input_text(f, MAX_SPEC_BYTES)
            .with_context(|| format!("reading collective fit {fname} (--collectives)"))?;
        collective_fit::apply_report(&text, &fname, &mut spec)?;
        spec.validate()
            .with_context(|| format!("the fit of {fname} (--collectives)"))?;
    }
    let nodes = args.nodes.unwrap_or(spec.nodes);
    if u64::from(nodes) > super::limits::MAX_DRAWN_NODES && !args.large {
        bail!(
            "{name}: nodes = {nodes}: topo draws at most {} nodes unless --large is given \
             (the DOT and SVG take ~2.5 KB per node: ~{} MB here)",
            super::limits::MAX_DRAWN_NODES,
            u64::from(nodes) * 2_450 / 1_000_000
        );
    }
    let topo = Arc::new(spec.build(args.nodes)?);
    let faults = match &spec.faults {
        Some(f) => f.resolve(&topo, &name)?,
        None => Default::default(),
    };
    let (bisect, half) = bisection_bandwidth(&topo);
    let dir = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("runs").join(format!("topo-{}", topo.spec.name)));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let dot = dir.join(format!("{}.dot", topo.spec.name));
    let svg = dir.join(format!("{}.svg", topo.spec.name));
    std::fs::write(&dot, topo_draw::dot(&topo))
        .with_context(|| format!("writing {}", dot.display()))?;
    std::fs::write(&svg, topo_draw::svg(&topo))
        .with_context(|| format!("writing {}", svg.display()))?;
    let (leaves, spines) = topo.switches();
    let summary = Summary {
        name: topo.spec.name.clone(),
        file: name,
        nodes: topo.nodes,
        gpus: topo.gpus(),
        nvlink_domains: topo.domains(),
        gpus_per_domain: topo.domain_gpus(),
        leaves,
        spines,
        vertices: topo.vertices.len(),
        links: topo.links.len(),
        bisection_gbyte_s: bisect / 1e9,
        bisection_half_gpus: half,
        diameter_hops: diameter(&topo),
        gpu_faults: faults.gpu.len(),
        link_faults: faults.link.len(),
        collectives: collectives(&topo)?,
        dot: dot.display().to_string(),
        svg: svg.display().to_string(),
        link_list: if args.links {
            (0..topo.links.len() as u32)
                .map(|l| (topo.link_name(l), topo.links[l as usize].bandwidth / 1e9))
                .collect()
        } else {
            Vec::new()
        },
    };
    out.emit(&summary, || text_summary(&summary, &topo))
}

/// nccl-tests-style figures under the analytical model: all-gather, reduce-scatter and
/// all-reduce on 2, 4 and 8 GPUs of the first NVLink domain as the collective model runs
/// them (NCCL's algorithm, the one the step engine uses), an all-to-all, and one NIC
/// between the first two domains.
fn collectives(topo: &Arc<Topology>) -> Result<Vec<BusBw>> {
    let coll = CollectiveModel::of(topo, true);
    let mut model = AnalyticalModel::new(topo.clone());
    let mut rows = Vec::new();
    for n in [2u32, 4, 8]
        .into_iter()
        .filter(|&n| n <= topo.domain_gpus())
    {
        let group: Vec<GpuId> = (0..n).collect();
        for op in [CollOp::AllGather, CollOp::ReduceScatter, CollOp::AllReduce] {
            for bytes in [8u64 << 20, 64 << 20, 8 << 30] {
                let lw = coll.lower(op, &group, bytes, topo.gpus_per_node);
                let t = lowered_time(&mut model, &lw, 0);
                rows.push(bus_bandwidth(
                    op.collective(),
                    Some(lw.algo),
                    n as usize,
                    bytes,
                    t,
                ));
            }
        }
    }
    let n = topo.domain_gpus().min(8);
    if n >= 2 {
        let group: Vec<GpuId> = (0..n).collect();
        let bytes = 8u64 << 30;
        let p = lower(Collective::AllToAll, &group, bytes)?;
        let t = analytical_phases(&model, &p, 0);
        rows.push(bus_bandwidth(
            Collective::AllToAll,
            None,
            n as usize,
            bytes,
            t,
        ));
    }
    if topo.domains() >= 2 {
        let bytes = 8u64 << 30;
        let p = vec![vec![Transfer {
            src: 0,
            dst: topo.domain_gpus(),
            bytes,
        }]];
        rows.push(bus_bandwidth(
            Collective::SendRecv,
            None,
            2,
            bytes,
            analytical_phases(&model, &p, 0),
        ));
    }
    Ok(rows)
}

fn text_summary(s: &Summary, topo: &Topology) -> String {
    let mut t = format!(
        "topology {} ({})\n  nodes {}  GPUs {}  NVLink domains {} × {} GPUs  leaves {}  spines {}\n  \
         vertices {}  directed links {}\n  bisection bandwidth {:.1} GB/s one way ({} GPUs a side; {:.1} GB/s per GPU)\n  \
         diameter {} hops (GPU to GPU)\n  faults injected: {} GPU, {} link\n",
        s.name,
        s.file,
        s.nodes,
        s.gpus,
        s.nvlink_domains,
        s.gpus_per_domain,
        s.leaves,
        s.spines,
        s.vertices,
        s.links,
        s.bisection_gbyte_s,
        s.bisection_half_gpus,
        s.bisection_gbyte_s / f64::from(s.bisection_half_gpus.max(1)),
        s.diameter_hops,
        s.gpu_faults,
        s.link_faults,
    );
    for kind in [
        LinkKind::Nvlink,
        LinkKind::Pcie,
        LinkKind::NicLeaf,
        LinkKind::LeafSpine,
    ] {
        if let Some(l) = topo.links.iter().find(|l| l.kind == kind) {
            t += &format!(
                "  {:<10} {:>8.2} GB/s nominal, {:>8.2} GB/s achieved\n",
                format!("{kind:?}"),
                l.bandwidth / 1e9,
                l.capacity() / 1e9
            );
        }
    }
    t += "\n  collective (analytical model)      ranks        size      time µs   algbw GB/s   busbw GB/s\n";
    for c in &s.collectives {
        let name = match c.algo {
            Some(a) => format!("{} ({})", c.op, a.name()),
            None => c.op.to_string(),
        };
        t += &format!(
            "  {:<32} {:>6} {:>11} {:>12.1} {:>12.1} {:>12.1}\n",
            name,
            c.ranks,
            human_bytes(c.bytes),
            c.time_us,
            c.algbw_gbs,
            c.busbw_gbs
        );
    }
    for (name, bw) in &s.link_list {
        t += &format!("  link {name:<28} {bw:>10.2} GB/s\n");
    }
    t += &format!("\n  wrote {} and {}\n", s.dot, s.svg);
    t
}

fn human_bytes(b: u64) -> String {
    if b >= 1 << 30 {
        format!("{} GiB", b >> 30)
    } else if b >= 1 << 20 {
        format!("{} MiB", b >> 20)
    } else {
        format!("{b} B")
    }
}
