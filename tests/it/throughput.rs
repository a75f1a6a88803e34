//! The `throughput` kind: published training throughput beside the simulated step. Two of
//! the committed experiment's rows (8 GPUs each) rerun from a slice of its file and
//! reproduce their lines of `experiments/results/public-throughput/points.csv` byte for
//! byte at two thread counts; bad rows and files are refused by name.

use crate::common::{fails, root, scratch, skewsim_threads};

/// The committed experiment with only `rows`, written where its relative paths still
/// resolve (the `experiments/` folder's own paths, made absolute).
fn slice(name: &str, rows: &str) -> std::path::PathBuf {
    let text = std::fs::read_to_string(root().join("experiments/public-throughput.toml")).unwrap();
    let exp = root().join("experiments");
    let mut out = String::new();
    for line in text.lines() {
        if line.starts_with("rows = ") {
            out += &format!("rows = {rows}\n");
        } else if let Some(p) = line
            .split('"')
            .nth(1)
            .filter(|p| p.starts_with("..") || p.starts_with("data/"))
        {
            out += &line.replace(p, &exp.join(p).display().to_string());
            out.push('\n');
        } else {
            out += line;
            out.push('\n');
        }
    }
    let f = scratch(name).join(format!("{name}.toml"));
    std::fs::write(&f, out).unwrap();
    f
}

#[test]
fn committed_rows_reproduce_byte_for_byte() {
    let committed =
        std::fs::read_to_string(root().join("experiments/results/public-throughput/points.csv"))
            .unwrap();
    let f = slice("throughput-slice", "[90, 12]");
    for threads in ["1", "2"] {
        let out_dir = scratch(&format!("throughput-out-{threads}"));
        let o = skewsim_threads(
            &[
                "run",
                f.to_str().unwrap(),
                "--out",
                out_dir.to_str().unwrap(),
            ],
            Some(threads),
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let got = std::fs::read_to_string(out_dir.join("points.csv")).unwrap();
        let mut lines = got.lines();
        assert_eq!(lines.next(), committed.lines().next(), "header");
        for l in lines {
            let id = l.split(',').next().unwrap();
            let want = committed
                .lines()
                .find(|c| c.split(',').next() == Some(id))
                .unwrap_or_else(|| panic!("row {id} not committed"));
            assert_eq!(l, want, "row {id} at {threads} threads");
        }
    }
}

#[test]
fn bad_rows_and_files_are_refused_by_name() {
    let f = slice("throughput-bad-row", "[999999]");
    fails(&["run", f.to_str().unwrap()], "rows");
    let f = slice("throughput-empty", "[]");
    fails(&["run", f.to_str().unwrap()], "rows");
    let text = std::fs::read_to_string(slice("throughput-t", "[90]")).unwrap();
    let bad = scratch("throughput-target").join("t.toml");
    std::fs::write(&bad, text.replace("default = 0.15", "default = 1.5")).unwrap();
    fails(&["run", bad.to_str().unwrap()], "[targets] default");
    // A row whose GPU has no topology in the file.
    let nogpu = scratch("throughput-gpu").join("t.toml");
    std::fs::write(
        &nogpu,
        text.lines()
            .filter(|l| !l.starts_with("h100 = "))
            .collect::<Vec<_>>()
            .join("\n"),
    )
    .unwrap();
    fails(&["run", nogpu.to_str().unwrap()], "gpu");
}
