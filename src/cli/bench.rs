//! `skewsim bench [NAME...]`: named benchmark arms, timed in-process, printed as a table.
//! Speed targets live here and in BENCHMARKS.md, never in timed unit tests.
//!
//! To add an arm, add one [`Arm`] to [`ARMS`]: a name, what it does, its target in seconds
//! (if any) and a function that runs it once and returns a line of detail. Run it with
//! `cargo run --release -- bench NAME`.

use std::time::Instant;

use anyhow::{bail, Result};
use rand_distr::{Distribution, LogNormal};
use serde::Serialize;

use skewsim::balance::vrsp;
use skewsim::report::table::Table;
use skewsim::rng::stream;

use super::Output;

/// The timed part of an arm: runs once, returns a line of detail.
pub type Timed = Box<dyn FnMut() -> Result<String>>;

/// One benchmark arm.
pub struct Arm {
    pub name: &'static str,
    pub what: &'static str,
    /// The target wall time in seconds, if the issue sets one.
    pub target_s: Option<f64>,
    /// How many timed runs (the median is reported).
    pub runs: usize,
    /// Prepares its input untimed and returns the timed closure.
    pub setup: fn() -> Result<Timed>,
}

/// The registry: every arm, by name.
pub const ARMS: &[Arm] = &[
    Arm {
        name: "vrsp-1m",
        what: "VRSP (Libra Alg. 1) over D = 1,000,000 sequences, P = 8",
        target_s: Some(0.2),
        runs: 5,
        setup: vrsp_1m,
    },
    Arm {
        name: "fig8",
        what: "experiments/libra-fig8.toml in memory: 6 P × 5 policies × 3 corpora × 200 trials",
        target_s: Some(30.0),
        runs: 1,
        setup: fig8,
    },
    Arm {
        name: "distca-512",
        what: "DistCA scheduler, 512 servers × 128K tokens (wlbllm), ε = 0.10",
        target_s: Some(0.1),
        runs: 20,
        setup: super::bench_schemes::distca_512,
    },
    Arm {
        name: "distca-512-cp8",
        what: "DistCA tight scheduler, 64 replicas × CP 8 = 512 servers, GBS 512 × 128K (wlbllm), GA 8",
        target_s: Some(0.05),
        runs: 20,
        setup: super::bench_schemes::distca_512_cp8,
    },
    Arm {
        name: "distca-reference-512x8",
        what: "DistCA repository's scheduler, 64 replicas × CP 8 = 512 servers, GBS 512 × 128K (wlbllm), GA 8",
        target_s: Some(0.1),
        runs: 20,
        setup: super::bench_schemes::distca_reference_512x8,
    },
    Arm {
        name: "distca-512-256k",
        what: "DistCA scheduler, 512 servers × 256K tokens (libra-256k), ε = 0.10",
        target_s: None,
        runs: 20,
        setup: super::bench_schemes::distca_512_256k,
    },
    Arm {
        name: "megatron-dcp-512x8",
        what: "Megatron dynamic-CP planner (schedule + Plan), 64 replicas × CP 8 = 512 ranks, GA 8: GBS 512 × 128K (wlbllm), S = 16K",
        target_s: Some(0.1),
        runs: 20,
        setup: super::bench_schemes::megatron_dcp_512x8,
    },
    Arm {
        name: "wlbllm-step",
        what: "WLB-LLM variable-length packing, 512 micro-batches × 128K tokens (wlbllm)",
        target_s: None,
        runs: 20,
        setup: super::bench_schemes::wlbllm_step,
    },
    Arm {
        name: "engine-throughput",
        what: "engine alone: 4,096 streams x 2,048 kernels, neighbour deps (8.4M events)",
        target_s: None,
        runs: 5,
        setup: super::bench_engine::arm_engine_throughput,
    },
    Arm {
        name: "engine-fast-path",
        what: "the step-4096 graph on the event engine and on the DAG sweep (built untimed), timelines checked equal",
        target_s: None,
        runs: 1,
        setup: super::bench_engine::arm_engine_fast_path,
    },
    Arm {
        name: "recommend-1024",
        what: "skewsim recommend: llama3-8b, wlbllm at 128K, 1,024 H200 GPUs, every scheme and layout, 16 simulated, 6 finalists × 3 seeds",
        target_s: Some(60.0),
        runs: 1,
        setup: super::bench_recommend::recommend_1024,
    },
    Arm {
        name: "recommend-16384",
        what: "the recommend-1024 search on 16,384 H200 GPUs",
        target_s: Some(600.0),
        runs: 1,
        setup: super::bench_recommend::recommend_16384,
    },
    Arm {
        name: "step-4096",
        what: "one full step, qwen3-30b-a3b on 4,096 GPUs (CP 16, DP 256, GA 8), every rank, analytical network",
        target_s: Some(10.0),
        runs: 3,
        setup: super::bench_engine::arm_step_4096,
    },
    Arm {
        name: "step-4096-tp8",
        what: "the step-4096 step with TP 8 per node and sequence parallelism (TP 8, CP 4, DP 128, GA 8)",
        target_s: Some(10.0),
        runs: 3,
        setup: super::bench_engine::arm_step_4096_tp8,
    },
    Arm {
        name: "step-4096-flow",
        what: "the step-4096 step on the flow-level network model",
        target_s: Some(5.0),
        runs: 1,
        setup: super::bench_engine::arm_step_4096_flow,
    },
    Arm {
        name: "step-16384",
        what: "one full step, qwen3-30b-a3b on 16,384 GPUs (CP 16, DP 1,024, GA 8)",
        target_s: Some(5.0),
        runs: 1,
        setup: super::bench_engine::arm_step_16384,
    },
    Arm {
        name: "step-65536",
        what: "the step-16384 step on 65,536 GPUs (DP 4,096)",
        target_s: Some(20.0),
        runs: 1,
        setup: super::bench_engine::arm_step_65536,
    },
    Arm {
        name: "step-405b-16384-vp",
        what: "one step of Llama 3.1 405B on 16,384 H100s as Llama 3 Table 4 lays it out (TP 8, PP 16, DP 128, 8K, 16M tokens) with interleaved 1F1B (vp 2), the embedding and loss as pipeline slots, BF16 gradients reduce-scattered by the distributed optimizer",
        target_s: Some(10.0),
        runs: 1,
        setup: super::bench_engine::arm_step_405b_16384_vp,
    },
    Arm {
        name: "step-262144",
        what: "the step-16384 step on 262,144 GPUs (DP 16,384), within 2 GiB",
        target_s: Some(40.0),
        runs: 1,
        setup: super::bench_engine::arm_step_262144,
    },
    Arm {
        name: "step-16384-speedup",
        what: "step-16384 built, simulated and reported on 1 thread and on the default pool; speedup in the detail",
        target_s: None,
        runs: 1,
        setup: super::bench_engine::arm_step_16384_speedup,
    },
    Arm {
        name: "schemes-4096",
        what: "one step of each of the five schemes (the four balancing schemes and Megatron DCP) on 4,096 GPUs (llama3-8b, CP 8, DP 512, GA 8, wlbllm 128K), planning + simulation",
        target_s: Some(15.0),
        runs: 1,
        setup: super::bench_engine::arm_schemes_4096,
    },
    Arm {
        name: "schemes-16384",
        what: "the same on 16,384 GPUs (DP 2,048)",
        target_s: Some(60.0),
        runs: 1,
        setup: super::bench_engine::arm_schemes_16384,
    },
    Arm {
        name: "engine-scaling",
        what: "wall time of one full step against GPUs (256 ... 65,536), fitted exponent (target <= 1.1)",
        target_s: None,
        runs: 1,
        setup: super::bench_engine::arm_engine_scaling,
    },
    Arm {
        name: "topo-16k",
        what: "build + route 16,384-GPU dgx-h200-roce (1,048,576 routes)",
        target_s: Some(2.0),
        runs: 5,
        setup: super::bench_cluster::arm_topo_16k,
    },
    Arm {
        name: "flow-a2a-4096",
        what: "flow model, 64 rounds of a 4,096-GPU all-to-all (524,288 flow events; ≥ 1M events/s ⇔ < 0.524 s)",
        target_s: Some(0.524),
        runs: 5,
        setup: super::bench_cluster::arm_flow_a2a_4096,
    },
    Arm {
        name: "flow-a2a-4096-full",
        what: "the whole 4,095-round 4,096-GPU all-to-all on the flow model (33,546,240 flow events)",
        target_s: None,
        runs: 1,
        setup: super::bench_cluster::arm_flow_a2a_4096_full,
    },
    Arm {
        name: "recompute-scaling",
        what: "one flow-model rate recomputation vs active flows (257 ... 65,537; one component / random), 4,096 GPUs, median of 5 each",
        target_s: None,
        runs: 1,
        setup: super::bench_cluster::arm_recompute_scaling,
    },
    Arm {
        name: "libra-tap-1m",
        what: "TAP tiling + Algorithm 2 placement of one 1M-token pool (P=8, CP=16, B=4096, H=4)",
        target_s: Some(0.01),
        runs: 11,
        setup: super::bench_libra::tap_pool_1m,
    },
    Arm {
        name: "libra-exchange-1m",
        what: "Libra exchange planning (units + deduplicated transfers) of the same pool",
        target_s: None,
        runs: 11,
        setup: super::bench_libra::exchange_pool_1m,
    },
    Arm {
        name: "libra-check-1m",
        what: "plan checker on the same pool's plan",
        target_s: None,
        runs: 11,
        setup: super::bench_libra::check_pool_1m,
    },
    Arm {
        name: "block-makespan",
        what: "list schedule of 64 forward launches of 8,192 blocks (32 heads × 256 query tiles of mixed segments) on 132 SMs × 2 (cost::blocks)",
        target_s: None,
        runs: 11,
        setup: block_makespan,
    },
];

