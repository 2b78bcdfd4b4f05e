"""scripts/cartpole_failures.py: how a saved CartPole policy's episodes end."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tyro

from helpers import load_script

import dqn  # experiments/dqn.py
import ppo

cf = load_script(Path(__file__).parents[1] / "scripts" / "cartpole_failures.py",
                 "jaxasync_scripts_cartpole_failures")


def test_ending_names_the_limit_crossed():
  # gymnasium's CartPole-v1 terminates at |x| > 2.4 or |theta| > 12 degrees (0.2094 rad).
  assert cf.ending(np.array([-0.64, 0.0, 0.226, 0.0]), terminated=True) == "angle"
  assert cf.ending(np.array([2.41, 0.0, -0.007, 0.0]), terminated=True) == "position"
  assert cf.ending(np.array([-2.41, 0.0, -0.21, 0.0]), terminated=True) == "angle"
  assert cf.ending(np.array([0.46, 0.0, 0.022, 0.0]), terminated=False) == "time limit"


@pytest.mark.parametrize("script, flags", [
    (dqn, ["--max-opts", "200", "--agent.warmup-period", "200", "--eval-interval", "100",
           "--agent.hidden-sizes", "16"]),
    (ppo, ["--max-env-steps", "2560", "--eval-interval", "5"]),  # an actor-critic's mode
])
def test_a_saved_run_is_played_and_each_episode_classified(script, flags, tmp_path):
  logdir = tmp_path / "run"
  script.main(tyro.cli(script.Args, args=["--mode", "sync", "--no-progress", "--logdir",
                                          str(logdir), *flags]))
  rows = cf.episode_endings(logdir, "final", episodes=3, seed=7)
  assert len(rows) == 3 and rows == cf.episode_endings(logdir, "final", episodes=3, seed=7)
  for row in rows:
    assert 1 <= row["length"] <= 500 and row["max_abs_x"] >= abs(row["x"])
    if row["ending"] == "time limit":
      assert row["length"] == 500
    else:  # the limit it names was crossed at the last step
      assert abs(row["theta"]) > cf.THETA_LIMIT or abs(row["x"]) > cf.X_LIMIT
