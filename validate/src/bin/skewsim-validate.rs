//! `skewsim-validate`: runs the attention kernels on a real GPU.
//!
//! Subcommands:
//!   check  [--seed N] [--variants v1w4,...]        (default: every forward variant, and the backward)
//!   bench  [--heads 32,8,2] [--kv-div 1] [--head-dim 128] [--docs 128,...] [--reps 20] [--warmup 3]
//!          [--variants v3w4] [--csv FILE]      (h_kv = heads / kv-div)
//!   jitter [--doc-len 4096] [--heads 32] [--reps 200] [--variant v3w4] [--device 0] [--csv FILE]
//!   jitter-fit FILE...                        variance-model parameters from jitter CSVs (no GPU)
//!   trace  FILE [--filter flash]              list kernels of a PyTorch-profiler Chrome trace
//!   bench-bwd [--heads 32,8,2] [--docs 512,4096,16384] [--csv FILE]   backward speed
//!   bench-mixed --corpus FILE [--heads 32,8] [--chunk 0,4096,1024] [--variants v3w4] [--units-dir DIR] [--csv FILE]
//!   bench-grid [--heads 8,32] [--q 128,512,2048,8192] [--ratio 1,4,16] [--count 1,4] [--variant v3w4]
//!          [--units-dir DIR] [--csv FILE]   efficiency grid: count units of [kv-q, kv) per launch
//!   compile [--ptx-dir DIR]                   NVRTC-compile every kernel variant (no GPU needed)
//! Variants: v{1,2,3}w{4,8} = kernel version, warps per block (BENCHMARKS.md, "Kernel versions").
//! Exits non-zero with a message ("no CUDA driver found") on a machine without a GPU.

use std::io::Write;
use std::process::ExitCode;

use rand::SeedableRng;
use validate::error::{invalid, Error};
use validate::gpu::{FwdVariant, Gpu};
use validate::harness::{
    bench_batch, bench_bwd_docs, bench_docs, bench_units, check_bwd_case, check_case, check_cases,
    upload_random, upload_random_rows, BenchRow,
};
use validate::stats::Jitter;
use validate::units::{Batch, Heads};

struct Args {
    rest: Vec<String>,
}

impl Args {
    fn opt(&self, name: &str) -> Option<&str> {
        self.rest
            .iter()
            .position(|a| a == name)
            .and_then(|i| self.rest.get(i + 1))
            .map(String::as_str)
    }
    fn num<T: std::str::FromStr>(&self, name: &str, default: T) -> Result<T, Error> {
        match self.opt(name) {
            None => Ok(default),
            Some(s) => s
                .parse()
                .map_err(|_| invalid(name, s, "a non-negative integer")),
        }
    }
    fn strs(&self, name: &str, default: &[&str]) -> Vec<String> {
        match self.opt(name) {
            None => default.iter().map(|s| s.to_string()).collect(),
            Some(s) => s.split(',').map(|x| x.trim().to_string()).collect(),
        }
    }
    fn list(&self, name: &str, default: &[u32]) -> Result<Vec<u32>, Error> {
        match self.opt(name) {
            None => Ok(default.to_vec()),
            Some(s) => s
                .split(',')
                .map(|x| {
                    x.trim()
                        .parse()
                        .map_err(|_| invalid(name, x, "comma-separated integers"))
                })
                .collect(),
        }
    }
}

fn default_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1)
}

fn header(gpu: &Gpu) {
    println!(
        "# device: {} ({} SMs), CUDA driver API {}",
        gpu.name, gpu.sm_count, gpu.driver_version
    );
}

fn write_csv(path: Option<&str>, header: &str, rows: &[String]) -> Result<(), Error> {
    let Some(p) = path else { return Ok(()) };
    let mut s = String::from(header);
    s.push('\n');
    for r in rows {
        s.push_str(r);
        s.push('\n');
    }
    std::fs::write(p, s).map_err(|e| invalid("--csv", p, format!("a writable path ({e})")))
}

