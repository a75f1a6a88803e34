//! The committed Libra experiment results reproduce: a cheap slice (one point) of each
//! experiment file under `experiments/` is re-run with the CLI and its point-local columns
//! (everything but the columns that compare against other points) must equal the committed
//! `experiments/results/NAME/points.csv` row byte for byte; the pipeline experiment's
//! micro-batch rows too. Same slice twice, on 1 and 2 threads ⇒ identical bytes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::common::{root, scratch, skewsim_threads};

/// The experiment file with its `[sweep]` narrowed to `sweep` (keys replaced) and the
/// topology taken from the built-in copy (the slice lives outside the repository).
fn slice(name: &str, sweep: &[(&str, toml::Value)], dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(root().join(format!("experiments/{name}.toml"))).unwrap();
    let mut doc: toml::Table = toml::from_str(&text).unwrap();
    let net = doc.get_mut("network").unwrap().as_table_mut().unwrap();
    net.insert(
        "topology".into(),
        toml::Value::String("dgx-h200-roce".into()),
    );
    let sw = doc.get_mut("sweep").unwrap().as_table_mut().unwrap();
    for (k, v) in sweep {
        sw.insert((*k).to_string(), v.clone());
    }
    let p = dir.join(format!("{name}.toml"));
    std::fs::write(&p, toml::to_string(&doc).unwrap()).unwrap();
    p
}

