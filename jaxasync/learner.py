"""The learner: the agent's state, its update calls on a data source's samples, its exports.

``Learner`` is the one place that runs updates and the one place that exports params
(``model_info``), in the synchronous and the asynchronous loop alike.
"""

from __future__ import annotations

import time
from typing import Any

import jax
import numpy as np

from jaxasync.agent import Agent
from jaxasync.faults import NonFiniteError, all_finite
from jaxasync.param_store import host_copy
from jaxasync.types import ModelInfo

PyTree = Any


class Learner:
  """Runs update calls of ``source.updates_per_call`` SGD steps on ``source.sample()``.

  The next batch is sampled in numpy while the previous jitted update is still running (JAX
  dispatches asynchronously), and numpy batches go straight into the jitted call (no
  per-batch ``jax.device_put``: its host cost per leaf is larger than what it saves;
  ``scripts/bench_throughput.py`` measures both). The feedback of a call (new priorities) is
  handed back to the source at the next call, once it is ready.

  Args:
    agent: the ``Agent``.
    seed: seeds ``agent.init``.
  """

  def __init__(self, agent: Agent, seed: int):
    self.agent = agent
    self.state = agent.init(jax.random.PRNGKey(seed))
    self.opt_steps = 0
    self._metrics: dict | None = None
    self._pending_feedback = None  # (source, info, device feedback) of the call in flight
    self.time_update = 0.0

  def step(self, source) -> int:
    """One update call on ``source``'s next sample; returns the SGD steps it advanced."""
    sample = source.sample(self.opt_steps)
    t0 = time.perf_counter()
    previous = self._metrics
    self.state, self._metrics, feedback = self.agent.update(self.state, sample.batch,
                                                            sample.weights)
    # One call in flight at most: the batch for call t+1 is sampled while call t runs, but
    # the host never queues unboundedly many calls (and their batches).
    if previous is not None:
      jax.block_until_ready(previous)
    self.time_update += time.perf_counter() - t0
    self.flush_feedback()
    if feedback is not None and sample.info is not None:
      self._pending_feedback = (source, sample.info, feedback)
    self.opt_steps += source.updates_per_call
    return source.updates_per_call

  def flush_feedback(self) -> None:
    """Hands the last call's feedback (e.g. priorities) to its source now (before a
    checkpoint of the source); otherwise the next ``step`` does."""
    if self._pending_feedback is None:
      return
    source, info, feedback = self._pending_feedback
    self._pending_feedback = None
    feedback = jax.tree.map(np.asarray, feedback)
    if not all_finite(feedback):
      raise NonFiniteError(
          f"non-finite update feedback (e.g. TD-error priorities) after SGD step "
          f"{self.opt_steps}: training diverged. {self.agent.divergence_hint()}")
    source.feedback(info, feedback)

  def metrics(self) -> dict[str, float]:
    """The last call's metrics as Python floats (waits for that call to finish).

    Raises ``NonFiniteError`` if one is NaN or infinite (the loss of a diverged run), so that
    the loop stops before checkpointing params that are no good.
    """
    if self._metrics is None:
      return {}
    values = {k: float(v) for k, v in jax.device_get(self._metrics).items()}
    bad = {k: v for k, v in values.items() if not np.isfinite(v)}
    if bad:
      raise NonFiniteError(
          f"non-finite {', '.join(f'{k}={v}' for k, v in bad.items())} at SGD step "
          f"{self.opt_steps}: training diverged. {self.agent.divergence_hint()}")
    return values

  def policy_params(self) -> PyTree:
    return self.agent.policy_params(self.state)

  def model_info(self) -> ModelInfo:
    """Host copies of the policy params with the current version (never donated buffers)."""
    return ModelInfo(version=self.opt_steps, params=host_copy(self.policy_params()))
