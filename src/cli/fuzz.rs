//! The in-repo fuzz harness: mutated committed inputs through every parser a user's file
//! reaches, and the expensive work downstream of two of them.
//!
//! Parser targets (a case = one mutated file through the parser and its validation):
//! the measurement CSV with its row checks, experiment TOML through every kind's schema (as
//! `run`, `plan` and `libra-config` read it), topology TOML (and the graph when it has at
//! most 64 nodes), plan JSON with `plan::check`, corpus specs with packing. Downstream
//! targets: the calibration fit (both block models, 5 iterations) on a mutated CSV that
//! parses, and the runtime-variance simulation on a mutated experiment that parses.
//!
//! A case passes when the code answers (a value or an error) without a panic within 10 s.
//! Case k of a target mutates its seed input with seed k, so any case is re-run alone by
//! its seed. Under `cargo test` each target runs seeds 0..256 (32 for the downstream ones);
//! `SKEWSIM_FUZZ_CASES=N` runs N cases from `SKEWSIM_FUZZ_SEED` (default 0), and
//! `SKEWSIM_FUZZ_SECONDS=T` stops a target after T seconds, so a long campaign is sharded
//! over processes by seed ranges. Each target prints its count, seed range and time.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use rand::{Rng as _, SeedableRng};
use rand_chacha::ChaCha8Rng;

use skewsim::cost::blocks::{BlockModel, BlockTimes, BwdBlockModel};
use skewsim::cost::fit::{self, FitOptions, Pricing};

/// Committed inputs the mutations start from: one file of every experiment kind and more.
const EXPERIMENTS: &[&str] = &[
    include_str!("../../experiments/four-way.toml"),
    include_str!("../../experiments/megatron-dcp-blog.toml"),
    include_str!("../../experiments/libra-dp-scaling.toml"),
    include_str!("../../experiments/libra-pp-microbatch.toml"),
    include_str!("../../experiments/libra-table1.toml"),
    include_str!("../../experiments/libra-fig8.toml"),
    include_str!("../../experiments/runtime-variance.toml"),
    include_str!("../../experiments/attention-microbench.toml"),
    include_str!("../../experiments/distca-4d.toml"),
];
const VARIANCE: &str = include_str!("../../experiments/runtime-variance.toml");
const TOPOLOGIES: &[&str] = &[
    include_str!("../../topologies/dgx-h200-roce.toml"),
    include_str!("../../topologies/gb200-nvl72.toml"),
    include_str!("../../topologies/test-small.toml"),
];
const MEASUREMENTS: &str = include_str!("../../validate/results/run18/x1.csv");
const SPECS: &[&str] = &[
    "wlbllm",
    "libra-256k",
    "lognormal:median=600,p99=30000,max=8192",
    "pareto:scale=100,shape=1.5",
    "fixed:4096",
    "0.75*fixed:100+0.25*lognormal:mu=6,sigma=1.5",
];
const PACKINGS: &[&str] = &["sequential", "best-fit", "best-fit:16"];

/// Longest a case may take.
const CASE_LIMIT: Duration = Duration::from_secs(10);

fn env<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// Run `case(seed)` for the campaign's seeds; fail naming every seed that panicked or ran
/// past [`CASE_LIMIT`].
fn campaign(target: &str, default_cases: u64, case: impl Fn(u64) -> bool) {
    let cases = env("SKEWSIM_FUZZ_CASES").unwrap_or(default_cases);
    let first: u64 = env("SKEWSIM_FUZZ_SEED").unwrap_or(0);
    let budget = env::<f64>("SKEWSIM_FUZZ_SECONDS")
        .filter(|s| s.is_finite() && *s > 0.0)
        .map(Duration::from_secs_f64);
    let start = Instant::now();
    let (mut done, mut accepted, mut slowest) = (0u64, 0u64, (Duration::ZERO, first));
    let mut bad: Vec<(u64, String)> = Vec::new();
    for seed in first..first.saturating_add(cases) {
        if budget.is_some_and(|b| start.elapsed() >= b) {
            break;
        }
        let t = Instant::now();
        let r = catch_unwind(AssertUnwindSafe(|| case(seed)));
        let dt = t.elapsed();
        done += 1;
        if dt > slowest.0 {
            slowest = (dt, seed);
        }
        match r {
            Err(e) => {
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                bad.push((seed, format!("panic: {msg}")));
            }
            Ok(_) if dt >= CASE_LIMIT => bad.push((seed, format!("took {dt:?}"))),
            Ok(ok) => accepted += u64::from(ok),
        }
    }
    eprintln!(
        "fuzz {target}: {done} cases ({accepted} accepted), seeds {first}..{}, {:.2} s, slowest {:.1} ms (seed {}), {} failed",
        first + done,
        start.elapsed().as_secs_f64(),
        slowest.0.as_secs_f64() * 1e3,
        slowest.1,
        bad.len()
    );
    assert!(bad.is_empty(), "fuzz {target}: failing seeds {bad:?}");
}