fn block_makespan() -> Result<Timed> {
    use rand::Rng;
    use skewsim::cost::blocks::{BlockModel, LaunchBlocks};
    let m = BlockModel::h200(2400.0, 2400.0, 0.12, 450.0, 1.38);
    // Per launch: query chunks of 128–4,096 rows ending at keys up to 64K, and short
    // documents, 256 tiles per head (drawn untimed).
    let mut rng = stream(0, "bench-block-makespan", 0);
    let launches: Vec<LaunchBlocks> = (0..64)
        .map(|_| {
            let mut segs = Vec::new();
            let mut tiles = 0u64;
            while tiles < 256 {
                let q = 128 * rng.random_range(1..=32u64);
                let e = rng.random_range(q..=65_536u64);
                let q = q.min(128 * (256 - tiles));
                segs.push((e - q, e, 1u32));
                tiles += q.div_ceil(128);
            }
            LaunchBlocks::new(&m, skewsim::cost::Mask::Causal, 32, 128, segs)
        })
        .collect();
    Ok(Box::new(move || {
        let blocks: usize = launches.iter().map(|l| l.shapes.len() * 32).sum();
        let t: f64 = launches.iter().map(|l| l.makespan_ps(&m)).sum();
        Ok(format!("{blocks} blocks, Σ makespan {:.3} ms", t * 1e-9))
    }))
}

