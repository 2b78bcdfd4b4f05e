"""The MuJoCo presets (SAC, TD3, PPO; `pip install "gymnasium[mujoco]"`) run end to end on a
-v5 env, and MuJoCo's warnings reach Python's ``warnings`` instead of a MUJOCO_LOG.TXT in the
user's working directory. Whether they learn is scripts/bench_learning.py's business (its
MuJoCo rows take 10-60 minutes a run)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mujoco")

REPO = Path(__file__).resolve().parents[1]

# Each preset cut to a few hundred SGD steps (the first SGD step of SAC and TD3 waits for
# one update call of items, 1,024, whatever the warmup): flags beyond --preset mujoco.
TINY = {
    "sac": ("--max-env-steps", "2000", "--max-opts", "400", "--agent.warmup-period", "300",
            "--eval-interval", "200"),
    "td3": ("--max-env-steps", "2000", "--max-opts", "400", "--agent.warmup-period", "300",
            "--eval-interval", "200"),
    "ppo": ("--max-env-steps", "4096", "--eval-interval", "1"),  # 2 iterations of 2048 steps
}


@pytest.mark.parametrize("algo", sorted(TINY))
def test_the_mujoco_preset_runs_end_to_end_on_hopper(algo, tmp_path):
  logdir = tmp_path / "run"
  out = subprocess.run(
      [sys.executable, str(REPO / "experiments" / f"{algo}.py"), "--preset", "mujoco",
       "--env-id", "Hopper-v5", "--mode", "sync", "--no-progress", "--eval-episodes", "1",
       "--logdir", str(logdir), *TINY[algo]],
      cwd=tmp_path, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
  summary = json.loads((logdir / "summary.json").read_text())
  assert summary["opt_steps"] == (2 if algo == "ppo" else 400), summary["opt_steps"]
  assert len(summary["evals"]) >= 2 and (logdir / "final" / "state.msgpack").exists()
  # Hopper's random policy falls within ~20 steps for ~20 return; an evaluation is a number.
  assert all(e["eval_reward"] == e["eval_reward"] for e in summary["evals"])
  assert not (tmp_path / "MUJOCO_LOG.TXT").exists()


def test_mujoco_warnings_go_to_python_warnings_once_and_write_no_log_file(tmp_path):
  # mujoco 4.0 warns that the -v5 HalfCheetah XML's 'settotalmass' is deprecated.
  code = ("import jaxasync as ja\n"
          "for _ in range(3):\n"
          "  ja.EnvFactory('HalfCheetah-v5')(2, seed=0).close()\n")
  out = subprocess.run([sys.executable, "-W", "default", "-c", code], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stderr.count("RuntimeWarning: MuJoCo: compiler attribute 'settotalmass'") == 1, (
      out.stderr[-2000:])
  assert not (tmp_path / "MUJOCO_LOG.TXT").exists()
