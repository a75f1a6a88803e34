"""skewsim from Python: run experiments, study corpora, pool sizes and Libra's bound.

``plan`` returns one training step's checked plan of any scheme. Every function calls
the skewsim library (the same code as the ``skewsim`` command), so a
committed experiment run from here gives the committed numbers. Simulation runs with the
GIL released; Ctrl-C stops a run between sweep points and raises ``KeyboardInterrupt``.
Refused input raises :class:`SkewsimError`, whose ``field``, ``value`` and ``allowed``
name the offending input where the error does.

>>> import skewsim
>>> rows = skewsim.run("experiments/runtime-variance.toml")   # doctest: +SKIP
"""

import json
import os
from pathlib import Path

from . import _skewsim
from ._skewsim import KINDS, SkewsimError

__all__ = [
    "KINDS", "PlanResult", "Run", "SkewsimError", "check", "corpus", "plan", "pools", "run",
    "run_files", "theory",
]


class Run:
    """One experiment run: its kind, files (name → contents), points and summary."""

    def __init__(self, kind, files, points_file, summary, result):
        self.kind = kind
        self.files = dict(files)
        self.points_file = points_file
        self.summary = summary
        self.result = None if result is None else json.loads(result)

    def points(self):
        """The points table as a list of dicts (numbers as int or float)."""
        return _records(self.files.get(self.points_file, ""))

    def write(self, out):
        """Write the run's files into the folder ``out`` (as ``skewsim run --out``)."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        for name, body in self.files.items():
            (out / name).write_text(body, encoding="utf-8")


def _number(cell):
    for kind in (int, float):
        try:
            return kind(cell)
        except ValueError:
            pass
    return cell


def _records(csv_text):
    import csv
    import io

    return [
        {k: _number(v) for k, v in row.items()}
        for row in csv.DictReader(io.StringIO(csv_text))
    ]


def _frame(rows):
    """``rows`` as a pandas DataFrame when pandas is installed, else as they are."""
    try:
        import pandas
    except ImportError:
        return rows
    return pandas.DataFrame(rows)


def _spec(spec, name):
    """(TOML text, path) of an experiment given as a path or a dict."""
    if isinstance(spec, dict):
        text = _skewsim.json_to_toml(json.dumps(spec))
        return text, os.path.join(os.getcwd(), name + ".toml")
    path = os.fspath(spec)
    with open(path, encoding="utf-8") as f:
        return f.read(), path


def run_files(spec, *, calibration=None, name="experiment"):
    """Run an experiment and return the whole :class:`Run` (files, summary, points).

    ``spec`` is an experiment file's path or a dict of its fields (``name`` titles the
    summary and stands for the file's name; relative paths resolve against the current
    folder). ``calibration`` is a calibration file (JSON) for kinds that price work.
    """
    text, path = _spec(spec, name)
    cal = None if calibration is None else os.fspath(calibration)
    return Run(*_skewsim.run_text(text, path, cal))


def run(spec, *, calibration=None, name="experiment"):
    """Run an experiment (a path or a dict, see :func:`run_files`) and return its points:
    a pandas DataFrame when pandas is installed, else a list of dicts."""
    return _frame(run_files(spec, calibration=calibration, name=name).points())


def check(spec, *, name="experiment"):
    """Check an experiment against its kind's schema without running it."""
    text, path = _spec(spec, name)
    _skewsim.check(text, path)


def corpus(corpus, *, seq_len=None, sequences=1024, samples=200_000, packing="sequential", seed=0):
    """Statistics of a corpus (built-in name, parametric spec or trace file) and of its
    packed sequences, as a dict (``skewsim corpus``)."""
    return json.loads(_skewsim.corpus(corpus, seq_len, sequences, samples, packing, seed))


def _source(corpus, packed):
    return corpus, None if packed is None else os.fspath(packed)


def pools(corpus=None, *, packed=None, seq_len=None, gbs=128, pool_sizes=(2, 4, 8, 16, 32, 64),
          policies=("random", "vrsp"), trials=200, seed=0, packing="sequential"):
    """Residual imbalance R − 1 per pool size and grouping policy (``skewsim pools``): one
    row per (P, policy), a DataFrame when pandas is installed, else a list of dicts.
    The whole study (load moments, source) is in ``pools_study``."""
    st = pools_study(corpus, packed=packed, seq_len=seq_len, gbs=gbs, pool_sizes=pool_sizes,
                     policies=policies, trials=trials, seed=seed, packing=packing)
    return _frame([_flat(r) for r in st["rows"]])