/// Byte-level and token-level mutations of `text` drawn from `seed`: flip or replace a
/// byte, delete or duplicate a span, insert a number, sign, NaN or separator.
fn mutate(text: &str, seed: u64) -> String {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut b = text.as_bytes().to_vec();
    const TOKENS: &[&str] = &[
        "0",
        "-5",
        "1",
        "4294967295",
        "18446744073709551615",
        "1e308",
        "NaN",
        "inf",
        "\"x\"",
        "[]",
        "[0]",
        ",",
        ";",
        "*",
        ":",
        "=",
        "\n",
        "\"",
        "{",
        "}",
        "2",
        "65535",
        "1e-300",
    ];
    for _ in 0..rng.random_range(1..=4) {
        let at = rng.random_range(0..=b.len());
        match rng.random_range(0..5) {
            0 if at < b.len() => b[at] = rng.random(),
            1 => {
                let end = (at + rng.random_range(1..16)).min(b.len());
                b.drain(at..end);
            }
            2 => {
                let end = (at + rng.random_range(1..64)).min(b.len());
                let span = b[at..end].to_vec();
                b.splice(at..at, span);
            }
            _ => {
                let t = TOKENS[rng.random_range(0..TOKENS.len())].as_bytes();
                // replace a run of digits when there is one here, else insert
                let end = b[at..].iter().take_while(|c| c.is_ascii_digit()).count() + at;
                b.splice(at..end, t.iter().copied());
            }
        }
    }
    String::from_utf8_lossy(&b).into_owned()
}

/// The fit `calibrate` runs (block models of both passes), on few iterations.
fn fit_options() -> FitOptions {
    let t = BlockTimes {
        block_ns: 0.0,
        iter_ns: 1.0,
        row_share: 0.0,
        diag_ns: 0.0,
        empty_ns: 0.0,
    };
    FitOptions {
        iterations: 5,
        time_budget_s: 5.0,
        blocks: Some(BlockModel::h200(0.0, 1.0, 0.0, 0.0, 1.0)),
        bwd_blocks: Some(BwdBlockModel::h200(0.0, t, t, 1.0)),
        ..FitOptions::default()
    }
}

/// The first `n` lines of the measurement file (the version line, the header, rows).
fn measurement_lines(n: usize) -> String {
    MEASUREMENTS
        .lines()
        .take(n)
        .map(|l| format!("{l}\n"))
        .collect()
}

#[test]
fn measurement_csv() {
    let text = measurement_lines(64);
    campaign("measurement_csv", 256, |seed| {
        fit::measurements_from_csv(&mutate(&text, seed), "fuzz.csv").is_ok()
    });
}

#[test]
fn calibration_fit() {
    // a few forward and backward rows keep a case short
    let text = measurement_lines(14);
    let start = Pricing::h200_default().unwrap();
    campaign("calibration_fit", 32, |seed| {
        fit::measurements_from_csv(&mutate(&text, seed), "fuzz.csv")
            .is_ok_and(|rows| fit::fit(&rows, &start, &fit_options()).is_ok())
    });
}

#[test]
fn experiment_toml() {
    campaign("experiment_toml", 256, |seed| {
        let text = mutate(EXPERIMENTS[seed as usize % EXPERIMENTS.len()], seed);
        toml::from_str::<toml::Table>(&text).is_ok_and(|doc| {
            skewsim::experiment::check("experiments/fuzz.toml", &text, &doc).is_ok()
        })
    });
}

#[test]
fn variance_simulation() {
    campaign("variance_simulation", 32, |seed| {
        skewsim::experiment::variance::simulate(&mutate(VARIANCE, seed), "fuzz.toml").is_ok()
    });
}

#[test]
fn topology_toml() {
    campaign("topology_toml", 256, |seed| {
        let text = mutate(TOPOLOGIES[seed as usize % TOPOLOGIES.len()], seed);
        skewsim::cluster::TopologySpec::parse(&text, "fuzz.toml")
            .is_ok_and(|spec| spec.nodes > 64 || spec.build(None).is_ok())
    });
}

#[test]
fn plan_json() {
    let plan = small_plan_json();
    campaign("plan_json", 256, |seed| {
        skewsim::plan::Plan::from_json(&mutate(&plan, seed), "fuzz.json")
            .is_ok_and(|p| skewsim::plan::check(&p).is_ok())
    });
}

#[test]
fn corpus_spec_and_packing() {
    campaign("corpus_spec_and_packing", 256, |seed| {
        // the spec, the packing or both mutated, so each parser's accepted inputs reach
        // the packer
        let (spec, packing) = (
            SPECS[seed as usize % SPECS.len()],
            PACKINGS[(seed / 7) as usize % PACKINGS.len()],
        );
        let spec = match seed % 3 {
            1 => spec.to_string(),
            _ => mutate(spec, seed),
        };
        let packing = match seed % 3 {
            0 => packing.to_string(),
            _ => mutate(packing, seed ^ 0x9e37_79b9),
        };
        if let (Ok(c), Ok(p)) = (
            skewsim::workload::corpus::Corpus::from_spec(&spec),
            packing.parse::<skewsim::workload::pack::Packing>(),
        ) {
            if let Ok(seqs) = skewsim::workload::pack::global_batch(&c, 32_768, 4, p, seed, 0) {
                // conservation: no sequence over L
                assert!(
                    seqs.iter().all(|s| s.tokens() <= 32_768),
                    "{spec} {packing}"
                );
                return true;
            }
        }
        false
    });
}

/// A small checked Libra plan as JSON (the plan target's seed input): `check-plan`'s test plan.
fn small_plan_json() -> String {
    super::check_plan::tests::plan().to_json().unwrap()
}
