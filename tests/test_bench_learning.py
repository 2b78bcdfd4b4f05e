"""The learning dashboard's figures against hand computations, its commands, and its run /
resume / failure handling on a stand-in experiment (no training)."""

import importlib.util
import json
import math
import textwrap
from pathlib import Path

import numpy as np
import pytest

from helpers import load_script
from jaxasync.plot import common_grid, median_curve

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_learning.py"
bl = load_script(SCRIPT, "jaxasync_scripts_bench_learning")

# env steps 0..6000, returns climbing past 475 at 3000 and sagging at the end.
EVALS = [{"opt_steps": 500 * (i + 1), "env_steps": x, "wall_s": w, "eval_reward": y}
         for i, (x, w, y) in enumerate([(1000, 1.0, 10.0), (2000, 2.0, 200.0), (3000, 3.5, 480.0),
                                        (4000, 5.0, 500.0), (5000, 6.0, 460.0), (6000, 7.0, 440.0)])]


def test_run_metrics_by_hand():
  m = bl.run_metrics(EVALS, target=475.0, hold=450.0)
  assert m["n_evals"] == 6
  assert m["best"] == 500.0 and m["final"] == 440.0
  assert m["last5"] == pytest.approx((200 + 480 + 500 + 460 + 440) / 5)  # 416
  assert (m["target_env_steps"], m["target_wall_s"], m["target_opt_steps"]) == (3000, 3.5, 1500)
  # trapezoids of width 1000: (10+200)/2 + (200+480)/2 + (480+500)/2 + (500+460)/2 + (460+440)/2
  # = 105 + 340 + 490 + 480 + 450 = 1865 (x1000), over the span 5000
  assert m["auc"] == pytest.approx(1865 * 1000 / 5000)
  assert m["solved"] is True
  assert m["held"] is False  # final 440 < 450 (and last-5 416 < 450)
  # held both ways: a lower hold threshold is met by final 440 and last-5 416...
  assert bl.run_metrics(EVALS, 475.0, 400.0)["held"] is True
  # ...and final >= hold alone is not enough when the last-5 mean is below it.
  assert bl.run_metrics(EVALS, 475.0, 430.0)["held"] is False
  # fewer than 5 evaluations: last5 is the mean of those there; one point: AUC is its value.
  two = bl.run_metrics(EVALS[:2], 475.0, 450.0)
  assert two["last5"] == 105.0 and two["auc"] == 105.0 and two["solved"] is False
  assert bl.run_metrics(EVALS[:1], None, None)["auc"] == 10.0


def test_never_reaching_the_target_is_none_and_not_solved():
  m = bl.run_metrics(EVALS, target=600.0, hold=450.0)
  assert m["target_env_steps"] is None and m["target_wall_s"] is None
  assert m["solved"] is False and m["held"] is False
  report_only = bl.run_metrics(EVALS, target=None, hold=None)
  assert report_only["solved"] is None and report_only["held"] is None
  assert report_only["target_env_steps"] is None and report_only["best"] == 500.0
  empty = bl.run_metrics([], target=475.0, hold=450.0)
  assert empty["best"] is None and empty["auc"] is None
  assert empty["solved"] is False and empty["held"] is False