fn check(a: &Args) -> Result<(), Error> {
    let seed = a.num("--seed", default_seed())?;
    let mut gpu = Gpu::open(0)?;
    header(&gpu);
    println!("# seed {seed}");
    let mut failed = 0;
    let all = ["v1w4", "v1w8", "v2w4", "v2w8", "v3w4", "v3w8"];
    for spec in a.strs("--variants", &all) {
        for d in [64u32, 128] {
            let var = FwdVariant::parse(&spec, d)?;
            let (regs, local) = gpu.kernel_resources(var)?;
            println!(
                "# {}: {regs} registers/thread, {local} B local (spill) memory",
                var.label()
            );
        }
        for (i, case) in check_cases()?.iter().enumerate() {
            let var = FwdVariant::parse(&spec, case.heads.head_dim)?;
            let r = check_case(&mut gpu, case, var, seed.wrapping_add(i as u64))?;
            let ok = r.passed();
            failed += usize::from(!ok);
            println!(
                "{:<18} {:<16} rel_l2(O) {:.2e}  rel_l2(LSE) {:.2e}  unwritten {}  {}",
                r.case,
                r.variant,
                r.rel_l2_out,
                r.rel_l2_lse,
                r.unwritten,
                if ok { "PASS" } else { "FAIL" }
            );
        }
    }
    for d in [64u32, 128] {
        for (i, (regs, local)) in gpu.bwd_resources(d)?.iter().enumerate() {
            let n = ["dot", "dq", "dkdv"][i];
            println!("# bwd-v1-d{d} {n}: {regs} registers/thread, {local} B local (spill) memory");
        }
    }
    for (i, case) in check_cases()?.iter().enumerate() {
        let r = check_bwd_case(&mut gpu, case, seed.wrapping_add(100 + i as u64))?;
        let ok = r.passed();
        failed += usize::from(!ok);
        println!(
            "{:<18} bwd-v1-d{:<8} rel_l2(dQ) {:.2e}  rel_l2(dK) {:.2e}  rel_l2(dV) {:.2e}  unwritten dQ {}  {}",
            r.case,
            case.heads.head_dim,
            r.rel_l2_dq,
            r.rel_l2_dk,
            r.rel_l2_dv,
            r.unwritten_dq,
            if ok { "PASS" } else { "FAIL" }
        );
    }
    if failed > 0 {
        return Err(Error::CheckFailed(format!("{failed} case(s) failed")));
    }
    Ok(())
}

fn bench(a: &Args) -> Result<(), Error> {
    let heads = a.list("--heads", &[32, 8, 2])?;
    let docs = a.list("--docs", &[128, 256, 512, 1024, 4096, 16384, 65536])?;
    let total = a.num("--total", 65536u32)?;
    let reps = a.num("--reps", 20usize)?;
    let warmup = a.num("--warmup", 3usize)?;
    let d = a.num("--head-dim", 128u32)?;
    let variants = a.strs("--variants", &["v3w4"]);
    let seed = a.num("--seed", default_seed())?;
    let kv_div = a.num("--kv-div", 1u32)?;
    let mut gpu = Gpu::open(0)?;
    header(&gpu);
    println!("{}", BenchRow::CSV_HEADER);
    let mut rows = Vec::new();
    for &h in &heads {
        if kv_div == 0 || h % kv_div != 0 {
            return Err(invalid(
                "--kv-div",
                kv_div,
                format!("a divisor of heads = {h}"),
            ));
        }
        let hd = Heads::new(h, h / kv_div, d)?;
        let mut buf = upload_random(&gpu, hd, total, 64, seed)?;
        for spec in &variants {
            let var = FwdVariant::parse(spec, d)?;
            for &l in &docs {
                let (r, _) = bench_docs(&mut gpu, &mut buf, var, hd, total, l, warmup, reps)?;
                println!("{}", r.csv());
                rows.push(r.csv());
            }
        }
    }
    write_csv(a.opt("--csv"), BenchRow::CSV_HEADER, &rows)
}

fn jitter(a: &Args) -> Result<(), Error> {
    let docs = a.list("--doc-len", &[4096])?;
    let heads = a.list("--heads", &[32])?;
    let reps = a.num("--reps", 200usize)?;
    let var = FwdVariant::parse(a.opt("--variant").unwrap_or("v3w4"), 128)?;
    let total = a.num("--total", 65536u32)?;
    let seed = a.num("--seed", default_seed())?;
    let device = a.num("--device", 0usize)?;
    let mut gpu = Gpu::open(device)?;
    header(&gpu);
    let hdr = "device,kernel,heads,doc_len,rep,ms,factor";
    let mut raw = Vec::new();
    println!("kernel,heads,doc_len,n,median_ms,min,p10,p90,p99,max,std,lag1");
    for &h in &heads {
        let hd = Heads::new(h, h, 128)?;
        let mut buf = upload_random(&gpu, hd, total, 64, seed)?;
        for &l in &docs {
            let (_, ms) = bench_docs(&mut gpu, &mut buf, var, hd, total, l, 10, reps)?;
            println!(
                "# {} heads {h} doc_len {l}: series started at unix {:.1} ms (host clock)",
                var.label(),
                gpu.last_timing_start_unix_ms
            );
            let j = Jitter::from_times(&ms)
                .ok_or_else(|| Error::CheckFailed("no valid timings".into()))?;
            println!(
                "{},{h},{l},{},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4},{:.3}",
                var.label(),
                j.n,
                j.median_ms,
                j.min,
                j.p10,
                j.p90,
                j.p99,
                j.max,
                j.std,
                j.lag1
            );
            for (i, t) in ms.iter().enumerate() {
                raw.push(format!(
                    "{device},{},{h},{l},{i},{t:.5},{:.5}",
                    var.label(),
                    t / j.median_ms
                ));
            }
        }
    }
    write_csv(a.opt("--csv"), hdr, &raw)
}

