"""Picklable env factories and agents that fail on purpose (for supervision tests).

Kept in a module of its own so that spawned actor processes can import it.
"""

from __future__ import annotations

import dataclasses

import gymnasium as gym

import jaxasync as ja


class _RaiseAfter(gym.Wrapper):
  def __init__(self, env, steps: int):
    super().__init__(env)
    self._left = steps

  def step(self, action):
    self._left -= 1
    if self._left < 0:
      raise RuntimeError("env exploded on purpose")
    return self.env.step(action)


@dataclasses.dataclass(frozen=True)
class RaisingEnvFactory:
  """CartPole vector envs whose first sub-env raises after ``steps`` steps."""

  steps: int = 200
  env_id: str = "CartPole-v1"

  def __call__(self, num_envs: int, seed: int | None = None):
    fns = [lambda i=i: _RaiseAfter(gym.make(self.env_id), self.steps) if i == 0
           else gym.make(self.env_id) for i in range(num_envs)]
    env = gym.vector.SyncVectorEnv(fns)
    env.reset(seed=seed)
    return env


SEEDS_SEEN: list = []  # seeds RaisingEnvFactory was called with (thread actors share it)


@dataclasses.dataclass(frozen=True)
class SeedRecordingRaisingEnvFactory(RaisingEnvFactory):
  """``RaisingEnvFactory`` that appends each seed it builds an env with to ``SEEDS_SEEN``."""

  def __call__(self, num_envs: int, seed: int | None = None):
    SEEDS_SEEN.append(seed)
    return super().__call__(num_envs, seed)


class LearnerFault(RuntimeError):
  pass


class RaisingDQN(ja.DQN):
  """A DQN whose update raises on its ``fail_at``-th call."""

  fail_at = 5

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.calls = 0
    inner = self.update

    def update(*a, **k):
      self.calls += 1
      if self.calls >= self.fail_at:
        raise LearnerFault("learner exploded on purpose")
      return inner(*a, **k)

    self.update = update


class NaNDQN(ja.DQN):
  """A DQN whose state turns NaN after its ``nan_at``-th update call (a diverging learner)."""

  nan_at = 40

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.calls = 0
    inner = self.update

    def update(*a, **k):
      import jax
      import jax.numpy as jnp
      self.calls += 1
      state, metrics, priorities = inner(*a, **k)
      if self.calls >= self.nan_at:
        state = jax.tree.map(
            lambda x: x * jnp.nan if jnp.issubdtype(x.dtype, jnp.inexact) else x, state)
      return state, metrics, priorities

    self.update = update


class _HangAfter(gym.Wrapper):
  def __init__(self, env, steps: int):
    super().__init__(env)
    self._left = steps

  def step(self, action):
    self._left -= 1
    if self._left < 0:
      import time
      while True:  # an env stuck in step() (a dead simulator, a lost socket)
        time.sleep(1.0)
    return self.env.step(action)


@dataclasses.dataclass(frozen=True)
class HangingEnvFactory:
  """CartPole vector envs whose first sub-env never returns from its ``steps + 1``-th step."""

  steps: int = 100
  env_id: str = "CartPole-v1"

  def __call__(self, num_envs: int, seed: int | None = None):
    fns = [lambda i=i: _HangAfter(gym.make(self.env_id), self.steps) if i == 0
           else gym.make(self.env_id) for i in range(num_envs)]
    env = gym.vector.SyncVectorEnv(fns)
    env.reset(seed=seed)
    return env