def test_stability_by_hand():
  rewards = [e["eval_reward"] for e in EVALS]  # 10 200 480 500 460 440; target 475, hold 450
  # first >= 475 is 480 (the 3rd); after it 500, 460, 440: two of three >= 450
  assert bl.stability(rewards, 475.0, 450.0) == pytest.approx(2 / 3)
  assert bl.run_metrics(EVALS, 475.0, 450.0)["stability"] == pytest.approx(2 / 3)
  assert bl.stability(rewards, 475.0, 400.0) == 1.0  # all three >= 400
  assert bl.stability(rewards, 490.0, 450.0) == 0.5  # after 500: 460 yes, 440 no
  assert bl.stability([480.0, 450.0, 449.9], 475.0, 450.0) == 0.5  # >= hold counts, at it too
  assert bl.stability([480.0, 100.0, 100.0], 475.0, 450.0) == 0.0  # learnt, then fell for good
  # the first evaluation >= target counts from there even if an earlier one was close
  assert bl.stability([474.0, 100.0, 476.0, 460.0], 475.0, 450.0) == 1.0
  # the first >= target is the last evaluation: nothing after it fell
  assert bl.stability(rewards[:3], 475.0, 450.0) == 1.0
  assert bl.stability([500.0], 475.0, 450.0) == 1.0
  # never reached, no evaluations, or no target / hold: undefined
  assert bl.stability(rewards, 600.0, 450.0) is None
  assert bl.run_metrics(EVALS, 600.0, 450.0)["stability"] is None
  assert bl.stability([], 475.0, 450.0) is None
  assert bl.stability(rewards, None, None) is None and bl.stability(rewards, 475.0, None) is None
  assert bl.run_metrics([], 475.0, 450.0)["stability"] is None


def test_iqm_by_hand_and_as_scipy_trim_mean():
  # 8 values: the middle 4 of -50 0 10 20 30 40 100 1000 -> (10 + 20 + 30 + 40) / 4
  assert bl.iqm([0, 100, 10, 20, 30, 40, 1000, -50]) == 25.0
  assert bl.iqm([1, 2, 3, 4, 100]) == 3.0  # n = 5: int(1.25) = 1 cut each end -> 2 3 4
  assert bl.iqm([5, 1, 3, 2, 4, 100]) == 3.5  # n = 6: int(1.5) = 1 -> 2 3 4 5
  assert bl.iqm([1, 2, 100]) == pytest.approx(103 / 3)  # n < 4: nothing cut
  assert bl.iqm([7.0]) == 7.0 and bl.iqm([]) is None
  stats = pytest.importorskip("scipy.stats")
  rng = np.random.default_rng(1)
  for n in range(1, 14):
    x = rng.normal(300, 100, n)
    assert bl.iqm(x) == pytest.approx(stats.trim_mean(x, 0.25)), n


def test_iqm_bootstrap_interval():
  values = [500.0, 500.0, 480.0, 120.0, 500.0, 495.0, 300.0, 500.0, 470.0, 500.0]
  lo, hi = bl.iqm_bootstrap_ci(values)
  assert lo <= bl.iqm(values) <= hi and lo < hi
  assert min(values) <= lo and hi <= max(values)
  assert bl.iqm_bootstrap_ci(values) == (lo, hi)  # a fixed seed: the same table every time
  lo90, hi90 = bl.iqm_bootstrap_ci(values, confidence=0.9)  # a 90% interval lies inside
  assert lo <= lo90 <= hi90 <= hi
  assert bl.iqm_bootstrap_ci([500.0] * 7) == (500.0, 500.0)  # constant: a point
  assert bl.iqm_bootstrap_ci([42.0]) == (42.0, 42.0)
  assert bl.iqm_bootstrap_ci([]) == (None, None)
  # two seeds: a resample is both of one seed with probability 1/4 each, so the 2.5% and 97.5%
  # quantiles of 2000 resamples are the two values themselves.
  assert bl.iqm_bootstrap_ci([300.0, 500.0]) == (300.0, 500.0)


def test_seed_ranges():
  assert bl.parse_seeds(["0-4", "10", "12-13"]) == [0, 1, 2, 3, 4, 10, 12, 13]
  assert bl.parse_seeds(["3", "1", "2"]) == [3, 1, 2]  # the old form, order kept
  assert bl.parse_seeds(["5-5"]) == [5]
  assert bl.parse_args(["--seeds", "0-19"]).seeds == list(range(20))
  assert bl.parse_args(["--seeds", "0", "1", "2"]).seeds == [0, 1, 2]
  assert bl.parse_args([]).seeds == [0, 1, 2, 3, 4]
  assert bl.format_seeds([0, 1, 2, 3, 4, 10, 12, 13]) == "0-4 10 12-13"
  assert bl.format_seeds(list(range(20))) == "0-19" and bl.format_seeds([3, 1]) == "3 1"
  for words in (["0-19"], ["0-4", "10", "12-13"], ["3", "1", "2"]):
    assert bl.parse_seeds(bl.format_seeds(bl.parse_seeds(words)).split()) == bl.parse_seeds(words)


