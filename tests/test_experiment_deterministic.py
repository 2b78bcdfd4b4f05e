"""--deterministic: lock-step actors and XLA's deterministic ops; two runs of it are the same
run, and a mode that contradicts it is refused in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import jaxasync as ja
from jaxasync import experiment
from jaxasync.train import dqn

from test_config_rerun import _error, assert_same_run

# No --mode: --deterministic picks lock-step itself.
FLAGS = ["--deterministic", "--no-progress", "--max-opts", "120", "--agent.warmup-period", "100",
         "--eval-interval", "40", "--eval-episodes", "2", "--save-interval", "0",
         "--agent.hidden-sizes", "16", "--agent.batch-size", "32"]


def test_two_deterministic_runs_are_the_same_run(tmp_path):
  for name in "ab":
    summary = dqn.main(experiment.parse_args(dqn.Args, [*FLAGS, "--logdir", str(tmp_path / name)],
                                             None))
    assert summary["mode"] == "sync" and len(summary["evals"]) == 3
  assert_same_run(tmp_path / "a", tmp_path / "b")
  settings = json.loads((tmp_path / "a" / "config.json").read_text())["settings"]
  assert settings["deterministic"] is True and settings["actors.mode"] == "sync"


@pytest.mark.parametrize("mode", ["thread", "process", "ray"])
def test_a_mode_beside_the_learner_is_refused_in_one_line(mode, tmp_path, capsys):
  line = _error(dqn, ["--deterministic", "--mode", mode, "--logdir", str(tmp_path / "run")],
                capsys)
  assert f"--deterministic runs the actor in lock-step with the learner, and --mode {mode}" in line
  assert "pass --mode sync (or no --mode), or drop --deterministic" in line
  assert not (tmp_path / "run").exists()


def test_the_xla_flags_are_set_before_jax_starts_and_accepted_by_it():
  """In a fresh process (jax not started) the flags go into XLA_FLAGS, and this jaxlib
  accepts them (XLA aborts on a flag it does not know)."""
  code = ("import os; from jaxasync import experiment; experiment.use_deterministic_xla(); "
          "import jax.numpy as jnp; print(os.environ['XLA_FLAGS'], float(jnp.ones(3).sum()))")
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
  assert out.returncode == 0, out.stderr
  assert out.stdout.split() == [*experiment.DETERMINISTIC_XLA_FLAGS, "3.0"]


def test_xla_flags_in_this_process():
  import jax
  jax.numpy.ones(1).block_until_ready()  # (jax started: on CPU nothing more is needed)
  environ = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
  experiment.use_deterministic_xla(environ)
  assert environ == {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
  with pytest.raises(ja.ConfigError, match=r"XLA_FLAGS has --xla_gpu_deterministic_ops=false; "
                                           r"drop it from XLA_FLAGS"):
    experiment.use_deterministic_xla({"XLA_FLAGS": "--xla_gpu_deterministic_ops=false"})
