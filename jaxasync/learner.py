"""The learner core shared by the synchronous ``Trainer`` and the ``AsyncTrainer``.

``Learner`` owns the agent state and samples from the replay it is given; it is
the one place that runs updates and the one place that exports params
(``model_info``). ``IntervalTrigger`` is border's ``opt_steps % interval == 0``
test, made safe for update calls that advance several steps at once.
"""

from __future__ import annotations

import time
from typing import Any

import jax
import numpy as np

from jaxasync.envs import ConfigError
from jaxasync.faults import NonFiniteError, divergence_hint
from jaxasync.replay.prioritized import linear_beta
from jaxasync.types import ModelInfo, Transition

PyTree = Any


def _split(x: np.ndarray, k: int, b: int) -> np.ndarray:
  """``[k * b, ...]`` -> ``[k, b, ...]``."""
  return x.reshape((k, b) + x.shape[1:])


class IntervalTrigger:
  """Fires when a counter crosses a multiple of ``interval`` (never when ``interval <= 0``)."""

  def __init__(self, interval: int):
    self.interval = interval
    self._last = 0

  def __call__(self, count: int) -> bool:
    if self.interval <= 0:
      return False
    fired = count // self.interval > self._last // self.interval
    self._last = count
    return fired


class Learner:
  """Runs ``updates_per_call`` SGD steps per call on batches sampled from ``replay``.

  The next batch is sampled in numpy while the previous jitted update is still
  running (JAX dispatches asynchronously), and numpy batches go straight into
  the jitted call (no per-batch ``jax.device_put``: its host cost per leaf was
  measured larger than what it saves, on the CPU and on an H100 alike). With a
  prioritized replay, the priorities of a call are written back at the next
  call, once they are ready, tagged with the slot generations they were sampled at.

  Args:
    agent: has ``init(key)``, ``update(state, batch, weights)``, ``policy_params(state)``.
    replay: a ``ReplayBuffer`` (or ``PrioritizedReplayBuffer``).
    seed: seeds the network initialisation.
    updates_per_call: ``k`` SGD steps per dispatch.
    batch_size: items per SGD step.
    beta_anneal_steps: with a prioritized replay, anneal its importance-sampling
      exponent linearly from its initial ``beta`` to 1 over this many SGD steps.
  """

  def __init__(self, agent, replay, seed: int, updates_per_call: int, batch_size: int,
               beta_anneal_steps: int = 0):
    if updates_per_call < 1:
      raise ValueError(f"updates_per_call must be >= 1, got {updates_per_call}.")
    capacity = getattr(replay, "capacity", None)
    if capacity is not None and capacity < updates_per_call * batch_size:
      raise ConfigError(
          f"replay capacity {capacity} is below updates_per_call x batch_size = "
          f"{updates_per_call} x {batch_size} = {updates_per_call * batch_size}: no update call "
          "could ever be sampled and the run would never train. Raise --replay-capacity, or "
          "lower --updates-per-call or the batch size.")
    self.agent, self.replay = agent, replay
    self.k, self.batch_size = updates_per_call, batch_size
    self.state = agent.init(jax.random.PRNGKey(seed))
    self.opt_steps = 0
    self.prioritized = hasattr(replay, "update_priorities")
    # Importance-sampling exponent annealed linearly from the replay's beta to 1.
    self._beta0 = getattr(replay, "beta", None)
    self._beta_anneal_steps = beta_anneal_steps
    self._metrics: dict | None = None
    self._pending_priorities = None  # (indices, generations, device priorities)
    self.time_sample = 0.0
    self.time_update = 0.0

  def _sample(self):
    """``(batch, weights, where)`` as numpy arrays with leading axes ``[k, b]``."""
    k, b = self.k, self.batch_size
    weights = where = None
    if self.prioritized:
      beta = None
      if self._beta_anneal_steps > 0:
        beta = linear_beta(self.opt_steps, self._beta_anneal_steps, self._beta0)
      # k independent stratified batches, each with its own weight normalisation.
      batch, idx, weights, gens = self.replay.sample(b, beta=beta, num_batches=k)
      weights, where = _split(weights, k, b), (_split(idx, k, b), _split(gens, k, b))
    else:
      batch = self.replay.sample(k * b)
    if type(batch) is Transition:  # field by field: ~5 us less than jax.tree.map
      batch = Transition(*(_split(x, k, b) for x in batch))
    else:
      batch = jax.tree.map(lambda x: _split(x, k, b), batch)
    return batch, weights, where

  def ready(self) -> bool:
    """Whether the replay holds enough items for one update call (``k * batch_size``)."""
    return len(self.replay) >= self.k * self.batch_size

  def step(self) -> int:
    """One update call; returns the SGD steps it advanced (``updates_per_call``)."""
    t0 = time.perf_counter()
    batch, weights, where = self._sample()
    t1 = time.perf_counter()
    previous = self._metrics
    self.state, self._metrics, priorities = self.agent.update(self.state, batch, weights)
    # One call in flight at most: the batch for call t+1 is sampled while call t
    # runs, but the host never queues unboundedly many calls (and their batches).
    if previous is not None:
      jax.block_until_ready(previous)
    self.time_sample += t1 - t0
    self.time_update += time.perf_counter() - t1
    if self.prioritized:
      self._flush_priorities()
      self._pending_priorities = (where, priorities)
    self.opt_steps += self.k
    return self.k

  def _flush_priorities(self) -> None:
    if self._pending_priorities is not None:
      (idx, gens), priorities = self._pending_priorities
      priorities = np.asarray(priorities).ravel()
      if not np.isfinite(priorities).all():
        self._pending_priorities = None
        raise NonFiniteError(
            f"non-finite TD-error priorities after SGD step {self.opt_steps}: training "
            f"diverged. {divergence_hint(self.agent)}")
      self.replay.update_priorities(idx.ravel(), priorities, gens.ravel())
      self._pending_priorities = None

  def metrics(self) -> dict[str, float]:
    """The last call's metrics as Python floats (waits for that call to finish).

    Raises ``NonFiniteError`` if one is NaN or infinite (the loss of a diverged run), so
    that the trainers stop before checkpointing params that are no good.
    """
    if self._metrics is None:
      return {}
    values = {k: float(v) for k, v in jax.device_get(self._metrics).items()}
    bad = {k: v for k, v in values.items() if not np.isfinite(v)}
    if bad:
      raise NonFiniteError(
          f"non-finite {', '.join(f'{k}={v}' for k, v in bad.items())} at SGD step "
          f"{self.opt_steps}: training diverged. {divergence_hint(self.agent)}")
    return values

  def policy_params(self) -> PyTree:
    return self.agent.policy_params(self.state)

  def model_info(self) -> ModelInfo:
    """Host copies of the policy params with the current version (never donated buffers)."""
    return ModelInfo(version=self.opt_steps,
                     params=jax.tree.map(np.array, jax.device_get(self.policy_params())))
