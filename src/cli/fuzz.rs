//! The in-repo fuzz harness: mutated committed inputs through every parser a user's file
//! reaches — the measurement CSV and the calibration fit, experiment TOML (every kind's
//! schema, as `run`, `plan` and `libra-config` read it), topology TOML, plan JSON and
//! corpus specs with packing. A case passes when the parser answers (a value or an
//! error) without a panic, within 10 s. Runs under `cargo test` with 256 cases per target
//! (32 for the fit); `SKEWSIM_FUZZ_CASES=N` runs N per target (the long campaign in
//! BENCHMARKS.md).

use std::time::{Duration, Instant};

use proptest::prelude::*;
use rand::{Rng as _, SeedableRng};
use rand_chacha::ChaCha8Rng;

use skewsim::cost::blocks::{BlockModel, BlockTimes, BwdBlockModel};
use skewsim::cost::fit::{self, FitOptions, Pricing};

/// Committed inputs the mutations start from.
const EXPERIMENTS: &[&str] = &[
    include_str!("../../experiments/four-way.toml"),
    include_str!("../../experiments/libra-dp-scaling.toml"),
    include_str!("../../experiments/libra-table1.toml"),
    include_str!("../../experiments/runtime-variance.toml"),
    include_str!("../../experiments/attention-microbench.toml"),
];
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

fn cases(default: u32) -> u32 {
    std::env::var("SKEWSIM_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
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

/// Run `f`, then check it took less than [`CASE_LIMIT`].
fn timed(what: &str, input: &str, f: impl FnOnce()) {
    let t = Instant::now();
    f();
    let dt = t.elapsed();
    assert!(dt < CASE_LIMIT, "{what} took {dt:?} on:\n{input}");
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

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(32), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn measurement_csv_and_fit(seed in any::<u64>()) {
        // a few forward and backward rows keep a case short
        let small: String = MEASUREMENTS.lines().take(14).map(|l| format!("{l}\n")).collect();
        let text = mutate(&small, seed);
        timed("calibrate", &text, || {
            if let Ok(rows) = fit::measurements_from_csv(&text, "fuzz.csv") {
                let start = Pricing::h200_default().unwrap();
                let _ = fit::fit(&rows, &start, &fit_options());
            }
        });
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(256), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn experiment_toml(seed in any::<u64>(), which in 0..EXPERIMENTS.len()) {
        let text = mutate(EXPERIMENTS[which], seed);
        timed("experiment", &text, || {
            let path = std::path::Path::new("experiments/fuzz.toml");
            if let Ok(doc) = toml::from_str::<toml::Table>(&text) {
                let _ = super::run::check_schema(path, &text, &doc);
            }
            let _ = skewsim::experiment::variance::simulate(&text, "fuzz.toml");
        });
    }

    #[test]
    fn topology_toml(seed in any::<u64>(), which in 0..TOPOLOGIES.len()) {
        let text = mutate(TOPOLOGIES[which], seed);
        timed("topology", &text, || {
            if let Ok(spec) = skewsim::cluster::TopologySpec::parse(&text, "fuzz.toml") {
                if spec.nodes <= 64 {
                    let _ = spec.build(None);
                }
            }
        });
    }

    #[test]
    fn plan_json(seed in any::<u64>()) {
        let text = mutate(&small_plan_json(), seed);
        timed("plan", &text, || {
            if let Ok(p) = skewsim::plan::Plan::from_json(&text, "fuzz.json") {
                let _ = skewsim::plan::check(&p);
            }
        });
    }

    #[test]
    fn corpus_spec_and_packing(seed in any::<u64>(), which in 0..SPECS.len(), pk in 0..PACKINGS.len()) {
        let spec = mutate(SPECS[which], seed);
        let packing = mutate(PACKINGS[pk], seed ^ 0x9e37_79b9);
        timed("corpus", &spec, || {
            if let (Ok(c), Ok(p)) = (
                skewsim::workload::corpus::Corpus::from_spec(&spec),
                packing.parse::<skewsim::workload::pack::Packing>(),
            ) {
                let seqs = skewsim::workload::pack::global_batch(&c, 32_768, 4, p, seed, 0);
                if let Ok(seqs) = seqs {
                    // conservation: no sequence over L
                    assert!(seqs.iter().all(|s| s.tokens() <= 32_768));
                }
            }
        });
    }
}

/// A small checked Libra plan as JSON (the plan target's seed input).
fn small_plan_json() -> String {
    use skewsim::balance::libra::{consecutive_pools, plan_step, LibraParams};
    use skewsim::workload::PackedSeq;
    let batch: Vec<PackedSeq> = [vec![300u32, 200], vec![50; 9]]
        .iter()
        .map(|l| PackedSeq::from_lengths(l, 512, 0))
        .collect();
    let p = LibraParams {
        pool_size: 2,
        cp: 2,
        tile_tokens: 64,
        ..LibraParams::default()
    };
    plan_step(0, &batch, &consecutive_pools(2, 2), 2, &p)
        .unwrap()
        .to_json()
        .unwrap()
}