@pytest.mark.parametrize("words, says", [
    (["5-2"], "'5-2' runs downwards; write it low-high: 2-5"),
    (["a"], "'a' is not a seed or a range of seeds; give integers and inclusive ranges"),
    (["0-"], "'0-' is not a seed"),
    (["0-4", "3"], "seed(s) 3 named more than once"),
])
def test_bad_seeds_give_one_error_line(words, says, capsys):
  with pytest.raises(SystemExit) as e:
    bl.parse_args(["--seeds", *words])
  assert e.value.code == 2
  (line,) = [l for l in capsys.readouterr().err.splitlines() if "error" in l]
  assert "argument --seeds: " in line and says in line


def _run(best_at, steps_to_target, wall_to_target, failed=False, target=475.0):
  """A run_metrics-like dict: best = final = last5 = auc = best_at."""
  solved = steps_to_target is not None
  return {"failed": failed, "target": target, "hold": 450.0, "best": best_at, "final": best_at,
          "last5": best_at, "auc": best_at, "solved": solved, "held": best_at >= 450,
          "target_env_steps": steps_to_target, "target_wall_s": wall_to_target}


def test_aggregate_medians_and_worsts():
  runs = [_run(500.0, 3000, 3.0), _run(490.0, 5000, 9.0), _run(300.0, None, None),
          _run(480.0, 4000, 4.0)]
  a = bl.aggregate(runs)
  assert (a["seeds"], a["failed"], a["solved"], a["held"]) == (4, 0, 3, 3)
  assert a["best"] == {"median": 485.0, "worst": 300.0}
  assert a["auc"] == {"median": 485.0, "worst": 300.0}
  # 3000, 4000, 5000, inf: median (4000 + 5000) / 2; worst: never reached -> None
  assert a["target_env_steps"] == {"median": 4500.0, "worst": None, "reached": 3}
  assert a["target_wall_s"] == {"median": 6.5, "worst": None, "reached": 3}
  # all reached: worst is the max
  a = bl.aggregate(runs[:2])
  assert a["target_env_steps"] == {"median": 4000.0, "worst": 5000, "reached": 2}
  # a failed run counts as not solved / not reached, and is left out of the return medians.
  a = bl.aggregate([_run(500.0, 3000, 3.0), _run(500.0, 2000, 2.0, failed=True)])
  assert (a["seeds"], a["failed"], a["solved"], a["held"]) == (2, 1, 1, 1)
  assert a["best"] == {"median": 500.0, "worst": 500.0}
  assert a["target_env_steps"] == {"median": None, "worst": None, "reached": 1}
  # half or more never reached: median '-' in the table
  a = bl.aggregate([_run(500.0, 3000, 3.0), _run(100.0, None, None)])
  assert a["target_env_steps"]["median"] is None
  assert bl.pair(a["target_env_steps"], bl.fmt_steps) == "- / -"
  assert bl.aggregate([_run(500.0, None, None, target=None)])["solved"] is None