fn vrsp_1m() -> Result<Timed> {
    // Loads with a long tail like packed Σℓ² (lognormal, σ = 2), drawn untimed.
    let mut rng = stream(0, "bench-vrsp-1m", 0);
    let dist: LogNormal<f64> = LogNormal::new(20.0, 2.0)?;
    let loads: Vec<u64> = (0..1_000_000)
        .map(|_| dist.sample(&mut rng).min(1e15) as u64)
        .collect();
    Ok(Box::new(move || {
        let pools = vrsp(&loads, 8)?;
        let r = skewsim::balance::imbalance(&loads, &pools);
        Ok(format!(
            "K = {} pools, R − 1 = {:.2e}",
            pools.len(),
            r - 1.0
        ))
    }))
}

fn fig8() -> Result<Timed> {
    let text = include_str!("../../experiments/libra-fig8.toml");
    let spec = skewsim::experiment::pools::parse("experiments/libra-fig8.toml", text)?;
    Ok(Box::new(move || {
        let o = skewsim::experiment::pools::execute(&spec, &skewsim::experiment::Quiet)?;
        let rows: usize = o.studies.iter().map(|(_, s)| s.rows.len()).sum();
        Ok(format!(
            "{rows} (corpus, P, policy) cells, {} files",
            o.files.len()
        ))
    }))
}

