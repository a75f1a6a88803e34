//! Runs the issue-6 scheme benchmarks until they are registered in `skewsim bench`
//! (`src/cli/bench.rs`): `cargo run --release --example bench_schemes [REPS]`.

#[path = "../src/cli/bench_schemes.rs"]
mod bench_schemes;

fn main() -> anyhow::Result<()> {
    let reps = match std::env::args().nth(1) {
        Some(r) => r.parse()?,
        None => 20,
    };
    print!("{}", bench_schemes::table(&bench_schemes::rows(reps)?));
    Ok(())
}