fn bench_bwd(a: &Args) -> Result<(), Error> {
    let heads = a.list("--heads", &[32, 8, 2])?;
    let docs = a.list("--docs", &[512, 4096, 16384])?;
    let total = a.num("--total", 65536u32)?;
    let reps = a.num("--reps", 10usize)?;
    let warmup = a.num("--warmup", 2usize)?;
    let seed = a.num("--seed", default_seed())?;
    let mut gpu = Gpu::open(0)?;
    header(&gpu);
    println!("{}", BenchRow::CSV_HEADER);
    let mut rows = Vec::new();
    for &h in &heads {
        let hd = Heads::new(h, h, 128)?;
        let mut buf = upload_random(&gpu, hd, total, 64, seed)?;
        for &l in &docs {
            let r = bench_bwd_docs(
                &mut gpu,
                &mut buf,
                hd,
                total,
                l,
                warmup,
                reps,
                seed ^ 0x5eed,
            )?;
            println!("{}", r.csv());
            rows.push(r.csv());
        }
    }
    write_csv(a.opt("--csv"), BenchRow::CSV_HEADER, &rows)
}

/// Forward on packed batches drawn from a document-length corpus (JSON list of lengths), whole
/// documents (`--chunk 0`) or cut into chunks of query tokens; writes each batch's units for the
/// PyTorch side (`--units-dir`).
fn bench_mixed(a: &Args) -> Result<(), Error> {
    let path = a
        .opt("--corpus")
        .ok_or_else(|| invalid("--corpus", "(missing)", "a JSON list of document lengths"))?;
    let text = std::fs::read_to_string(path)
        .map_err(|e| invalid("--corpus", path, format!("a readable file ({e})")))?;
    let corpus: Vec<u32> = serde_json::from_str(&text)
        .map_err(|e| validate::error::parse_error(format!("corpus {path}"), e))?;
    let heads = a.list("--heads", &[32, 8])?;
    let chunks = a.list("--chunk", &[0, 4096, 1024])?;
    let variants = a.strs("--variants", &["v3w4"]);
    let total = a.num("--total", 65536u32)?;
    let reps = a.num("--reps", 20usize)?;
    let seed = a.num("--seed", 7u64)?;
    let mut gpu = Gpu::open(0)?;
    header(&gpu);
    let hdr = "kernel,heads,chunk,samples,units,total_tokens,max_doc,median_ms,tflops";
    println!("{hdr}");
    let mut rows = Vec::new();
    for &h in &heads {
        let hd = Heads::new(h, h, 128)?;
        let mut buf = upload_random(&gpu, hd, total, 64, seed)?;
        for &c in &chunks {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let batch = Batch::from_corpus(&corpus, total, (c > 0).then_some(c), &mut rng)?;
            if let Some(dir) = a.opt("--units-dir") {
                let mut t = String::from("sample,sample_len,a,e\n");
                for u in &batch.units {
                    t.push_str(&format!(
                        "{},{},{},{}\n",
                        u.sample, batch.sample_lens[u.sample], u.a, u.e
                    ));
                }
                let p = format!("{dir}/units_h{h}_c{c}.csv");
                std::fs::write(&p, t).map_err(|e| invalid("--units-dir", dir, e.to_string()))?;
            }
            for spec in &variants {
                let var = FwdVariant::parse(spec, 128)?;
                let (r, _) = bench_batch(&mut gpu, &mut buf, var, hd, &batch, c, 3, reps)?;
                let row = format!(
                    "{},{h},{c},{},{},{total},{},{:.4},{:.1}",
                    r.kernel,
                    batch.sample_lens.len(),
                    batch.units.len(),
                    batch.sample_lens.iter().max().copied().unwrap_or(0),
                    r.median_ms,
                    r.tflops
                );
                println!("{row}");
                rows.push(row);
            }
        }
    }
    write_csv(a.opt("--csv"), hdr, &rows)
}

