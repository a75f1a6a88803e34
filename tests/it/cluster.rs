//! End-to-end checks of `skewsim topo`, the cluster-model `skewsim bench` arms and the
//! `runtime-variance` experiment: one data-driven table of invocations, each with its exit
//! status and a piece of text it must print. Bad topology files must give a message naming file, field and allowed range and a
//! non-zero exit, never a panic.

use std::path::PathBuf;

use crate::common::{check, scratch, Expect};

/// A scratch copy of `topologies/test-small.toml` with `from` replaced by `to`.
fn variant(name: &str, from: &str, to: &str) -> String {
    let text = include_str!("../../topologies/test-small.toml");
    assert!(text.contains(from), "fixture lost {from:?}");
    let dir = scratch("cluster-variants");
    std::fs::create_dir_all(&dir).unwrap();
    let p: PathBuf = dir.join(name);
    std::fs::write(&p, text.replacen(from, to, 1)).unwrap();
    p.display().to_string()
}

#[test]
fn topo_and_variance_commands() {
    let out = scratch("cluster-topo");
    let out = out.display().to_string();
    let unknown = variant("unknown.toml", "spines = 2", "spines = 2\ncolour = 3");
    let negative = variant(
        "negative.toml",
        "bandwidth_gbyte_s = 100.0",
        "bandwidth_gbyte_s = -1.0",
    );
    let fault = variant("fault.toml", "gpu = 5", "gpu = 500");
    // a `calibrate --collectives -o` report: ring 30.118 µs + 343.459 GB/s; a 2-GPU
    // all-reduce of 8 GiB moves 8 GiB through each port: 30.118 + 25,010.1 = 25,040.2 µs
    let dir = scratch("cluster-fits");
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let fit = write(
        "fit.json",
        r#"{"fit": [{"algo": "ring", "latency_us": 30.118, "bandwidth_gbs": 343.459}]}"#,
    );
    let bad_fit = write(
        "bad.json",
        r#"{"fit": [{"algo": "ring", "latency_us": -3, "bandwidth_gbs": 1}]}"#,
    );
    let cases: Vec<(Vec<&str>, Expect)> = vec![
        (
            vec!["topo", "topologies/test-small.toml", "--out", &out],
            Expect::Ok("diameter 6 hops"),
        ),
        (
            vec![
                "topo",
                "topologies/test-small.toml",
                "--nodes",
                "2",
                "--out",
                &out,
            ],
            Expect::Ok("GPUs 8"),
        ),
        (
            vec![
                "topo",
                "topologies/dgx-h200-roce.toml",
                "--nodes",
                "1",
                "--out",
                &out,
            ],
            Expect::Ok("all_gather"),
        ),
        (
            vec![
                "topo",
                "topologies/dgx-h200-roce.toml",
                "--nodes",
                "1",
                "--no-nvls",
                "--out",
                &out,
            ],
            Expect::Ok("all_reduce (ring)                     8       8 GiB"),
        ),
        (
            vec![
                "topo",
                "topologies/dgx-h200-roce.toml",
                "--nodes",
                "1",
                "--collectives",
                &fit,
                "--out",
                &out,
            ],
            Expect::Ok("all_reduce (ring)                     2       8 GiB      25040.2"),
        ),
        (
            vec![
                "topo",
                "topologies/dgx-h200-roce.toml",
                "--collectives",
                &bad_fit,
                "--out",
                &out,
            ],
            Expect::Err("collectives.fit[0].latency_us = -3"),
        ),
        (
            vec![
                "topo",
                "topologies/gb200-nvl72.toml",
                "--nodes",
                "20",
                "--out",
                &out,
            ],
            Expect::Err("super_node.nodes = 18: a divisor of nodes = 20"),
        ),
        (
            vec![
                "topo",
                "topologies/test-small.toml",
                "--nodes",
                "0",
                "--out",
                &out,
            ],
            Expect::Err("0 is not a whole number in 1..=65536"),
        ),
        (
            vec!["topo", &unknown, "--out", &out],
            Expect::Err("unknown field `colour`"),
        ),
        (
            vec!["topo", &negative, "--out", &out],
            Expect::Err("nvlink.bandwidth_gbyte_s = -1: a finite number > 0"),
        ),
        (
            vec!["topo", "no-such-topology.toml"],
            Expect::Err("reading topology"),
        ),
        (
            vec!["run", "experiments/runtime-variance.toml", "--out", &out],
            Expect::Ok("| mean | "),
        ),
    ];
    for (args, expect) in cases {
        check(&args, expect);
    }
    check(
        &["topo", &fault, "--out", &out],
        Expect::Err("faults.gpu[0].gpu = 500: a GPU id in [0, 16)"),
    );
    check(
        &["topo", "topologies/test-small.toml", "--out", &out],
        Expect::Ok("faults injected: 1 GPU, 0 link"),
    );
    assert!(PathBuf::from(&out).join("test-small.svg").exists());
    assert!(PathBuf::from(&out).join("test-small.dot").exists());
}

/// The recomputation-scaling table `topo --bench` used to print is the `skewsim bench`
/// arm `recompute-scaling`; the old flag says where it went.
#[test]
fn recompute_scaling_is_a_bench_arm() {
    // all flows leave GPU 0: the 5 measured recomputations re-rate F+1 … F+5 flows,
    // F+3 on average; the random flows' counts are the documented ones (BENCHMARKS.md)
    check(
        &["bench", "recompute-scaling"],
        Expect::Ok("one component: 257 → "),
    );
    let out = crate::common::skewsim(&["bench", "recompute-scaling"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    for want in [
        "(259 re-rated",
        "65537 → ",
        "(65539 re-rated",
        "random: 257 → ",
        "(2 re-rated",
        "(36048 re-rated",
    ] {
        assert!(stdout.contains(want), "{want:?} not in {stdout}");
    }
    assert_eq!(stdout.matches(" re-rated, ").count(), 10, "{stdout}");
    check(&["bench", "--list"], Expect::Ok("flow-a2a-4096-full"));
    for old in [
        vec!["topo", "topologies/dgx-h200-roce.toml", "--bench"],
        vec![
            "topo",
            "topologies/dgx-h200-roce.toml",
            "--bench-rounds",
            "4095",
        ],
    ] {
        check(
            &old,
            Expect::Err("run `skewsim bench topo-16k flow-a2a-4096 recompute-scaling`"),
        );
    }
}
