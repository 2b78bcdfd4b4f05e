"""Shared test fixtures: a Box(4) space, random replay-like batches, the experiment scripts."""

import importlib.util
import sys
from pathlib import Path

import gymnasium as gym
import jax
import numpy as np

from jaxasync import Transition

BOX4 = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)


def random_batch(rng, shape, num_actions=2):
  """A batch with leading axes ``shape`` (e.g. ``(B,)`` or ``(k, B)``), replay dtypes."""
  return Transition(
      obs=rng.normal(size=shape + (4,)).astype(np.float32),
      action=rng.integers(0, num_actions, size=shape).astype(np.int64),
      reward=rng.normal(size=shape).astype(np.float32),
      discount=rng.choice([0.0, 0.99], size=shape).astype(np.float32),
      next_obs=rng.normal(size=shape + (4,)).astype(np.float32),
  )


def host(tree):
  """A host copy (the jitted update donates its input state)."""
  return jax.tree.map(np.array, jax.device_get(tree))


def rainbow_module():
  """experiments/rainbow.py as a module (experiments/ is not a package), loaded once."""
  name = "jaxasync_experiments_rainbow"
  if name not in sys.modules:
    path = Path(__file__).resolve().parents[1] / "experiments" / "rainbow.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclass annotations are resolved through sys.modules
    spec.loader.exec_module(module)
  return sys.modules[name]
