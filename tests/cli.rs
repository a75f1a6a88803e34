//! End-to-end checks of the `skewsim` binary: one data-driven table of invocations, each
//! with the exit status and a piece of text it must print. Bad input must give a clear
//! message and a non-zero exit, never a panic.

use std::process::Command;

/// What an invocation must do.
enum Expect {
    /// Exit 0 and print this on stdout.
    Ok(&'static str),
    /// Exit non-zero (not a panic) and print this on stderr.
    Err(&'static str),
}

fn skewsim(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_skewsim"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("the skewsim binary runs")
}

fn check(args: &[&str], expect: Expect) {
    let out = skewsim(args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
    match expect {
        Expect::Ok(want) => {
            assert!(out.status.success(), "{args:?} failed: {stderr}");
            assert!(
                stdout.contains(want),
                "{args:?}: {want:?} not in stdout:\n{stdout}"
            );
        }
        Expect::Err(want) => {
            assert!(!out.status.success(), "{args:?} succeeded: {stdout}");
            assert!(
                stderr.contains(want),
                "{args:?}: {want:?} not in stderr:\n{stderr}"
            );
        }
    }
}

#[test]
fn corpus_command() {
    use Expect::*;
    let dir = std::env::temp_dir().join(format!("skewsim-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = |name: &str, body: &str| {
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        p.to_string_lossy().into_owned()
    };
    let empty = file("empty.txt", "\n");
    let words = file("words.txt", "12\nabc\n");
    let negative = file("neg.json", "[5, -2]");
    let good = file("good.csv", "id,length\n1,100\n2,300\n");
    let cases: Vec<(Vec<&str>, Expect)> = vec![
        (
            vec!["corpus", "wlbllm", "--sequences", "8"],
            Ok("documents       99519"),
        ),
        (
            vec!["corpus", &good, "--seq-len", "400"],
            Ok("max      300"),
        ),
        (
            vec![
                "corpus",
                "fixed:100",
                "--seq-len",
                "1000",
                "--sequences",
                "4",
            ],
            Ok("CV 0.000"),
        ),
        (vec!["corpus", "nosuch"], Err("invalid corpus = nosuch")),
        (vec!["corpus", "missing.json"], Err("does not exist")),
        (vec!["corpus", &empty], Err("no document lengths")),
        (
            vec!["corpus", &words],
            Err("line 2: \"abc\" is not an integer"),
        ),
        (vec!["corpus", &negative], Err("item 1: length -2")),
        (vec!["corpus", "fixed:0"], Err("invalid fixed len = 0")),
        (
            vec!["corpus", "0*fixed:1+0*fixed:2"],
            Err("sum to a positive number"),
        ),
        (
            vec!["corpus", "wlbllm", "--seq-len", "0"],
            Err("invalid seq-len = 0"),
        ),
        (
            vec!["corpus", "wlbllm", "--packing", "greedy"],
            Err("invalid packing = greedy"),
        ),
    ];
    for (args, expect) in cases {
        check(&args, expect);
    }
}

#[test]
fn corpus_json_is_machine_readable_and_deterministic() {
    let run = || {
        skewsim(&[
            "corpus",
            "libra-256k",
            "--json",
            "--sequences",
            "64",
            "--samples",
            "5000",
        ])
    };
    let a = run();
    assert!(a.status.success());
    let v: serde_json::Value = serde_json::from_slice(&a.stdout).expect("valid JSON");
    assert_eq!(v["documents"]["count"], 5000);
    assert_eq!(v["packed"]["sequences"], 64);
    assert_eq!(a.stdout, run().stdout, "same seed, same bytes");
}