def pools_study(corpus=None, *, packed=None, seq_len=None, gbs=128,
                pool_sizes=(2, 4, 8, 16, 32, 64), policies=("random", "vrsp"), trials=200,
                seed=0, packing="sequential"):
    """The whole pool study of :func:`pools` as a dict."""
    c, p = _source(corpus, packed)
    return json.loads(_skewsim.pools(c, p, seq_len, gbs, list(pool_sizes), list(policies),
                                     trials, seed, packing))


def theory(corpus=None, *, packed=None, seq_len=None, gbs=128, pool_sizes=(2, 4, 8, 16, 32, 64),
           target=0.1, trials=1000, seed=0, packing="sequential", mask="causal"):
    """Libra Eq. 4's bound beside Monte Carlo per pool size, and the pool sizes recommended
    for ``target`` (``skewsim theory``), as a dict; ``mask`` (causal, sliding:W, chunked:C,
    block-sparse:B:local=K:global=G) picks the layer type whose per-sequence load is bounded."""
    c, p = _source(corpus, packed)
    return json.loads(_skewsim.theory(c, p, seq_len, gbs, list(pool_sizes), target, trials,
                                      seed, packing, mask))


class PlanResult:
    """One step's checked plan (``skewsim plan``): ``plan`` (the plan file's JSON as a
    dict), ``settings`` and ``scheme`` (as resolved), ``step``, ``check`` (the checker's
    summary), ``groups`` (one dict per group: units, FLOPs, imbalance, bytes moved) and
    ``pipeline`` (Libra's head chunks per group and worker, when asked for)."""

    def __init__(self, plan_json, report):
        self.plan_json = plan_json
        self.plan = json.loads(plan_json)
        report = json.loads(report)
        self.settings = report["settings"]
        self.scheme = report["scheme"]
        self.step = report["step"]
        self.check = report["check"]
        self.groups = report["groups"]
        self.pipeline = report["pipeline"]

    def write(self, path):
        """Write the plan file (as ``skewsim plan -o PATH`` does)."""
        Path(path).write_text(self.plan_json + "\n", encoding="utf-8")


def plan(experiment=None, *, step=0, scheme=None, corpus=None, seq_len=None, gbs=None, dp=None,
         cp=None, pool_size=None, head_shards=None, tile_tokens=None, tau=None, chunks=None,
         seed=None, packing=None, grouping=None, s_max=None, sharding=None,
         outlier_thresholds=None, epsilon=None, ping_pong=None, tight=None, pipeline=False):
    """The checked plan of one training step (``skewsim plan``) as a :class:`PlanResult`.

    ``scheme`` is libra (default), ulysses, wlbllm, distca or megatron-dcp; the settings
    are the command's flags in snake_case (``outlier_thresholds`` a list, ``ping_pong`` and
    ``tight`` booleans). ``experiment`` is a settings or experiment file (TOML) that gives
    them instead; an argument given here overrides it. ``pipeline=True`` also builds
    Libra's pipeliner chunks.
    """
    exp = None if experiment is None else os.fspath(experiment)
    thresholds = None if outlier_thresholds is None else list(outlier_thresholds)
    return PlanResult(*_skewsim.plan(
        exp, step, scheme, corpus, seq_len, gbs, dp, cp, pool_size, head_shards, tile_tokens,
        tau, chunks, seed, packing, grouping, s_max, sharding, thresholds, epsilon, ping_pong,
        tight, pipeline))


def _flat(row, prefix=""):
    """A nested dict as one level, keys joined by ``_``."""
    out = {}
    for k, v in row.items():
        if isinstance(v, dict):
            out.update(_flat(v, prefix + k + "_"))
        else:
            out[prefix + k] = v
    return out


def recommend(corpus, *, gpus, seq_len, model="llama3-8b", topology="dgx-h200-roce",
              memory_gib=None, global_batch=None, pipeline=False, tp=None, cp=None, pp=None,
              schemes=(), seeds=3, seed=1, layers=None, simulate=16, top=6, recompute=True,
              zero_stage=3, calibration=None):
    """``skewsim recommend``: which scheme, settings and parallel layout to run. Returns a
    :class:`Run` whose ``points()`` is the ranked table (one row per finalist, best first),
    ``summary`` the text (pruning counts, table, why the winner wins), ``result`` the whole
    recommendation as a dict and ``files`` what the command writes."""
    return Run(*_skewsim.recommend(
        corpus, gpus, seq_len, model, topology, memory_gib, global_batch, pipeline, tp, cp, pp,
        list(schemes), seeds, seed, layers, simulate, top, recompute, zero_stage,
        None if calibration is None else str(calibration)))


__all__ += ["recommend"]
