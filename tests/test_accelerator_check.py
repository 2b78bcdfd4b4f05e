"""scripts/accelerator_check.py's CPU parts, short: the command a GPU session runs first."""

import json
import subprocess
import sys
from pathlib import Path

import jax
import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_accelerator_check_runs_its_cpu_parts_and_says_there_is_no_accelerator(tmp_path):
  out = tmp_path / "accel"
  done = subprocess.run([sys.executable, "scripts/accelerator_check.py", "--quick", "--out",
                         str(out)], cwd=REPO, capture_output=True, text=True, timeout=900)
  assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
  report = json.loads(out.with_suffix(".json").read_text())
  on_cpu = all(d.platform == "cpu" for d in jax.devices())
  assert report["accelerator"] is (not on_cpu)
  measured = [r for r in report["updates"] if "skipped" not in r]
  assert {r["agent"] for r in measured} >= {"dqn-cartpole", "ppo-cartpole",
                                            "sac-mujoco (HalfCheetah-v5 shapes)",
                                            "dqn-minatar (Breakout CNN)"}
  assert all(r["cpu_sgd_steps_per_sec"] > 0 for r in measured)
  medians = report["harness"]["medians"]
  assert medians["learner"]["opt_steps_per_sec"] > 0 and medians["sync"]["env_steps_per_sec"] > 0
  text = out.with_suffix(".md").read_text()
  assert "| dqn-cartpole | 128 |" in text
  if on_cpu:
    assert "No accelerator on this machine" in text and "runs" not in report
