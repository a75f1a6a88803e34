//! `skewsim check-plan FILE`: verify a plan.json with the Plan checker. Exit 0 and a
//! one-line verdict, or the first violation found and a non-zero exit.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use skewsim::experiment::inputs::{read_input_text, MAX_PLAN_BYTES};
use skewsim::experiment::plan;
use skewsim::plan::{check, CheckSummary, Plan};

use super::Output;

#[derive(clap::Args)]
pub struct Args {
    /// The plan file (JSON, as `skewsim plan` writes it).
    pub file: PathBuf,
}

/// Read and check a plan file: its summary, or an error naming the file and the first
/// violation.
pub fn check_file(file: &Path) -> Result<(Plan, CheckSummary)> {
    let name = file.display().to_string();
    let text =
        read_input_text(file, MAX_PLAN_BYTES).with_context(|| format!("reading plan {name}"))?;
    let plan = Plan::from_json(&text, &name)?;
    if !plan::SCHEMES.contains(&plan.scheme.as_str()) {
        bail!(
            "{name}: invalid scheme = {:?}: one of {} (the planners that write plans)",
            plan.scheme,
            plan::SCHEMES.join(", ")
        );
    }
    if plan.groups.is_empty() {
        bail!("{name}: invalid groups = []: a plan has at least one group (GA index × pool)");
    }
    let summary = check(&plan).map_err(|v| anyhow::anyhow!("{name}: plan is wrong: {v}"))?;
    Ok((plan, summary))
}

/// The one-line verdict for a plan that passed.
pub fn verdict(file: &str, plan: &Plan, s: &CheckSummary) -> String {
    format!(
        "{file}: OK — {} step {}: {} groups, {} sequences, {} units, {} transfers; \
         every query attended once per head, {:.4e} FLOPs = exact causal total, {:.3} GB moved\n",
        plan.scheme,
        plan.step,
        s.groups,
        s.sequences,
        s.units,
        s.transfers,
        s.flops,
        s.bytes as f64 / 1e9
    )
}

pub fn run(args: Args, out: Output) -> Result<()> {
    let (plan, summary) = check_file(&args.file)?;
    out.emit(&summary, || {
        verdict(&args.file.display().to_string(), &plan, &summary)
    })
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use skewsim::balance::libra::{consecutive_pools, plan_step, LibraParams};
    use skewsim::workload::PackedSeq;

    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("skewsim-check-plan-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir.join(name)
    }

    /// A small checked Libra plan (two pools of CP 2).
    pub(in crate::cli) fn plan() -> Plan {
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
        plan_step(0, &batch, &consecutive_pools(2, 2), 2, &p).unwrap()
    }

    #[test]
    fn good_plan_passes_and_planted_violation_is_named() {
        let good = temp("good.json");
        let p = plan();
        std::fs::write(&good, p.to_json().unwrap()).unwrap();
        let (back, s) = check_file(&good).unwrap();
        assert_eq!(back, p);
        let line = verdict("good.json", &back, &s);
        assert!(line.starts_with("good.json: OK — libra step 0: 1 groups, 2 sequences"));
        assert_eq!(line.lines().count(), 1);

        let mut bad = p.clone();
        bad.groups[0].units.pop();
        let badf = temp("bad.json");
        std::fs::write(&badf, bad.to_json().unwrap()).unwrap();
        let e = format!("{:#}", check_file(&badf).unwrap_err());
        assert!(e.contains("bad.json: plan is wrong: GA 0, pool 0:"), "{e}");
        assert!(e.contains("attended by no unit"), "{e}");

        // a plan of the old format version 1 (before KV spans): both versions named
        let v1 = temp("v1.json");
        std::fs::write(
            &v1,
            p.to_json()
                .unwrap()
                .replacen("\"version\": 2", "\"version\": 1", 1),
        )
        .unwrap();
        let e = format!("{:#}", check_file(&v1).unwrap_err());
        assert!(e.contains("v1.json: version = 1"), "{e}");
        assert!(e.contains("reads only plan format version 2"), "{e}");

        let e = format!("{:#}", check_file(&temp("missing.json")).unwrap_err());
        assert!(e.contains("reading plan"), "{e}");
    }
}
