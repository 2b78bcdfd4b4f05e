"""scripts/bench_minatar.py: each MinAtar preset's steady pace against the env alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import load_script

from jaxasync import experiment
from jaxasync.train import pqn as pqn_job
from jaxasync.train import ppo as ppo_job

bm = load_script(Path(__file__).parents[1] / "scripts" / "bench_minatar.py",
                 "jaxasync_scripts_bench_minatar")


def test_steady_rate_is_the_slope_after_the_warmup():
  # (step, wall_time, value): 100 env steps/s to t=15, then 300/s. A warmup of 5 s from the
  # first record (t=10) leaves t=15, 17 and 19: (1700 - 500) / (19 - 15) = 300.
  rows = [(1, 10.0, 0.0), (2, 12.0, 200.0), (3, 15.0, 500.0), (4, 17.0, 1100.0),
          (5, 19.0, 1700.0)]
  assert bm.steady_rate(rows, warmup=5.0) == 300.0
  assert bm.steady_rate(rows, warmup=0.0) == pytest.approx(1700.0 / 9.0)
  assert bm.steady_rate(rows, warmup=8.5) is None  # one record left: no slope
  assert bm.steady_rate([], warmup=0.0) is None


def test_window_fraction_recovers_the_windows_seconds():
  # A stage at 50 % of the run's first 10 s (5 s), then busy all of the next 10 s: at t=20 its
  # share of the run is 15 / 20. Over the window t=10..20 it was busy 100 %.
  rows = [(1, 100.0, 0.5), (2, 110.0, 0.75)]  # wall_time 100 = the run's 10th second
  elapsed = lambda t: t - 90.0  # noqa: E731
  assert bm.window_fraction(rows, warmup=0.0, elapsed=elapsed) == pytest.approx(1.0)
  assert bm.window_fraction(rows, warmup=5.0, elapsed=elapsed) is None


def test_sgd_steps_per_opt_reads_the_presets_epochs_and_minibatches():
  settings = {algo: experiment.flat_settings(job.parse(["--preset", "minatar"]))
              for algo, job in (("ppo", ppo_job), ("pqn", pqn_job))}
  assert bm.sgd_steps_per_opt("ppo", settings["ppo"]) == 4 * 8  # gymnax-blines' PPO
  assert bm.sgd_steps_per_opt("pqn", settings["pqn"]) == 2 * 32  # purejaxql's PQN
  assert bm.sgd_steps_per_opt("dqn", {"agent.learning_rate": 1e-4}) == 1
  with pytest.raises(KeyError):  # renamed fields fail loudly, not as a 64x lower rate
    bm.sgd_steps_per_opt("pqn", {"agent.epochs": 2})


def test_env_ceiling_steps_the_game_alone():
  pytest.importorskip("minatar")
  assert bm.env_ceiling("MinAtar/Breakout-v1", num_envs=4, duration=0.3, seed=0) > 100


@pytest.mark.slow
def test_a_preset_run_gives_its_pace_and_where_its_time_goes(tmp_path):
  pytest.importorskip("minatar")
  # 40 s: room for the actor process's start-up (jax's import) on a loaded 2-core machine.
  args = bm.Args(algos=("impala",), duration=40.0, warmup=0.5, record_seconds=0.3,
                 env_duration=0.5, logdir=str(tmp_path))
  [row] = bm.main(args)["presets"]
  assert not row["failed"], row["error"]
  assert row["algo"] == "impala" and row["num_envs"] == 32 and row["num_actors"] == 1
  assert row["env_steps_per_sec"] > 0 and row["sgd_steps_per_opt"] == 1
  assert row["sgd_steps_per_sec"] == pytest.approx(row["opt_steps_per_sec"])
  assert 0 < row["of_ceiling"] < 1.5
  fractions = row["stage_fractions"]
  # The learner thread's stages over the window; the rest ("other") is its loop and records.
  # (Recovered through the run's clock, aligned to a second or so: a little slack.)
  assert set(fractions) == set(bm.STAGES) and 0 < fractions["update"] <= 1.02
  assert sum(fractions.values()) <= 1.05
  assert row["policy_lag_mean"] >= 0 and row["bottleneck"]


bmu = load_script(Path(__file__).parents[1] / "scripts" / "bench_minatar_update.py",
                  "jaxasync_scripts_bench_minatar_update")


@pytest.mark.parametrize("flags, sgd_per_call, samples_per_call", [
    # DQN: updates_per_call (the preset's 4) SGD steps of 8 transitions.
    (["--algo", "dqn", "--agent.batch-size", "8"], 4, 4 * 8),
    # PQN: one iteration of 2 epochs x 2 minibatches over 4 envs x 4 steps.
    (["--algo", "pqn", "--num-envs", "4", "--agent.unroll-length", "4",
      "--agent.num-minibatches", "2"], 2 * 2, 2 * 4 * 4),
])
def test_update_alone_counts_the_presets_sgd_steps(flags, sgd_per_call, samples_per_call):
  pytest.importorskip("minatar")
  result = bmu.main([*flags, "--calls", "2", "--repeats", "1"])
  assert result["sgd_steps_per_call"] == sgd_per_call
  # Per sample: the call's seconds over the samples it trains on (PQN: once per epoch).
  seconds_per_call = sgd_per_call / result["sgd_steps_per_sec"]
  assert result["us_per_sample"] == pytest.approx(seconds_per_call / samples_per_call * 1e6)