/// Fits the simulator's variance-model parameters to raw jitter CSVs (`jitter --csv`): per
/// (device, kernel, heads, doc_len) series, and the persistent per-GPU σ where a series ran on
/// several devices.
fn jitter_fit(a: &Args) -> Result<(), Error> {
    use std::collections::BTreeMap;
    use validate::stats::{fit_variance, persistent_sigma, quantile};
    let files: Vec<&String> = a.rest.iter().filter(|x| !x.starts_with("--")).collect();
    if files.is_empty() {
        return Err(invalid(
            "jitter-fit FILE",
            "(none)",
            "one or more jitter CSV files",
        ));
    }
    // (file, kernel, heads, doc_len) -> device -> times. Persistent σ is only estimated across
    // the devices of one file (one run on several GPUs at once).
    type Key = (String, String, u32, u32);
    let mut series: BTreeMap<Key, BTreeMap<String, Vec<f64>>> = BTreeMap::new();
    for path in files {
        let text = std::fs::read_to_string(path)
            .map_err(|e| invalid("jitter-fit FILE", path, format!("a readable file ({e})")))?;
        let mut lines = text.lines();
        let header: Vec<&str> = lines.next().unwrap_or_default().split(',').collect();
        let col = |name: &str| {
            header.iter().position(|h| *h == name).ok_or_else(|| {
                validate::error::parse_error(path.as_str(), format!("no `{name}` column"))
            })
        };
        let (ck, ch, cl, cm) = (col("kernel")?, col("heads")?, col("doc_len")?, col("ms")?);
        let cd = header.iter().position(|h| *h == "device");
        for (i, line) in lines.enumerate() {
            let f: Vec<&str> = line.split(',').collect();
            let bad =
                |what: &str| validate::error::parse_error(format!("{path} line {}", i + 2), what);
            let get = |c: usize| f.get(c).copied().ok_or_else(|| bad("too few fields"));
            let heads: u32 = get(ch)?
                .parse()
                .map_err(|_| bad("heads is not an integer"))?;
            let doc: u32 = get(cl)?
                .parse()
                .map_err(|_| bad("doc_len is not an integer"))?;
            let ms: f64 = get(cm)?.parse().map_err(|_| bad("ms is not a number"))?;
            let dev = match cd {
                Some(c) => get(c)?.to_string(),
                None => "0".to_string(),
            };
            series
                .entry((path.to_string(), get(ck)?.to_string(), heads, doc))
                .or_default()
                .entry(dev)
                .or_default()
                .push(ms);
        }
    }
    println!(
        "file,device,kernel,heads,doc_len,n,median_ms,jitter_sigma,spike_prob,spike_mean,lag1"
    );
    for ((file, k, h, l), devs) in &series {
        let mut medians = Vec::new();
        for (dev, ms) in devs {
            let fit = fit_variance(ms).ok_or_else(|| {
                Error::CheckFailed(format!("{dev} {k} {h} {l}: fewer than 10 valid times"))
            })?;
            let med = quantile(ms, 0.5).unwrap_or(f64::NAN);
            medians.push(med);
            println!(
                "{file},{dev},{k},{h},{l},{},{med:.4},{:.4},{:.4},{:.4},{:.2}",
                fit.n, fit.sigma, fit.spike_prob, fit.spike_mean, fit.lag1
            );
        }
        if let Some(p) = persistent_sigma(&medians) {
            println!(
                "# {file} {k} heads {h} doc_len {l}: persistent sigma across {} GPUs = {p:.4}",
                medians.len()
            );
        }
    }
    Ok(())
}