def test_aggregate_stability_and_iqm():
  def run(best_at, steps, stab, failed=False):
    return {**_run(best_at, steps, None if steps is None else 1.0, failed), "stability": stab}
  runs = [run(500.0, 3000, 1.0), run(490.0, 5000, 0.9), run(300.0, None, None),
          run(480.0, 4000, 0.96), run(100.0, 2000, 1.0, failed=True)]
  a = bl.aggregate(runs)
  # over the runs that did not fail and reached the target: 1.0, 0.9, 0.96
  assert a["stability"] == {"median": 0.96, "worst": 0.9}
  assert a["stable"] == 2  # 1.0 and 0.96 >= 0.95; the failed run's 1.0 does not count
  # IQM over the 4 that did not fail, 300 480 490 500: one cut from each end -> (480 + 490) / 2
  for key in ("iqm_final", "iqm_auc"):
    assert a[key]["iqm"] == 485.0
    assert a[key]["low"] <= 485.0 <= a[key]["high"]
    assert (a[key]["low"], a[key]["high"]) == bl.iqm_bootstrap_ci([500.0, 490.0, 300.0, 480.0])
  assert bl.interval(a["iqm_final"], bl.fmt_return).startswith("485.0 [")
  # none reached the target: no stability; report-only row: no count either
  a = bl.aggregate([run(300.0, None, None)])
  assert a["stability"] == {"median": None, "worst": None} and a["stable"] == 0
  assert bl.pair(a["stability"], bl.fmt_stability) == "- / -"
  assert bl.aggregate([{**run(300.0, None, None), "target": None, "hold": None}])["stable"] is None
  # every run failed: no IQM
  a = bl.aggregate([run(500.0, 3000, 1.0, failed=True)])
  assert a["iqm_final"] == {"iqm": None, "low": None, "high": None}
  assert bl.interval(a["iqm_final"], bl.fmt_return) == "-"


def _curve_run(seed, ys, failed=False):
  return {"seed": seed, "failed": failed, "final": ys[-1], "last5": float(np.mean(ys[-5:])),
          "curve": [[1000 * (i + 1), y] for i, y in enumerate(ys)]}


def test_worst_run_is_lowest_final_then_lowest_last5():
  runs = [_curve_run(0, [100.0, 500.0, 500.0]), _curve_run(1, [400.0, 450.0, 300.0]),
          _curve_run(2, [100.0, 200.0, 300.0]), _curve_run(3, [0.0, 0.0, 0.0], failed=True)]
  # seeds 1 and 2 both end at 300; seed 2's last-5 mean (200) is the lower; failed seed 3 is out
  assert bl.worst_run(runs)["seed"] == 2
  assert bl.worst_run(runs[:2])["seed"] == 1
  assert bl.worst_run(runs[3:]) is None and bl.worst_run([]) is None


def test_cell_plot_highlights_the_worst_seed(monkeypatch):
  pytest.importorskip("matplotlib")
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  monkeypatch.setitem(bl.ROWS, "fake", bl.Row("fake.py", target=475.0, hold=450.0, default=False))
  runs = [{**_curve_run(s, [100.0, 480.0, 500.0 - 10 * s]), "row": "fake", "mode": "sync"}
          for s in range(3)] + [{**_curve_run(3, [0.0]), "failed": True, "row": "fake",
                                 "mode": "sync"}]
  fig, ax = plt.subplots()
  bl.draw_cell(ax, "fake", "sync", runs)
  worst = [l for l in ax.get_lines() if l.get_label().startswith("worst")]
  assert [l.get_label() for l in worst] == ["worst: seed 2 (final 480.0)"]
  assert list(worst[0].get_ydata()) == [100.0, 480.0, 480.0]
  labels = [t.get_text() for t in ax.get_legend().get_texts()]
  assert {"seed 0", "median", "worst: seed 2 (final 480.0)", "target 475"} <= set(labels)
  assert ax.get_title() == "fake, sync, seeds 0-3 (1 failed)"
  plt.close(fig)
  # one seed: nothing to compare it with, no highlight
  fig, ax = plt.subplots()
  bl.draw_cell(ax, "fake", "sync", runs[:1])
  assert not [l for l in ax.get_lines() if l.get_label().startswith("worst")]
  plt.close(fig)
  # many seeds: the legend leaves out the per-seed lines, keeps the median and the worst
  many = [{**_curve_run(s, [100.0, 480.0, 500.0 - s]), "row": "fake", "mode": "sync"}
          for s in range(bl.LEGEND_MAX_SEEDS + 1)]
  fig, ax = plt.subplots()
  bl.draw_cell(ax, "fake", "sync", many)
  labels = [t.get_text() for t in ax.get_legend().get_texts()]
  assert not [l for l in labels if l.startswith("seed")]
  assert f"worst: seed {bl.LEGEND_MAX_SEEDS} (final {500.0 - bl.LEGEND_MAX_SEEDS:.1f})" in labels
  plt.close(fig)


