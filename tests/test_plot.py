"""jaxasync.plot: event files read back, seeds grouped, the three PNGs written."""

from __future__ import annotations

import json

import numpy as np
import pytest

import jaxasync as ja
from jaxasync import plot


def _fake_run(directory, seed: int, rewards, steps_per_eval=1000):
  directory.mkdir(parents=True)
  recorder = ja.TensorboardRecorder(str(directory))
  evals = []
  for i, r in enumerate(rewards, 1):
    recorder.record(i * 100, {"fps": 1000.0 + seed, "opt_steps_per_sec": 50.0 * i,
                              "samples_per_sec": 900.0})
    evals.append({"opt_steps": i * 100, "env_steps": i * steps_per_eval, "wall_s": 1.5 * i,
                  "eval_reward": r})
  recorder.close()
  (directory / "summary.json").write_text(json.dumps({"evals": evals}))


def test_read_scalars_returns_what_the_recorder_wrote(tmp_path):
  _fake_run(tmp_path / "run", 0, [10, 20, 30])
  scalars = plot.read_scalars(tmp_path / "run")
  assert [(s, v) for s, _, v in scalars["opt_steps_per_sec"]] == [(100, 50.0), (200, 100.0),
                                                                 (300, 150.0)]
  assert [e["eval_reward"] for e in plot.read_evals(tmp_path / "run")] == [10, 20, 30]


def test_seeds_of_a_configuration_are_grouped():
  assert plot.configuration("b/runs/x/sync/seed3") == plot.configuration("b/runs/x/sync/seed10")
  assert plot.configuration("b/runs/x/sync/seed3") != plot.configuration("b/runs/x/process/seed3")


def test_median_curve_on_the_common_span():
  curves = [([0, 10], [0, 100]), ([2, 12], [20, 120]), ([1, 11], [10, 110])]
  grid = plot.common_grid(curves, points=3)
  np.testing.assert_allclose(grid, [2, 6, 10])
  np.testing.assert_allclose(plot.median_curve(curves, grid), [20, 60, 100])


def test_cli_writes_the_three_pngs(tmp_path):
  pytest.importorskip("matplotlib")
  for seed in range(3):
    _fake_run(tmp_path / "cfg" / f"seed{seed}", seed, [10 * seed, 50, 90 + seed])
  _fake_run(tmp_path / "other", 0, [5, 6, 7], steps_per_eval=500)
  written = plot.main([str(tmp_path / "cfg" / f"seed{s}") for s in range(3)]
                      + [str(tmp_path / "other"), "--out", str(tmp_path / "png"),
                         "--target", "80"])
  names = sorted(p.name for p in written)
  assert names == ["eval_vs_env_steps.png", "eval_vs_wall_s.png", "throughput.png"]
  for p in written:
    assert p.stat().st_size > 10_000 and p.read_bytes()[:4] == b"\x89PNG"


def test_a_missing_run_directory_is_named(tmp_path):
  pytest.importorskip("matplotlib")
  with pytest.raises(FileNotFoundError, match="nope"):
    plot.plot_runs([tmp_path / "nope"])
