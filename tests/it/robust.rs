//! Every input either works or is refused by name: one case per bad input that once
//! panicked, hung, aborted on allocation or was silently accepted. Each asserts a non-zero
//! exit (never a panic) and the stable part of the message.

use std::path::{Path, PathBuf};

use crate::common::{check, fails, root, scratch, Expect};

/// A file under the scratch folder `dir` with `body`.
fn write(dir: &Path, name: &str, body: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, body).unwrap();
    p.to_string_lossy().into_owned()
}

/// The plan `skewsim args` writes to `o`, as JSON (the run must succeed).
fn written_plan(args: &[&str], o: &str) -> serde_json::Value {
    check(args, Expect::Ok(""));
    serde_json::from_str(&std::fs::read_to_string(o).unwrap()).unwrap()
}

/// A committed file with its `line` (1-based) rewritten by `f`.
fn edited(
    committed: &str,
    dir: &Path,
    name: &str,
    line: usize,
    f: impl Fn(&str) -> String,
) -> String {
    let text = std::fs::read_to_string(root().join(committed)).unwrap();
    let body: Vec<String> = text
        .lines()
        .enumerate()
        .map(|(i, l)| if i + 1 == line { f(l) } else { l.to_string() })
        .collect();
    write(dir, name, &(body.join("\n") + "\n"))
}

/// A committed experiment with `from` replaced by `to` (which must occur).
fn experiment(name: &str, dir: &Path, out: &str, from: &str, to: &str) -> String {
    let text = std::fs::read_to_string(root().join("experiments").join(name)).unwrap();
    assert!(text.contains(from), "{from:?} not in {name}");
    write(dir, out, &text.replacen(from, to, 1))
}

/// A measurement CSV's field `col` (0-based) of `line` set to `v`.
fn csv_field(line: &str, col: usize, v: &str) -> String {
    let mut f: Vec<&str> = line.split(',').collect();
    f[col] = v;
    f.join(",")
}

const MEASUREMENTS: &str = "validate/results/run18/x1.csv";

fn plan_out(d: &Path) -> PathBuf {
    d.join("plan.json")
}

#[test]
fn plan_steps_past_the_limit_are_refused_for_every_scheme() {
    let d = scratch("robust-step");
    let o = plan_out(&d);
    for scheme in ["libra", "ulysses", "distca"] {
        for step in ["18446744073709551615", "4294967296"] {
            let args = [
                "plan",
                "--scheme",
                scheme,
                "--step",
                step,
                "-o",
                o.to_str().unwrap(),
            ];
            fails(&args, "is not a whole number in 0..=65535");
        }
    }
}

#[test]
fn calibrate_rows_out_of_the_kernels_range_are_refused() {
    let d = scratch("robust-cal");
    // head_dim 0 and 1 (ran for minutes), a flops NaN, a 4294967295 segment count (103 GB).
    let hd0 = edited(MEASUREMENTS, &d, "hd0.csv", 4, |l| csv_field(l, 14, "0"));
    let hd1 = edited(MEASUREMENTS, &d, "hd1.csv", 4, |l| csv_field(l, 14, "1"));
    let nan = edited(MEASUREMENTS, &d, "nan.csv", 4, |l| csv_field(l, 16, "NaN"));
    let big = edited(MEASUREMENTS, &d, "big.csv", 4, |l| {
        l.replacen("*1", "*4294967295", 1)
    });
    let cal = d.join("cal.json");
    let cal = cal.to_str().unwrap();
    for (f, want) in [
        (&hd0, "line 4: head_dim = 0: 64 or 128"),
        (&hd1, "line 4: head_dim = 1: 64 or 128"),
        (&nan, "line 4: flops = NaN: a finite number >= 0"),
        (&big, "key tiles of 64 tokens"),
    ] {
        fails(&["calibrate", "--measurements", f, "-o", cal], want);
    }
    fails(
        &[
            "calibrate",
            "--prior-weight",
            "nan",
            "--measurements",
            MEASUREMENTS,
            "-o",
            cal,
        ],
        "nan is not a finite number >= 0",
    );
}