def test_median_curve_interpolates_on_a_common_grid():
  curves = [([0, 10], [0.0, 10.0]), ([0, 5, 10], [0.0, 20.0, 20.0]), ([2, 10], [30.0, 30.0])]
  grid = common_grid(curves, points=5)
  np.testing.assert_allclose(grid, [2, 4, 6, 8, 10])  # where all three are defined
  # at 4: 4, 16, 30 -> 16; at 8: 8, 20, 30 -> 20
  np.testing.assert_allclose(median_curve(curves, [4, 8]), [16.0, 20.0])
  assert math.isnan(median_curve(curves, [1])[0])  # curve 3 starts at 2: no clamping


def test_dry_run_prints_each_command_with_the_rows_and_modes_flags(tmp_path, capsys):
  assert bl.main(["--dry-run", "--rows", "dqn-acrobot", "rainbow-minatar-breakout", "--modes",
                  "sync", "process", "--seeds", "3", "--out", str(tmp_path / "out"),
                  "--extra", "--max-opts 100 --eval-interval 50"]) is None
  lines = capsys.readouterr().out.strip().splitlines()
  assert len(lines) == 4
  for line, (script, row_flags, mode) in zip(lines, [
      ("experiments/dqn.py", "--env-id Acrobot-v1", "sync"),
      ("experiments/dqn.py", "--env-id Acrobot-v1", "process"),
      ("experiments/rainbow.py", "--preset minatar --duration 600", "sync"),
      ("experiments/rainbow.py", "--preset minatar --duration 600", "process")]):
    assert script in line and row_flags in line
    assert f" --mode {mode} " in line
    assert " --seed 3 " in line and " --no-progress " in line
    row = "dqn-acrobot" if "dqn" in script else "rainbow-minatar-breakout"
    assert f"--logdir {tmp_path / 'out' / 'runs' / row / mode / 'seed3'}" in line
    assert line.endswith("--max-opts 100 --eval-interval 50")  # --extra last: it overrides
  assert not (tmp_path / "out").exists()  # a dry run writes nothing


# A stand-in experiment: seed 0 and 1 write a summary, six evaluations rising to 500 / 300 by the
# second and staying there (seed 1 never reaches 475), seed 2 exits
# 1, seed 3 hangs (--timeout); each run appends its seed to a file, to count the runs made.
FAKE = textwrap.dedent("""
  import json, os, sys, time
  seed = int(sys.argv[sys.argv.index("--seed") + 1])
  logdir = sys.argv[sys.argv.index("--logdir") + 1]
  with open(os.path.join(os.path.dirname(__file__), "calls.txt"), "a") as f:
    f.write(f"{seed}\\n")
  print("training seed", seed)
  if seed == 2:
    sys.exit("boom")
  if seed == 3:
    time.sleep(60)
  top = 500.0 if seed == 0 else 300.0
  evals = [{"opt_steps": 100 * i, "env_steps": 1000 * i, "wall_s": float(i),
            "eval_reward": top * min(1.0, i / 2)} for i in range(1, 7)]
  os.makedirs(logdir, exist_ok=True)
  with open(os.path.join(logdir, "summary.json"), "w") as f:
    json.dump({"evals": evals, "env_steps": 4000, "opt_steps": 400, "wall_s": 4.5,
               "best_eval_reward": top, "final_eval_reward": top, "interrupted": False}, f)
""")