#[derive(clap::Args)]
pub struct Args {
    /// Arms to run (default: all). `--list` shows them.
    pub names: Vec<String>,
    /// List the arms and exit.
    #[arg(long)]
    pub list: bool,
}

#[derive(Serialize)]
struct Measured {
    arm: &'static str,
    what: &'static str,
    runs: usize,
    median_s: f64,
    target_s: Option<f64>,
    met: Option<bool>,
    detail: String,
}

pub fn run(args: Args, out: Output) -> Result<()> {
    if args.list {
        let list: Vec<serde_json::Value> = ARMS
            .iter()
            .map(|a| serde_json::json!({"arm": a.name, "target_s": a.target_s, "what": a.what}))
            .collect();
        return out.emit(&list, || {
            let mut t = Table::new(["arm", "target_s", "what"]);
            for a in ARMS {
                t.row([
                    a.name.to_string(),
                    a.target_s.map(|x| x.to_string()).unwrap_or_default(),
                    a.what.to_string(),
                ]);
            }
            t.to_text()
        });
    }
    let names: Vec<String> = if args.names.is_empty() {
        ARMS.iter().map(|a| a.name.to_string()).collect()
    } else {
        args.names.clone()
    };
    let mut results = Vec::new();
    for n in &names {
        let Some(arm) = ARMS.iter().find(|a| a.name == n) else {
            bail!(
                "unknown bench arm = {n:?} (one of: {})",
                ARMS.iter().map(|a| a.name).collect::<Vec<_>>().join(", ")
            );
        };
        eprintln!("skewsim: bench {} …", arm.name);
        let mut f = (arm.setup)()?;
        let mut times = Vec::new();
        let mut detail = String::new();
        for _ in 0..arm.runs.max(1) {
            let t = Instant::now();
            detail = f()?;
            times.push(t.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        results.push(Measured {
            arm: arm.name,
            what: arm.what,
            runs: times.len(),
            median_s: median,
            target_s: arm.target_s,
            met: arm.target_s.map(|t| median < t),
            detail,
        });
    }
    out.emit(&results, || {
        let mut t = Table::new(["arm", "runs", "median_s", "target_s", "met", "detail"]);
        for m in &results {
            t.row([
                m.arm.to_string(),
                m.runs.to_string(),
                format!("{:.3}", m.median_s),
                m.target_s.map(|x| format!("< {x}")).unwrap_or_default(),
                m.met
                    .map(|b| if b { "yes" } else { "NO" }.to_string())
                    .unwrap_or_default(),
                m.detail.clone(),
            ]);
        }
        let profile = if cfg!(debug_assertions) {
            "dev profile (use --release for the recorded figures)"
        } else {
            "release"
        };
        format!(
            "{}\n{profile}, {} rayon threads\n",
            t.to_text(),
            rayon::current_num_threads()
        )
    })
}
