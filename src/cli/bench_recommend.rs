//! Benchmark arms of `skewsim recommend`: the whole search (pruning, simulation of the
//! survivors at three seeds) for llama3-8b on the `wlbllm` corpus at 128K tokens, on
//! DGX H200 nodes, default settings (16 candidates simulated, 6 finalists).

use std::path::Path;

use anyhow::Result;
use skewsim::experiment::recommend::{recommend, Spec};
use skewsim::experiment::Quiet;

use super::bench::Timed;

fn arm(gpus: u32) -> Result<Timed> {
    let spec = Spec::new("llama3-8b", "wlbllm", "dgx-h200-roce", gpus, 131_072);
    Ok(Box::new(move || {
        let r = recommend(&spec, Path::new("."), (None, None), &Quiet)?;
        let rules: Vec<String> = r
            .rules
            .iter()
            .map(|x| format!("{} {}", x.name, x.removed))
            .collect();
        Ok(format!(
            "{} candidates ({}), {} simulated; winner {} on {} at {:.0} tokens/s, {}/{} seeds",
            r.space,
            rules.join(", "),
            r.simulated,
            r.rows[0].candidate.arm,
            r.rows[0].candidate.layout(),
            r.rows[0].tokens_per_s,
            r.rows[0].wins,
            r.spec.seeds
        ))
    }))
}

pub fn recommend_1024() -> Result<Timed> {
    arm(1024)
}

pub fn recommend_16384() -> Result<Timed> {
    arm(16_384)
}