def test_matrix_runs_records_failures_and_resumes(tmp_path, monkeypatch, capsys):
  fake = tmp_path / "fake_experiment.py"
  fake.write_text(FAKE)
  monkeypatch.setitem(bl.ROWS, "fake", bl.Row(str(fake), ("--env-id", "Fake-v0"), target=475.0,
                                              hold=450.0, default=False))
  out = tmp_path / "out"
  argv = ["--rows", "fake", "--modes", "sync", "--seeds", "0-1", "2", "3", "--out", str(out),
          "--timeout", "2"]
  result = bl.main(argv)
  runs = {r["seed"]: r for r in result["runs"]}
  assert runs[0]["solved"] and runs[0]["held"] and not runs[0]["failed"]
  assert runs[0]["target_env_steps"] == 2000 and runs[0]["auc"] == pytest.approx(475.0)
  assert runs[0]["total_env_steps"] == 4000 and runs[0]["total_wall_s"] == 4.5
  assert not runs[1]["solved"] and runs[1]["target_env_steps"] is None
  assert runs[2]["failed"] and runs[2]["why"] == "exit 1" and "boom" in runs[2]["log_tail"]
  assert runs[3]["failed"] and runs[3]["why"] == "timed out"
  (cell,) = result["cells"]
  assert (cell["seeds"], cell["failed"], cell["solved"], cell["held"]) == (4, 2, 1, 1)
  assert cell["best"] == {"median": 400.0, "worst": 300.0}
  # seed 0: 250 then 500 five times -> reached at the 2nd, all four after >= 450; seed 1 never
  assert runs[0]["stability"] == 1.0 and runs[1]["stability"] is None
  assert cell["stability"] == {"median": 1.0, "worst": 1.0} and cell["stable"] == 1
  # IQM of two seeds (nothing cut) is their mean; see test_iqm_bootstrap_interval for the ends
  assert cell["iqm_final"] == {"iqm": 400.0, "low": 300.0, "high": 500.0}
  assert cell["iqm_auc"] == {"iqm": 380.0, "low": 285.0, "high": 475.0}  # (475 + 285) / 2
  md = (out / "results.md").read_text()
  assert "| fake | sync | 4 (2 failed) | 1/4 | 1/4 | 400.0 / 300.0 |" in md
  assert "| fake | sync | 1 | 300.0 | 300.0 | 300.0 | - | - | 285.0 | 4,000 | 4.5 |" in md
  assert "| fake | sync | 1 | 300.0 | 300.0 | 300.0 | - | - | 285.0 | 4,000 | 4.5 | - |" in md
  assert "| 2,000 | 2.0 | 475.0 | 4,000 | 4.5 | 1.00 |" in md  # seed 0's row ends so
  assert ("| 1.00 / 1.00 | 1/4 | 400.0 [300.0, 500.0] | 380.0 [285.0, 475.0] |" in md)
  saved = json.loads((out / "results.json").read_text())
  assert saved["cells"][0]["iqm_final"] == cell["iqm_final"]
  assert [r["stability"] for r in saved["runs"]] == [1.0, None, None, None]
  assert md in capsys.readouterr().out
  assert json.loads((out / "results.json").read_text())["runs"][0]["command"][1] == str(fake)
  assert (out / "runs" / "fake" / "sync" / "seed0" / "log.txt").read_text().count("training") == 1
  if importlib.util.find_spec("matplotlib") is not None:
    assert (out / "fake-sync.png").stat().st_size > 0

  # --resume reruns only the failed ones.
  (tmp_path / "calls.txt").write_text("")
  bl.main(argv[:-2] + ["--timeout", "0.5", "--resume"])
  assert sorted((tmp_path / "calls.txt").read_text().split()) == ["2", "3"]
