"""Picklable env factories and agents that fail on purpose (for supervision tests).

Kept in a module of its own so that spawned actor processes can import it.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import gymnasium as gym

import jaxasync as ja


class _FaultAfter(gym.Wrapper):
  """Steps the env ``steps`` times, then calls ``fault()`` on every later step."""

  def __init__(self, env, steps: int):
    super().__init__(env)
    self._left = steps

  def fault(self) -> None:
    raise NotImplementedError

  def step(self, action):
    self._left -= 1
    if self._left < 0:
      self.fault()
    return self.env.step(action)


class _RaiseAfter(_FaultAfter):
  def fault(self) -> None:
    raise RuntimeError("env exploded on purpose")


class _HangAfter(_FaultAfter):
  def fault(self) -> None:
    import time
    while True:  # an env stuck in step() (a dead simulator, a lost socket)
      time.sleep(1.0)


class _FaultyEnvFactory:
  """CartPole vector envs whose first sub-env is wrapped in ``wrapper`` (a ``_FaultAfter``): a
  ``jaxasync.VectorEnvFactory`` once a dataclass subclass gives it ``env_id`` and ``steps``."""

  wrapper: type = _FaultAfter  # class attribute, not a dataclass field
  frame_skip: int = 1  # (VectorEnvFactory's; a class attribute too)

  def __call__(self, num_envs: int, seed: int | None = None):
    fns = [lambda i=i: self.wrapper(gym.make(self.env_id), self.steps) if i == 0
           else gym.make(self.env_id) for i in range(num_envs)]
    env = gym.vector.SyncVectorEnv(fns)
    env.reset(seed=seed)
    return env


@dataclasses.dataclass(frozen=True)
class RaisingEnvFactory(_FaultyEnvFactory):
  """CartPole vector envs whose first sub-env raises after ``steps`` steps."""

  steps: int = 200
  env_id: str = "CartPole-v1"
  wrapper = _RaiseAfter


SEEDS_SEEN: list = []  # seeds RaisingEnvFactory was called with (thread actors share it)


@dataclasses.dataclass(frozen=True)
class SeedRecordingRaisingEnvFactory(RaisingEnvFactory):
  """``RaisingEnvFactory`` that appends each seed it builds an env with to ``SEEDS_SEEN``."""

  def __call__(self, num_envs: int, seed: int | None = None):
    SEEDS_SEEN.append(seed)
    return super().__call__(num_envs, seed)


class LearnerFault(RuntimeError):
  pass


class _CountingDQN(ja.DQN):
  """A DQN whose ``update`` calls are counted (``calls``) and go through ``on_update``."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.calls = 0
    inner = self.update

    def update(*a, **k):
      self.calls += 1
      return self.on_update(inner, *a, **k)

    self.update = update

  def on_update(self, inner, *a, **k):
    return inner(*a, **k)


class RaisingDQN(_CountingDQN):
  """A DQN whose update raises on its ``fail_at``-th call."""

  fail_at = 5

  def on_update(self, inner, *a, **k):
    if self.calls >= self.fail_at:
      raise LearnerFault("learner exploded on purpose")
    return inner(*a, **k)


class NaNDQN(_CountingDQN):
  """A DQN whose state turns NaN after its ``nan_at``-th update call (a diverging learner)."""

  nan_at = 40

  def on_update(self, inner, *a, **k):
    import jax
    import jax.numpy as jnp
    state, metrics, priorities = inner(*a, **k)
    if self.calls >= self.nan_at:
      state = jax.tree.map(
          lambda x: x * jnp.nan if jnp.issubdtype(x.dtype, jnp.inexact) else x, state)
    return state, metrics, priorities


@dataclasses.dataclass(frozen=True)
class HangingEnvFactory(_FaultyEnvFactory):
  """CartPole vector envs whose first sub-env never returns from its ``steps + 1``-th step."""

  steps: int = 100
  env_id: str = "CartPole-v1"
  wrapper = _HangAfter


class BallastEnvFactory:
  """``inner`` (an env factory) carrying ``nbytes`` of ballast, so that its pickle is larger
  than a pipe holds (an Atari observation space pickles to 111 KiB)."""

  def __init__(self, inner, nbytes: int = 256 * 1024):
    self.inner, self.ballast = inner, bytes(nbytes)
    self.frame_skip = getattr(inner, "frame_skip", 1)
    self.env_id = inner.env_id

  def __call__(self, num_envs: int, seed: int | None = None):
    return self.inner(num_envs, seed)


class BarrierAgentFactory:
  """Builds the agent with ``factory``; unpickled in an actor process it first waits until
  ``n`` actors are unpickling theirs (a file each in ``directory``), and fails after
  ``timeout`` s: only actors spawned side by side all get there. It must come before the
  ballast in the spawn's arguments (the agent factory precedes the env factory), so that a
  child waiting here leaves the ballast unread and its spawn unfinished."""

  def __init__(self, factory, directory: str, n: int, timeout: float = 90.0):
    self.factory, self.directory, self.n, self.timeout = factory, directory, n, timeout

  def __setstate__(self, state):
    self.__dict__.update(state)
    folder = Path(self.directory)
    (folder / str(os.getpid())).touch()
    deadline = time.monotonic() + self.timeout
    while len(list(folder.iterdir())) < self.n:
      if time.monotonic() > deadline:
        raise RuntimeError(f"{len(list(folder.iterdir()))} of {self.n} actors started in "
                           f"{self.timeout:.0f} s: they were spawned one at a time")
      time.sleep(0.05)

  def __call__(self):
    return self.factory()


def _refuse_to_load():
  raise RuntimeError("this factory cannot be loaded on purpose")


class UnloadableEnvFactory:
  """Pickles, but raises when unpickled (in the process that was to build the env)."""

  def __reduce__(self):
    return _refuse_to_load, ()
