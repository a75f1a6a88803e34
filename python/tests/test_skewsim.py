"""The Python package over the skewsim library: committed results reproduce byte for byte,
specs as dicts, typed errors, Ctrl-C and the GIL."""

import _thread
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import skewsim

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = ROOT / "experiments"


def committed(name):
    d = EXPERIMENTS / "results" / name
    return {p.name: p.read_text(encoding="utf-8") for p in d.iterdir()}


@pytest.mark.parametrize("name", ["libra-fig8", "megatron-dcp-blog", "runtime-variance"])
def test_committed_results_reproduce_byte_for_byte(name, monkeypatch):
    # The files an experiment names resolve against its folder; its title is its stem.
    monkeypatch.chdir(ROOT)
    r = skewsim.run_files(f"experiments/{name}.toml")
    want = committed(name)
    assert set(want) <= set(r.files), sorted(r.files)
    for f, body in want.items():
        assert r.files[f] == body, f


def test_a_dict_runs_as_its_file_does(monkeypatch):
    tomllib = pytest.importorskip("tomllib")
    monkeypatch.chdir(ROOT)
    text = (EXPERIMENTS / "libra-fig4.toml").read_text(encoding="utf-8")
    spec = tomllib.loads(text)
    from_dict = skewsim.run_files(spec, name="libra-fig4")
    from_file = skewsim.run_files(EXPERIMENTS / "libra-fig4.toml")
    assert from_dict.files == from_file.files
    assert from_dict.points() == from_file.points()


def test_points_are_numbers_and_a_frame_with_pandas(monkeypatch):
    monkeypatch.chdir(ROOT)
    r = skewsim.run_files("experiments/megatron-dcp-blog.toml")
    rows = r.points()
    assert rows and all(isinstance(v, (int, float, str)) for v in rows[0].values())
    header = r.files["points.csv"].splitlines()[0].split(",")
    assert list(rows[0]) == header
    assert len(rows) == len(r.files["points.csv"].splitlines()) - 1
    pandas = pytest.importorskip("pandas")
    df = skewsim.run("experiments/megatron-dcp-blog.toml")
    assert isinstance(df, pandas.DataFrame)
    assert list(df.columns) == header and len(df) == len(rows)


def test_pools_theory_and_corpus():
    rows = skewsim.pools_study("wlbllm", gbs=32, pool_sizes=[2, 4], trials=20, seed=3)
    assert [(r["pool_size"], r["policy"]) for r in rows["rows"]] == [
        (2, "random"), (2, "vrsp"), (4, "random"), (4, "vrsp")]
    again = skewsim.pools_study("wlbllm", gbs=32, pool_sizes=[2, 4], trials=20, seed=3)
    assert rows == again
    # VRSP never balances worse than random grouping on average.
    by = {(r["pool_size"], r["policy"]): r["r_minus_1"]["mean"] for r in rows["rows"]}
    assert by[(4, "vrsp")] <= by[(4, "random")]
    t = skewsim.theory("wlbllm", gbs=32, pool_sizes=[2, 4, 8], trials=50, target=10.0)
    assert [r["pool_size"] for r in t["rows"]] == [2, 4, 8]
    assert t["recommended_by_bound"] == 2
    c = skewsim.corpus("lognormal:median=800,p99=30000", sequences=64, samples=5000)
    assert c["packed"]["sequences"] == 64 and c["documents"]["count"] == 5000


def test_errors_name_the_field_and_the_allowed_values():
    with pytest.raises(skewsim.SkewsimError) as e:
        skewsim.corpus("lognormal:median=-1,p99=5")
    assert (e.value.field, e.value.value) == ("median", "-1")
    assert "≥ 1" in e.value.allowed
    with pytest.raises(skewsim.SkewsimError, match=r"P = 3 does not divide gbs = 32") as e:
        skewsim.pools("wlbllm", gbs=32, pool_sizes=[3])
    assert (e.value.field, e.value.value) == ("pool_sizes", "3")
    with pytest.raises(skewsim.SkewsimError) as e:
        skewsim.theory("wlbllm", gbs=32, target=-1.0)
    assert (e.value.field, e.value.value) == ("--target", "-1")
    with pytest.raises(skewsim.SkewsimError) as e:
        skewsim.run({"kind": "nope"})
    assert (e.value.field, e.value.value) == ("kind", '"nope"')
    assert all(k in e.value.allowed for k in skewsim.KINDS)
    with pytest.raises(skewsim.SkewsimError, match="colour"):
        skewsim.check({"kind": "runtime-variance", "gpus": 8, "steps": 5, "seed": 1,
                       "colour": "red"})
    with pytest.raises(skewsim.SkewsimError, match="gpus = 1") as e:
        skewsim.run({"kind": "runtime-variance", "gpus": 1, "steps": 5, "seed": 1})
    assert (e.value.field, e.value.value, e.value.allowed) == ("gpus", "1", "an integer in [2, 1000000]")



def test_a_comparison_refusal_names_the_arm_and_the_value():
    spec = {"kind": "four-way", "model": "llama3-8b", "arms": ["ulysses", "libra:p=0"],
            "network": {"topology": "dgx-h200-roce"}, "parallel": {"cp": 2, "ga": 1},
            "workload": {"corpus": "wlbllm", "seq_len": 8192}}
    with pytest.raises(skewsim.SkewsimError) as e:
        skewsim.run(spec)
    assert (e.value.field, e.value.value, e.value.allowed) == ('arms "libra:p=0" p', "0", "a count ≥ 1")
    spec["arms"] = ["ulysses", "wlbllm:cp=3"]
    with pytest.raises(skewsim.SkewsimError) as e:
        skewsim.run(spec)
    assert (e.value.field, e.value.value) == ('arms "wlbllm:cp=3" cp', "3")
    assert "divisor" in e.value.allowed

