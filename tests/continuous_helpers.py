"""What the SAC and TD3 tests share: small spaces, random transitions of a continuous action
Box, the action spaces both refuse, and a Pendulum run of an experiment script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import jaxasync as ja

REPO = Path(__file__).resolve().parents[1]
OBS3 = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
ASYM = gym.spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([3.0, 10.0], np.float32))
PENDULUM = ja.EnvFactory("Pendulum-v1")

# (action space, words its refusal names besides the agent and the env): a Discrete space,
# an unbounded Box and a two-axis Box, each with its fix.
UNSUITABLE_ACTION_SPACES = [
    (gym.spaces.Discrete(3), ["Discrete", "DQN"]),
    (gym.spaces.Box(-np.inf, np.inf, (2,), np.float32), ["unbounded", "TransformAction"]),
    (gym.spaces.Box(-1, 1, (2, 2), np.float32), ["(2, 2)", "one-axis"]),
]


def continuous_batch(rng: np.random.Generator, shape: tuple[int, ...],
                     action_space: gym.spaces.Box = ASYM, obs_dim: int = 3) -> ja.Transition:
  """Random transitions with leading axes ``shape`` (``(B,)`` or ``(k, B)``): actions uniform
  in ``action_space`` ``[..., A]``, observations ``[..., obs_dim]``, discounts 0 or 0.99."""
  low, high = action_space.low, action_space.high
  return ja.Transition(
      obs=rng.normal(size=shape + (obs_dim,)).astype(np.float32),
      action=rng.uniform(low, high, size=shape + low.shape).astype(np.float32),
      reward=rng.normal(size=shape).astype(np.float32),
      discount=rng.choice([0.0, 0.99], size=shape).astype(np.float32),
      next_obs=rng.normal(size=shape + (obs_dim,)).astype(np.float32))


def assert_refused_with_the_fix(agent_cls: type, config, space: gym.Space,
                                words: list[str]) -> None:
  """``agent_cls(config, OBS3, space, "MyEnv-v0")`` raises a ConfigError naming the env, the
  agent and each of ``words``."""
  with pytest.raises(ja.ConfigError) as e:
    agent_cls(config, OBS3, space, "MyEnv-v0")
  message = str(e.value)
  assert all(w in message for w in ["MyEnv-v0", agent_cls.name, *words]), message


def pendulum_run_in_sync(script: str, logdir: Path) -> dict:
  """``script``'s defaults in sync, cut to 6k env steps (10-episode evaluations): the run's
  summary, once checked to have run them all and saved its final checkpoint."""
  out = subprocess.run([sys.executable, script, "--mode", "sync", "--no-progress",
                        "--max-env-steps", "6000", "--eval-episodes", "10", "--logdir",
                        str(logdir)], cwd=REPO, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
  summary = json.loads((logdir / "summary.json").read_text())
  assert summary["env_steps"] == 6000 and summary["mode"] == "sync"
  assert (logdir / "final" / "state.msgpack").exists()
  return summary