fn run(file: &Path, out: &Path, threads: &str) {
    let o = skewsim_threads(
        &[
            "run",
            file.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
        Some(threads),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// Columns of points.csv that depend on the point alone.
const LOCAL: &[&str] = &[
    "scheme",
    "pool_size",
    "tile_tokens",
    "head_shards",
    "chunks",
    "corpus",
    "seq_len",
    "gbs",
    "dp",
    "ga",
    "gpus",
    "mean_iteration_ms",
    "tokens_per_s",
    "mfu",
    "wait_fraction",
    "exposed_comm_fraction",
    "compute_ms",
    "cp_comm_ms",
    "exposed_comm_ms",
    "infeasible_ranks",
];

fn rows(csv: &str) -> Vec<BTreeMap<String, String>> {
    let mut lines = csv.lines();
    let head: Vec<&str> = lines.next().unwrap().split(',').collect();
    lines
        .map(|l| {
            head.iter()
                .zip(l.split(','))
                .map(|(h, v)| (h.to_string(), v.to_string()))
                .collect()
        })
        .collect()
}

fn local(r: &BTreeMap<String, String>) -> Vec<String> {
    LOCAL.iter().map(|k| r[*k].clone()).collect()
}

/// Re-run `name` narrowed to `sweep` and compare its rows against the committed ones.
fn reproduces(name: &str, sweep: &[(&str, toml::Value)]) -> PathBuf {
    let dir = scratch(name);
    let file = slice(name, sweep, &dir);
    let out = dir.join("out");
    run(&file, &out, "2");
    let got = rows(&std::fs::read_to_string(out.join("points.csv")).unwrap());
    let committed = rows(
        &std::fs::read_to_string(root().join(format!("experiments/results/{name}/points.csv")))
            .unwrap(),
    );
    assert!(!got.is_empty());
    for g in &got {
        let key = local(g)[..11].to_vec();
        let c = committed
            .iter()
            .find(|c| local(c)[..11] == key[..])
            .unwrap_or_else(|| panic!("{name}: no committed row for {key:?}"));
        assert_eq!(local(g), local(c), "{name}: {key:?}");
    }
    out
}

fn s(v: &str) -> toml::Value {
    toml::Value::String(v.into())
}

fn arr(v: Vec<toml::Value>) -> toml::Value {
    toml::Value::Array(v)
}

fn int(v: i64) -> toml::Value {
    toml::Value::Integer(v)
}

#[test]
fn dp_scaling_slice_reproduces() {
    reproduces(
        "libra-dp-scaling",
        &[
            ("dp", arr(vec![int(16)])),
            ("gbs", arr(vec![int(16)])),
            ("corpus", arr(vec![s("libra-256k")])),
            ("scheme", arr(vec![s("ulysses"), s("libra")])),
        ],
    );
}

#[test]
fn pool_sweep_slice_reproduces() {
    reproduces(
        "libra-pool-sweep",
        &[
            ("corpus", arr(vec![s("libra-256k")])),
            ("scheme", arr(vec![s("libra-tap-vrsp")])),
            ("pool_size", arr(vec![int(4)])),
        ],
    );
}

#[test]
fn tile_grid_slice_reproduces() {
    reproduces(
        "libra-tile-grid",
        &[
            ("scheme", arr(vec![s("libra-tap-vrsp")])),
            ("tile", arr(vec![arr(vec![int(8192), int(4)])])),
        ],
    );
}

#[test]
fn pp_microbatch_slice_reproduces_points_and_micro_batches() {
    let out = reproduces(
        "libra-pp-microbatch",
        &[
            ("corpus", arr(vec![s("libra-256k")])),
            ("scheme", arr(vec![s("libra")])),
        ],
    );
    let got = std::fs::read_to_string(out.join("microbatches.csv")).unwrap();
    let committed = std::fs::read_to_string(
        root().join("experiments/results/libra-pp-microbatch/microbatches.csv"),
    )
    .unwrap();
    let mut n = 0;
    for l in got.lines().skip(1) {
        assert!(committed.lines().any(|c| c == l), "missing row {l}");
        n += 1;
    }
    // 15 steps × 8 replicas × 4 micro-batches × 2 stages.
    assert_eq!(n, 15 * 8 * 4 * 2);
}

#[test]
fn same_slice_twice_on_one_and_two_threads_is_byte_identical() {
    let dir = scratch("det");
    let file = slice(
        "libra-tile-grid",
        &[
            ("scheme", arr(vec![s("ulysses"), s("libra-tap-vrsp")])),
            (
                "tile",
                arr(vec![
                    arr(vec![int(8192), int(4)]),
                    arr(vec![int(4096), int(2)]),
                ]),
            ),
        ],
        &dir,
    );
    let (a, b) = (dir.join("a"), dir.join("b"));
    run(&file, &a, "1");
    run(&file, &b, "2");
    let mut names: Vec<String> = std::fs::read_dir(&a)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert!(names.contains(&"points.csv".to_string()), "{names:?}");
    assert!(names.iter().any(|n| n.ends_with(".svg")), "{names:?}");
    for n in &names {
        assert_eq!(
            std::fs::read(a.join(n)).unwrap(),
            std::fs::read(b.join(n)).unwrap(),
            "{n} differs between runs"
        );
    }
}

#[test]
fn bad_libra_settings_are_named() {
    let dir = scratch("bad");
    for (key, value, want) in [
        ("chunks", int(3), "M (pipeliner chunks)"),
        ("head_shards", int(5), "H (head shards)"),
        ("tile_tokens", int(0), "B (tile tokens)"),
        ("pool_size", int(3), "P (pool size)"),
    ] {
        let file = slice(
            "libra-tile-grid",
            &[
                ("scheme", arr(vec![s("libra")])),
                ("tile", arr(vec![arr(vec![int(8192), int(4)])])),
            ],
            &dir,
        );
        let mut doc: toml::Table =
            toml::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        let lib = doc.get_mut("libra").unwrap().as_table_mut().unwrap();
        lib.insert(key.into(), value.clone());
        lib.insert(
            "chunks".into(),
            if key == "chunks" {
                value.clone()
            } else {
                int(1)
            },
        );
        if key == "tile_tokens" || key == "head_shards" {
            // The sweep's tile list overrides [libra]'s B and H.
            let sw = doc.get_mut("sweep").unwrap().as_table_mut().unwrap();
            sw.remove("tile");
        }
        std::fs::write(&file, toml::to_string(&doc).unwrap()).unwrap();
        let o = skewsim_threads(
            &[
                "run",
                file.to_str().unwrap(),
                "--out",
                dir.join("o").to_str().unwrap(),
            ],
            None,
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{key}: {err}");
        assert!(err.contains(want), "{key}: {err}");
        assert!(!err.contains("panicked"), "{key}: {err}");
    }
    let file = slice("libra-tile-grid", &[("scheme", arr(vec![s("ring")]))], &dir);
    let o = skewsim_threads(
        &[
            "run",
            file.to_str().unwrap(),
            "--out",
            dir.join("o").to_str().unwrap(),
        ],
        None,
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("libra-tap-vrsp"),
        "{err}"
    );
}