def test_ctrl_c_stops_a_sweep_between_points(monkeypatch):
    monkeypatch.chdir(ROOT)
    # (That the library stops between points is tested in Rust, `experiment::tests`.)
    # Python's own Ctrl-C handler, also where the test runs in the background (SIGINT
    # ignored); one Ctrl-C half a second into a sweep that takes tens of seconds.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.5, _thread.interrupt_main)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            skewsim.run("experiments/four-way.toml")
    finally:
        timer.join()
        signal.signal(signal.SIGINT, previous)
    assert skewsim.run_files("experiments/runtime-variance.toml").kind == "runtime-variance"


def test_the_gil_is_released_while_simulating(monkeypatch):
    monkeypatch.chdir(ROOT)
    done = threading.Event()
    out = {}

    def work():
        out["r"] = skewsim.run_files("experiments/runtime-variance.toml")
        done.set()

    th = threading.Thread(target=work)
    th.start()
    ticks = 0
    while not done.is_set():
        ticks += 1
        time.sleep(0.001)
    th.join()
    assert out["r"].kind == "runtime-variance"
    assert ticks > 10, ticks


def test_the_example_reproduces_the_committed_figure(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "python/examples/fig8.py"), str(tmp_path)],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "libra-256k-gbs128.svg: identical to the committed file" in r.stdout
    assert (tmp_path / "libra-256k-gbs128.svg").read_text(encoding="utf-8") == (
        ROOT / "experiments/results/libra-fig8/libra-256k-gbs128.svg").read_text(encoding="utf-8")


def test_recommend_returns_the_ranked_table():
    r = skewsim.recommend("wlbllm", gpus=8, seq_len=65536, layers=2, seeds=2, simulate=4, top=2)
    rows = r.points()
    assert [row["rank"] for row in rows] == list(range(1, len(rows) + 1))
    assert r.result["rows"][0]["candidate"]["arm"] == rows[0]["arm"]
    assert "**Recommendation.**" in r.summary
    assert set(r.files) == {"summary.md", "recommend.csv", "plot.svg", "winner.toml"}
    again = skewsim.recommend("wlbllm", gpus=8, seq_len=65536, layers=2, seeds=2, simulate=4,
                              top=2)
    assert again.files == r.files
    with pytest.raises(skewsim.SkewsimError) as e:
        skewsim.recommend("wlbllm", gpus=8, seq_len=65536, seeds=99)
    assert e.value.field == "seeds"
SMALL = dict(corpus="lognormal:median=600,p99=30000", seq_len=32768, gbs=8, dp=4, cp=2,
             pool_size=2, head_shards=2, tile_tokens=1024, step=1)


def skewsim_binary():
    """The CLI built beside this package (``cargo test`` builds it), else the one on PATH."""
    import shutil
    built = ROOT / "target" / "debug" / "skewsim"
    path = built if built.exists() else shutil.which("skewsim")
    if path is None:
        pytest.skip("no skewsim binary to compare with")
    return str(path)


@pytest.mark.parametrize("scheme,extra", [
    ("libra", {}), ("ulysses", {}), ("wlbllm", {"outlier_thresholds": [2048, 32768]}),
    ("distca", {"ping_pong": False, "epsilon": 0.05}), ("megatron-dcp", {})])
def test_plan_writes_the_file_the_command_writes(scheme, extra, tmp_path):
    p = skewsim.plan(scheme=scheme, **SMALL, **extra)
    assert p.scheme["scheme"] == scheme and p.step == 1
    assert p.check["sequences"] > 0 and len(p.groups) == p.check["groups"]
    assert p.plan["scheme"] == scheme and len(p.plan["groups"]) == len(p.groups)
    assert sum(g["flops"] for g in p.groups) == pytest.approx(p.check["flops"], rel=1e-12)
    p.write(tmp_path / "py.json")
    flags = [a for k, v in SMALL.items() for a in (f"--{k.replace('_', '-')}", str(v))]
    if "outlier_thresholds" in extra:
        flags += ["--outlier-thresholds", "2048,32768"]
    if extra.get("ping_pong") is False:
        flags += ["--no-ping-pong", "--epsilon", "0.05"]
    out = tmp_path / "cli.json"
    subprocess.run([skewsim_binary(), "plan", "--scheme", scheme, "-o", str(out), *flags],
                   check=True, capture_output=True)
    assert (tmp_path / "py.json").read_bytes() == out.read_bytes()


def test_plan_settings_from_a_file_and_its_errors(tmp_path):
    f = tmp_path / "settings.toml"
    f.write_text('corpus = "wlbllm"\ngbs = 16\ndp = 4\ncp = 2\npool_size = 2\n', encoding="utf-8")
    p = skewsim.plan(f, head_shards=2, pipeline=True)
    assert (p.settings["corpus"], p.settings["gbs"], p.settings["dp"]) == ("wlbllm", 16, 4)
    assert p.settings["params"]["head_shards"] == 2  # the argument beats the default
    assert p.pipeline is not None and len(p.pipeline) == len(p.groups)
    assert skewsim.plan(f, head_shards=2, pipeline=True).plan == p.plan
    with pytest.raises(skewsim.SkewsimError) as e:
        skewsim.plan(scheme="megatron", **SMALL)
    assert (e.value.field, e.value.value) == ("scheme", "megatron")
    assert "wlbllm" in e.value.allowed
    with pytest.raises(skewsim.SkewsimError) as e:
        skewsim.plan(**{**SMALL, "pool_size": 3})
    assert e.value.field == "P (pool size)" and e.value.value == "3"
    f.write_text('gbs = "many"\n', encoding="utf-8")
    with pytest.raises(skewsim.SkewsimError, match="settings.toml"):
        skewsim.plan(f)
