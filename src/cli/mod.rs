//! Subcommands. Each lives in its own file with its `Args` and `run`; every command takes
//! the global `--json` (print the result table as JSON on stdout instead of text).

use anyhow::Result;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use serde::Serialize;
use skewsim::experiment::calfile;

pub mod bench;
mod bench_cluster;
mod bench_engine;
mod bench_libra;
mod bench_recommend;
mod bench_schemes;
mod calibrate;
mod calibrate_coll;
mod calibrate_elem;
mod check_plan;
pub mod corpus;
#[cfg(test)]
mod fuzz;
mod libra_config;
pub mod limits;
mod plan;
pub mod pools;
mod recommend;
mod run;
mod sweep;
pub mod theory;
mod topo;
mod topo_draw;
mod validate;
mod validate_torch;

/// skewsim: how much does attention-workload skew cost on this cluster, and which
/// balancing scheme (Ulysses, WLB-LLM, DistCA, Libra) wins it back?
#[derive(Parser)]
#[command(name = "skewsim", version, about, long_about = None)]
pub struct Cli {
    /// Print the result as JSON on stdout instead of a text table.
    #[arg(long, global = true)]
    pub json: bool,
    /// Memory the run may plan to use (e.g. 16G, 512M); a command whose estimate exceeds it
    /// is refused before allocating [default: half of this machine's memory].
    #[arg(long, global = true, value_parser = limits::parse_bytes)]
    pub max_memory: Option<u64>,
    /// Without a subcommand: the built-in four-way comparison (Ulysses, WLB-LLM, DistCA,
    /// Libra on 8 and 16 simulated H200 GPUs), its table printed and runs/default/ written.
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Subcommand)]
pub enum Command {
    /// Statistics of a corpus and of its packed sequences.
    Corpus(corpus::Args),
    /// Run an experiment file (TOML) and write runs/NAME/.
    Run(run::Args),
    /// Split an experiment's sweep points over a Slurm job array (--slurm) or local
    /// processes (--jobs), one result file per point.
    Sweep(sweep::Args),
    /// Gather a sweep folder's point results into the files `run` writes.
    Merge(sweep::MergeArgs),
    /// Residual load imbalance R − 1 across pools of P sequences, per grouping policy.
    Pools(pools::Args),
    /// Libra Eq. 4's LLN bound beside Monte Carlo; recommends a pool size.
    Theory(theory::Args),
    /// Build a topology file, print its summary and write DOT and SVG pictures.
    Topo(topo::Args),
    /// Named benchmark arms (`--list`); run with --release.
    Bench(bench::Args),
    /// Write the checked Libra plan of one step (plan.json).
    Plan(plan::Args),
    /// Libra's configuration simulator: replay VRSP + TAP for candidate (P, H, B).
    LibraConfig(libra_config::Args),
    /// Check a plan file: every query attended once per head, every KV group delivered,
    /// FLOPs = the exact causal total.
    CheckPlan(check_plan::Args),
    /// Run plans on a real GPU, measure them, write a measurement CSV.
    Validate(validate::Args),
    /// Fit the cost model's kernel table, launch, copy and jitter terms to measurements.
    Calibrate(calibrate::Args),
    /// Which scheme, settings and layout to run for a model, corpus, cluster and GPU count.
    Recommend(recommend::Args),
}

/// How a command prints its result.
#[derive(Clone, Copy)]
pub struct Output {
    pub json: bool,
}

impl Output {
    /// Print `value` as JSON, or `text` (built lazily) for a person.
    pub fn emit<T: Serialize>(self, value: &T, text: impl FnOnce() -> String) -> Result<()> {
        if self.json {
            println!("{}", serde_json::to_string_pretty(value)?);
        } else {
            print!("{}", text());
        }
        Ok(())
    }
}

/// Shows an experiment's progress lines on stderr (`skewsim: 3/40 points simulated`), never
/// on stdout, so results stay byte-identical.
pub struct Stderr;

impl skewsim::experiment::Observer for Stderr {
    fn progress(&self, line: &str) {
        eprintln!("skewsim: {line}");
    }
}

pub fn main() -> Result<()> {
    // Negative numbers reach the value parsers, which refuse them by name with the
    // allowed range (instead of clap's "unexpected argument '-5'").
    let cmd = Cli::command()
        .allow_negative_numbers(true)
        .mut_subcommands(|c| c.allow_negative_numbers(true));
    let cli = Cli::from_arg_matches(&cmd.get_matches()).unwrap_or_else(|e| e.exit());
    limits::set_max_memory(cli.max_memory);
    let out = Output { json: cli.json };
    let Some(command) = cli.command else {
        return run::run_default(out);
    };
    match command {
        Command::Run(args) => run::run(args, out),
        Command::Sweep(args) => sweep::run(args, out),
        Command::Merge(args) => sweep::merge(args, out),
        Command::Corpus(args) => corpus::run(args, out),
        Command::Pools(args) => pools::run(args, out),
        Command::Theory(args) => theory::run(args, out),
        Command::Topo(args) => topo::run(args, out),
        Command::Bench(args) => bench::run(args, out),
        Command::Plan(args) => plan::run(args, out),
        Command::LibraConfig(args) => libra_config::run(args, out),
        Command::CheckPlan(args) => check_plan::run(args, out),
        Command::Validate(args) => validate::run(args, out),
        Command::Calibrate(args) => calibrate::run(args, out),
        Command::Recommend(args) => recommend::run(args, out),
    }
}