/// One backward row's segment count `*1` → `*2` in a committed measurement file: the fit
/// must end (and succeed), a block left a round-off below zero notwithstanding.
#[test]
fn calibrate_with_one_changed_segment_count_ends() {
    let d = scratch("robust-segcount");
    let m = edited(
        "validate/results/plans_run19/run_a_measurements.csv",
        &d,
        "m.csv",
        486,
        |l| l.replacen("*1", "*2", 1),
    );
    let cal = d.join("cal.json");
    let out = crate::common::skewsim(&[
        "calibrate",
        "--measurements",
        &m,
        "-o",
        cal.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn size_knobs_past_their_maximum_are_refused_with_the_range() {
    let d = scratch("robust-sizes");
    let o = plan_out(&d);
    let o = o.to_str().unwrap();
    fails(
        &["corpus", "wlbllm", "--packing", "best-fit:100000000000"],
        "1 ≤ W ≤ 1048576",
    );
    fails(
        &["corpus", "wlbllm", "--sequences", "100000000"],
        "is not a whole number in 1..=65536",
    );
    fails(
        &["corpus", "wlbllm", "--samples", "10000000000"],
        "is not a whole number in 1..=67108864",
    );
    fails(
        &["plan", "--gbs", "100000000", "-o", o],
        "is not a whole number in 1..=65536",
    );
    // Libra's tiles: 32 sequences of 256K tokens at B = 1 and H = 4
    fails(
        &["plan", "--tile-tokens", "1", "-o", o],
        "invalid B (tile tokens) = 1: a tile size that cuts a step into at most 4194304 \
         tiles: 32 sequences at B = 1 and H = 4 make 33554432",
    );
    fails(
        &["libra-config", "--tile-tokens", "2"],
        "a tile size that cuts a step into at most 4194304 tiles",
    );
    for (flag, v, want) in [
        (
            "--sms",
            "4294967295",
            "4294967295 is not a whole number in 1..=1024",
        ),
        (
            "--blocks-per-sm",
            "100000",
            "100000 is not a whole number in 1..=32",
        ),
        (
            "--bwd-blocks-per-sm",
            "0",
            "0 is not a whole number in 1..=32",
        ),
        ("--block-m", "8", "8 is not a whole number in 16..=1024"),
        (
            "--bwd-block-n",
            "100000",
            "100000 is not a whole number in 16..=1024",
        ),
    ] {
        fails(
            &["calibrate", flag, v, "--measurements", MEASUREMENTS],
            want,
        );
    }
    fails(
        &["topo", "topologies/dgx-h200-roce.toml", "--nodes", "100000"],
        "1..=65536",
    );
    let out = d.join("topo");
    fails(
        &[
            "topo",
            "topologies/dgx-h200-roce.toml",
            "--nodes",
            "2000",
            "--out",
            out.to_str().unwrap(),
        ],
        "topo draws at most 1024 nodes unless --large is given",
    );
    fails(
        &[
            "--max-memory",
            "1M",
            "corpus",
            "libra-1m",
            "--sequences",
            "4096",
        ],
        "--max-memory raises the limit",
    );
}

#[test]
fn experiments_past_their_budget_are_refused() {
    let d = scratch("robust-exp");
    let rv =
        |name: &str, from: &str, to: &str| experiment("runtime-variance.toml", &d, name, from, to);
    let fw = |name: &str, from: &str, to: &str| experiment("four-way.toml", &d, name, from, to);
    let f8 = |name: &str, from: &str, to: &str| experiment("libra-fig8.toml", &d, name, from, to);
    // the tile grid's topology named by absolute path, so its mutants run past loading it
    let tg = |name: &str, from: &str, to: &str| {
        let f = experiment("libra-tile-grid.toml", &d, name, from, to);
        let text = std::fs::read_to_string(&f).unwrap();
        let topo = root().join("topologies/dgx-h200-roce.toml");
        let text = text.replace("../topologies/dgx-h200-roce.toml", topo.to_str().unwrap());
        write(&d, name, &text)
    };
    let many = format!("[{}]", vec!["16"; 300].join(", "));
    let grid = tg("tg-grid.toml", "dp = [16]", &format!("dp = {many}"));
    let grid = std::fs::read_to_string(&grid).unwrap();
    let grid = write(
        &d,
        "tg-grid.toml",
        &grid.replacen("gbs = [16]", &format!("gbs = {many}"), 1),
    );
    for (f, want) in [
        (
            grid,
            "at most 65536 points (the product of the sweep's lists)",
        ),
        (
            rv("rv-trim.toml", "trim = 1", "trim = 4294967295"),
            "invalid gpus = 256: at least 2·trim + 2 = 8589934592",
        ),
        (
            tg("tg-cp0.toml", "cp = 16", "cp = 0"),
            "[parallel]: cp = 0: a positive integer",
        ),
        (
            tg("tg-nodes0.toml", "gpus_per_node = 8", "gpus_per_node = 0"),
            "[cluster] gpus_per_node = 0: at least 1",
        ),
        (
            tg("tg-buckets.toml", "dp_buckets = 8", "dp_buckets = 100000"),
            "dp_buckets = 100000: at most 1024",
        ),
        (
            f8("f8-trials.toml", "trials = 200", "trials = 2000000"),
            "invalid trials = 2000000: a whole number of trials in 1..=1048576",
        ),
        (
            f8("f8-trials0.toml", "trials = 200", "trials = 0"),
            "invalid trials = 0",
        ),
        (
            f8("f8-gbs.toml", "gbs = [128]", "gbs = [131072]"),
            "invalid gbs = 131072: a global batch of 1..=65536 packed sequences",
        ),
        (
            rv("rv-steps.toml", "steps = 500", "steps = 1000000"),
            "kernel times: at most 67108864",
        ),
        (
            rv(
                "rv-k.toml",
                "kernels_per_step = 1",
                "kernels_per_step = 65536",
            ),
            "kernel times: at most",
        ),
        (
            fw("fw-cp0.toml", "cp = 8", "cp = 0"),
            "cp = 0: a degree ≥ 1",
        ),
        (
            fw("fw-cp16000.toml", "cp = 8", "cp = 16000"),
            "simulated GPUs: at most 16384 per point",
        ),
        (
            fw("fw-cp65535.toml", "cp = 8", "cp = 65535"),
            "simulated GPUs: at most 16384",
        ),
        (
            fw("fw-dp4000.toml", "dp = [2, 4, 8, 16]", "dp = [4000]"),
            "= 32000 simulated GPUs",
        ),
        (
            fw(
                "fw-topo.toml",
                "topology = \"dgx-h200-roce\"",
                "topology = \"nosuch\"",
            ),
            "[network] topology",
        ),
    ] {
        fails(&["run", &f, "--out", d.join("out").to_str().unwrap()], want);
    }
}

#[test]
fn plan_and_libra_config_refuse_what_run_refuses() {
    let d = scratch("robust-schema");
    let e =
        |name: &str, from: &str, to: &str| experiment("libra-dp-scaling.toml", &d, name, from, to);
    let modle = e("modle.toml", "model = ", "modle = ");
    let cp = e("cp.toml", "cp = 16", "cp = \"16\"");
    let dp0 = e("dp0.toml", "dp = [1, 2, 4, 8, 16]", "dp = [0]");
    let set = write(&d, "set.toml", "gbs = 16\ncp = \"16\"\n");
    let o = plan_out(&d);
    for (f, want) in [
        (&modle, "unknown field `modle`"),
        (&cp, "not a valid `train` experiment"),
        (&dp0, "[sweep] dp = [0]: every entry ≥ 1"),
        (&set, "not a valid settings file"),
    ] {
        fails(
            &["run", f, "--out", d.join("out").to_str().unwrap()],
            if f == &set { "kind" } else { want },
        );
        fails(&["plan", f, "-o", o.to_str().unwrap()], want);
        fails(&["libra-config", f], want);
    }
}

#[test]
fn zero_and_negative_values_are_named() {
    let d = scratch("robust-zero");
    let o = plan_out(&d);
    let o = o.to_str().unwrap();
    fails(
        &["plan", "--seq-len", "0", "-o", o],
        "'0' for '--seq-len <SEQ_LEN>'",
    );
    fails(
        &["corpus", "wlbllm", "--sequences", "0"],
        "0 is not a whole number in 1..=65536",
    );
    fails(
        &["corpus", "wlbllm", "--sequences", "-5"],
        "-5 is not a whole number in 1..=65536",
    );
    fails(
        &["plan", "--cp", "-3", "-o", o],
        "-3 is not a whole number in 1..=65536",
    );
    fails(
        &["corpus", "0.7*fixed:1+0.7*fixed:2"],
        "invalid corpus mixture weights = sum 1.4",
    );
    fails(
        &["validate", "--dry-run", "--reps", "0", "--plan", o],
        "'0' for '--reps <REPS>'",
    );
    // a fraction of a byte would round to a limit of 0
    fails(
        &[
            "--max-memory",
            "0.5",
            "corpus",
            "wlbllm",
            "--sequences",
            "64",
        ],
        "0.5: a byte count in 1M..=1024T",
    );
}

/// A huge value echoes in the shortest scientific form, from this crate's checks and from
/// the TOML parser's type errors alike, not as hundreds of digits.
#[test]
fn huge_values_are_echoed_in_scientific_form() {
    let d = scratch("robust-huge");
    let variance = experiment(
        "runtime-variance.toml",
        &d,
        "sigma.toml",
        "seeds = 8",
        "seeds = 1\n[variance]\npersistent = { dist = \"lognormal\", sigma = 1e300 }\n\
         jitter = { dist = \"none\" }\nspike = { prob = 0, mean = 0 }",
    );
    fails(
        &["run", &variance],
        "variance.persistent.sigma = 1e300: a number in [0, 1]",
    );
    let gpus = experiment(
        "runtime-variance.toml",
        &d,
        "gpus.toml",
        "gpus = 256",
        "gpus = 1e300",
    );
    fails(&["run", &gpus], "invalid type: floating point `1e300`");
}

#[test]
fn check_plan_refuses_empty_plans_and_unknown_schemes() {
    let d = scratch("robust-check-plan");
    let o = plan_out(&d);
    let o = o.to_str().unwrap();
    let small = [
        "plan",
        "--corpus",
        "lognormal:median=600,p99=30000",
        "--seq-len",
        "32768",
        "--gbs",
        "8",
        "--dp",
        "4",
        "--cp",
        "2",
        "--pool-size",
        "2",
        "--head-shards",
        "2",
        "--tile-tokens",
        "1024",
        "-o",
        o,
    ];
    let plan = written_plan(&small, o);
    let mut empty = plan.clone();
    empty["groups"] = serde_json::json!([]);
    let mut bogus = plan.clone();
    bogus["scheme"] = serde_json::json!("bogus");
    let empty = write(&d, "empty.json", &empty.to_string());
    let bogus = write(&d, "bogus.json", &bogus.to_string());
    fails(&["check-plan", &empty], "invalid groups = []");
    fails(&["check-plan", &bogus], "invalid scheme = \"bogus\"");
    fails(
        &["validate", "--dry-run", "--variant", "bogus", "--plan", o],
        "invalid kernel variant = bogus",
    );
}

#[test]
fn bad_attention_patterns_in_a_model_file_are_named() {
    let d = scratch("robust-masks");
    let base =
        std::fs::read_to_string(root().join("experiments/masks/llama3-8b-swa4k-50.toml")).unwrap();
    let pattern = "attention = [\"2*sliding:4096\", \"2*causal\"]";
    assert!(base.contains(pattern));
    for (name, attention, want) in [
        (
            "w0.toml",
            "attention = [\"sliding:0\"]",
            "the window W must be an integer >= 1",
        ),
        (
            "tile.toml",
            "attention = [\"2*sliding:4096\", \"causal\"]",
            "divides the model's 32 layers",
        ),
    ] {
        write(&d, name, &base.replace(pattern, attention));
        let f = experiment(
            "four-way.toml",
            &d,
            &format!("fw-{name}"),
            "model = \"llama3-8b\"",
            &format!("model = \"{name}\""),
        );
        fails(&["run", &f, "--out", d.join("out").to_str().unwrap()], want);
    }
}

/// Every flag that takes a value, of every command (read from its `--help`), given values
/// far outside any range: each run ends within a minute with exit 0, 1 or 2 (clap's),
/// without a panic or an allocation abort, and echoes no value as a run of digits.
#[test]
fn every_flag_takes_extreme_values_without_a_panic_or_a_hang() {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    const VALUES: [&str; 6] = [
        "0",
        "-1",
        "nan",
        "1e308",
        "4294967296",
        "18446744073709551616",
    ];
    const LIMIT: Duration = Duration::from_secs(60);
    let d = scratch("robust-flags");
    let r = |p: &str| root().join(p).to_string_lossy().into_owned();
    let bin = env!("CARGO_BIN_EXE_skewsim");
    // a plan for `validate` and `check-plan`
    let plan = d.join("plan.json").to_string_lossy().into_owned();
    let out = std::process::Command::new(bin)
        .args([
            "plan",
            "--corpus",
            "wlbllm",
            "--seq-len",
            "16384",
            "--gbs",
            "8",
        ])
        .args(["--dp", "4", "--cp", "2", "--pool-size", "4", "-o", &plan])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bases: Vec<Vec<String>> = [
        vec!["corpus", "wlbllm"],
        vec!["pools", "--corpus", "wlbllm"],
        vec!["theory", "--corpus", "wlbllm"],
        vec!["libra-config"],
        vec!["plan"],
        vec!["check-plan", &plan],
        vec!["validate", "--plan", &plan],
        vec!["topo", &r("topologies/dgx-h200-roce.toml")],
        vec![
            "calibrate",
            "--measurements",
            &r("validate/results/run18/x1.csv"),
        ],
        vec![
            "calibrate",
            "--collectives",
            &r("traces/nccl_tests_published.csv"),
        ],
        vec![
            "calibrate",
            "--topology",
            &r("topologies/dgx-h200-roce.toml"),
        ],
        vec![
            "recommend",
            "--corpus",
            "wlbllm",
            "--gpus",
            "8",
            "--seq-len",
            "65536",
        ],
        vec!["sweep", &r("experiments/libra-fig4.toml"), "--jobs", "1"],
    ]
    .iter()
    .map(|v| v.iter().map(|s| s.to_string()).collect())
    .collect();
    let mut cases: Vec<Vec<String>> = Vec::new();
    for base in &bases {
        let help = Command::new(bin)
            .args([&base[0], "--help"])
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&help.stdout);
        for line in help.lines() {
            let t = line.trim_start();
            let t = t.strip_prefix("-o, ").unwrap_or(t);
            let Some(rest) = t.strip_prefix("--") else {
                continue;
            };
            let Some((flag, value)) = rest.split_once(' ') else {
                continue;
            };
            if !value.starts_with('<') || base.iter().any(|b| b == &format!("--{flag}")) {
                continue;
            }
            for v in VALUES {
                let mut c = base.clone();
                c.extend([format!("--{flag}"), v.to_string()]);
                cases.push(c);
            }
        }
    }
    assert!(
        cases.len() > 500,
        "{} cases: the --help parse broke",
        cases.len()
    );
    let next = std::sync::atomic::AtomicUsize::new(0);
    let bad = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for w in 0..2 {
            let (next, bad, cases, d) = (&next, &bad, &cases, &d);
            s.spawn(move || loop {
                let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(args) = cases.get(k) else { break };
                let cwd = d.join(format!("w{w}"));
                std::fs::create_dir_all(&cwd).unwrap();
                let err = cwd.join("stderr");
                let mut child = Command::new(bin)
                    .args(args)
                    .current_dir(&cwd)
                    .env("RAYON_NUM_THREADS", "1")
                    .stdout(Stdio::null())
                    .stderr(std::fs::File::create(&err).unwrap())
                    .spawn()
                    .unwrap();
                let t0 = Instant::now();
                let status = loop {
                    if let Some(st) = child.try_wait().unwrap() {
                        break Some(st);
                    }
                    if t0.elapsed() > LIMIT {
                        let _ = child.kill();
                        let _ = child.wait();
                        break None;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                };
                let stderr = std::fs::read_to_string(&err).unwrap_or_default();
                // a value echoed digit by digit (1e308 as 309 digits)
                let long_number = stderr
                    .split(|c: char| !c.is_ascii_digit())
                    .any(|run| run.len() > 40);
                let why = match status.and_then(|s| s.code()) {
                    None => Some("no exit within the limit, or killed"),
                    Some(0..=2) if long_number => Some("a value echoed as a long number"),
                    Some(0..=2)
                        if !stderr.contains("panicked")
                            && !stderr.contains("memory allocation") =>
                    {
                        None
                    }
                    Some(_) => Some("a panic or an abort"),
                };
                if let Some(why) = why {
                    let first = stderr.lines().next().unwrap_or("").to_string();
                    bad.lock()
                        .unwrap()
                        .push(format!("{args:?}: {why}: {first}"));
                }
            });
        }
    });
    let bad = bad.into_inner().unwrap();
    assert!(bad.is_empty(), "{bad:#?}");
}

#[test]
fn input_files_that_are_not_regular_or_past_their_limit_are_refused() {
    let d = scratch("robust-input-files");
    let dir = d.to_str().unwrap();
    fails(
        &["topo", "/dev/zero", "--out", dir],
        "reading topology /dev/zero: invalid file /dev/zero = a character device, not a regular file: a regular file of at most 16.0 MiB",
    );
    fails(&["check-plan", "/dev/zero"], "a character device");
    fails(&["run", "/dev/zero"], "a character device");
    fails(&["run", dir], "a directory, not a regular file");
    let fifo = d.join("fifo.toml");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    fails(
        &["run", fifo.to_str().unwrap()],
        "a FIFO, not a regular file",
    );
    let sweep = experiment(
        "four-way.toml",
        &d,
        "zero-topology.toml",
        r#"topology = ["dgx-h200-roce", "../topologies/gb200-nvl72.toml"]"#,
        r#"topology = ["/dev/zero"]"#,
    );
    fails(
        &["run", &sweep, "--out", dir],
        "reading topology /dev/zero: invalid file /dev/zero = a character device",
    );
    // sparse files one byte past the limits of a topology and of a plan
    let sparse = |name: &str, len: u64| {
        let p = d.join(name);
        std::fs::File::create(&p).unwrap().set_len(len).unwrap();
        p.to_string_lossy().into_owned()
    };
    let topo = sparse("big.toml", (16 << 20) + 1);
    fails(
        &["topo", &topo, "--out", dir],
        "(16777217 bytes): a regular file of at most 16.0 MiB",
    );
    let plan = sparse("big.json", (1 << 30) + 1);
    fails(
        &["check-plan", &plan],
        "(1073741825 bytes): a regular file of at most 1.0 GiB",
    );
}

#[test]
fn traces_past_their_limit_or_the_memory_budget_are_refused() {
    use std::io::Write as _;
    let d = scratch("robust-trace-size");
    // 128 MiB + 2 bytes of one-token documents in a few hundred KB of gzip
    let bomb = d.join("bomb.gz");
    let mut gz = flate2::write::GzEncoder::new(
        std::fs::File::create(&bomb).unwrap(),
        flate2::Compression::fast(),
    );
    let chunk = "1\n".repeat(1 << 19);
    for _ in 0..128 {
        gz.write_all(chunk.as_bytes()).unwrap();
    }
    gz.write_all(b"1\n").unwrap();
    gz.finish().unwrap();
    fails(
        &["corpus", bomb.to_str().unwrap(), "--sequences", "1"],
        "bomb.gz: decompresses to more than 128 MiB",
    );
    let trace = write(&d, "ones.txt", &"1\n".repeat(100_000));
    fails(
        &[
            "--max-memory",
            "1M",
            "corpus",
            &trace,
            "--seq-len",
            "16",
            "--sequences",
            "1",
        ],
        "of 100000 documents needs ~1.1 MiB of memory; at most 1.0 MiB",
    );
}

#[test]
fn corpus_files_that_exist_are_refused_for_what_is_wrong() {
    let d = scratch("robust-corpus-file");
    let trace = write(&d, "one.txt", "1\n");
    let mixture = format!("0.5*{trace}+0.5*fixed:10");
    fails(&["corpus", &mixture], "invalid corpus mixture component = ");
    fails(
        &["corpus", &mixture],
        "a trace file is a corpus of its own, never part of a mixture",
    );
    fails(
        &["corpus", "/dev/zero"],
        "reading trace /dev/zero: invalid file /dev/zero = a character device, not a regular file",
    );
}

#[test]
fn plans_with_too_many_workers_are_refused_before_they_are_expanded() {
    let d = scratch("robust-plan-workers");
    let o = plan_out(&d);
    let o = o.to_str().unwrap();
    let small = [
        "plan",
        "--corpus",
        "lognormal:median=600,p99=30000",
        "--seq-len",
        "32768",
        "--gbs",
        "2",
        "--dp",
        "2",
        "--cp",
        "2",
        "--pool-size",
        "2",
        "-o",
        o,
    ];
    let plan = written_plan(&small, o);
    let with_workers = |name: &str, n: u32| {
        let mut p = plan.clone();
        p["groups"][0]["workers"] = (0..n).collect::<Vec<u32>>().into();
        write(&d, name, &p.to_string())
    };
    let over = with_workers("over.json", 65_537);
    fails(
        &["check-plan", &over],
        "workers: 65537 in one group; at most 65536 per group",
    );
    let many = with_workers("many.json", 60_000);
    fails(
        &[
            "--max-memory",
            "100M",
            "validate",
            "--dry-run",
            "--plan",
            &many,
        ],
        "plan many: 240000 launches (60000 workers × 4 head chunks) needs ~",
    );
}