/// Kernel-efficiency grid for calibration: one launch = `count` identical units, each the last
/// `q` query positions of a `kv`-token sample (`[kv − q, kv)` attending `[0, kv)`), over
/// heads × q × (kv = ratio·q) × count. Writes each case's units for the PyTorch side.
fn bench_grid(a: &Args) -> Result<(), Error> {
    let heads = a.list("--heads", &[8, 32])?;
    let qs = a.list("--q", &[128, 512, 2048, 8192])?;
    let ratios = a.list("--ratio", &[1, 4, 16])?;
    let counts = a.list("--count", &[1, 4])?;
    let max_kv = a.num("--max-kv", 65536u32)?;
    let reps = a.num("--reps", 20usize)?;
    let seed = a.num("--seed", default_seed())?;
    let var = FwdVariant::parse(a.opt("--variant").unwrap_or("v3w4"), 128)?;
    let mut cases = Vec::new();
    for &q in &qs {
        for &r in &ratios {
            let kv = q.saturating_mul(r);
            if q == 0 || r == 0 || kv > max_kv {
                continue;
            }
            for &n in &counts {
                cases.push((q, kv, n));
            }
        }
    }
    let max_n = counts.iter().copied().max().unwrap_or(1);
    let max_q_rows = cases.iter().map(|c| c.0 * c.2).max().unwrap_or(1);
    let max_kv_rows = cases
        .iter()
        .map(|c| c.1 * c.2)
        .max()
        .unwrap_or(1)
        .max(max_q_rows);
    let mut gpu = Gpu::open(0)?;
    header(&gpu);
    println!("# variant {}, up to {max_n} units per launch", var.label());
    let hdr = "case,kernel,heads,q_len,kv_len,units,flops,median_ms,tflops";
    println!("{hdr}");
    let mut rows = Vec::new();
    for &h in &heads {
        let hd = Heads::new(h, h, 128)?;
        let mut buf = upload_random_rows(&gpu, hd, max_q_rows, max_kv_rows, seed)?;
        for &(q, kv, n) in &cases {
            let batch = Batch {
                sample_lens: vec![kv; n as usize],
                units: (0..n as usize)
                    .map(|s| validate::units::WorkUnit {
                        sample: s,
                        a: kv - q,
                        e: kv,
                    })
                    .collect(),
            };
            let name = format!("g_h{h}_q{q}_k{kv}_n{n}");
            if let Some(dir) = a.opt("--units-dir") {
                let mut t = String::from("sample,sample_len,a,e\n");
                for u in &batch.units {
                    t.push_str(&format!("{},{kv},{},{}\n", u.sample, u.a, u.e));
                }
                let p = format!("{dir}/units_{name}.csv");
                std::fs::write(&p, t).map_err(|e| invalid("--units-dir", dir, e.to_string()))?;
            }
            let (ms, tf) = bench_units(&mut gpu, &mut buf, var, hd, &batch, 3, reps)?;
            let row = format!(
                "{name},{},{h},{q},{kv},{n},{:.4e},{ms:.4},{tf:.1}",
                var.label(),
                batch.flops(hd)
            );
            println!("{row}");
            rows.push(row);
        }
    }
    write_csv(a.opt("--csv"), hdr, &rows)
}

fn trace(a: &Args) -> Result<(), Error> {
    let path = a
        .rest
        .first()
        .ok_or_else(|| invalid("trace FILE", "(missing)", "a Chrome trace JSON path"))?;
    let text = std::fs::read_to_string(path)
        .map_err(|e| invalid("trace FILE", path, format!("a readable file ({e})")))?;
    let filter = a.opt("--filter").unwrap_or("flash");
    let ks = validate::trace::parse_kernels(&text, filter)?;
    println!("kernel,op,dur_us,input_dims");
    for k in ks {
        println!(
            "\"{}\",{},{:.3},\"{:?}\"",
            k.name,
            k.op.unwrap_or_default(),
            k.dur_us,
            k.input_dims
        );
    }
    Ok(())
}

fn compile(a: &Args) -> Result<(), Error> {
    let dir = a.opt("--ptx-dir");
    for spec in ["v1w4", "v1w8", "v2w4", "v2w8", "v3w4", "v3w8"] {
        for head_dim in [64u32, 128] {
            let var = FwdVariant::parse(spec, head_dim)?;
            let mut outs = vec![(var.label(), validate::gpu::compile_fwd(var, &[])?)];
            if spec == "v1w4" {
                let bwd = validate::gpu::compile_bwd(head_dim, &[])?;
                outs.push((format!("bwd-v1-d{head_dim}"), bwd));
            }
            for (label, ptx) in outs {
                let src = ptx.to_src();
                println!("{label}: {} lines of PTX", src.lines().count());
                if let Some(d) = dir {
                    let p = format!("{d}/{label}.ptx");
                    std::fs::write(&p, src).map_err(|e| invalid("--ptx-dir", d, e.to_string()))?;
                }
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let mut argv = std::env::args().skip(1);
    let cmd = argv.next().unwrap_or_default();
    let a = Args {
        rest: argv.collect(),
    };
    let r = match cmd.as_str() {
        "check" => check(&a),
        "bench" => bench(&a),
        "jitter" => jitter(&a),
        "trace" => trace(&a),
        "compile" => compile(&a),
        "bench-bwd" => bench_bwd(&a),
        "bench-mixed" => bench_mixed(&a),
        "jitter-fit" => jitter_fit(&a),
        "bench-grid" => bench_grid(&a),
        other => Err(invalid(
            "subcommand",
            other,
            "check, bench, bench-bwd, bench-mixed, bench-grid, jitter, jitter-fit, trace or compile",
        )),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "skewsim-validate: error: {e}");
            ExitCode::FAILURE
        }
    }
}
