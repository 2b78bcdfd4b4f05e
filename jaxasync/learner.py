"""The learner: the agent's state, its update calls on a data source's samples, its exports.

``Learner`` is the one place that runs updates and the one place that exports params
(``model_info``), in the synchronous and the asynchronous loop alike.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import jax
import numpy as np

from jaxasync.agent import Agent
from jaxasync.errors import NonFiniteError
from jaxasync.faults import all_finite
from jaxasync.param_store import device_copy, host_copy
from jaxasync.sharding import DataParallel
from jaxasync.types import ModelInfo

PyTree = Any


class Learner:
  """Runs update calls of ``source.updates_per_call`` SGD steps on ``source.sample()``.

  The next batch is sampled in numpy while the previous jitted update is still running (JAX
  dispatches asynchronously), and numpy batches go straight into the jitted call (no
  per-batch ``jax.device_put``: its host cost per leaf is larger than what it saves;
  ``scripts/bench_throughput.py`` measures both). The feedback of a call (new priorities) is
  handed back to the source at the next call, once it is ready.

  On several devices (``devices``, see ``jaxasync.sharding``) the state is replicated on them
  and each batch split over them on its batch axis; the agent's update is the same, and gives
  the same result as on one device (to float rounding).

  Args:
    agent: the ``Agent``.
    seed: seeds ``agent.init``.
    devices: the learner's devices (``jaxasync.sharding.learner_devices``); ``None`` (or the
      default device alone): JAX's default device, numpy batches straight into the jitted call.
  """

  def __init__(self, agent: Agent, seed: int, devices: Sequence[jax.Device] | None = None):
    self.agent = agent
    devices = list(devices) if devices is not None else [jax.devices()[0]]
    self.devices = devices
    # One default device: numpy straight into jit (cheapest); otherwise place explicitly.
    self.parallel = (DataParallel(devices, agent.data.batch_axis)
                     if devices != [jax.devices()[0]] else None)
    self.state = self.place_state(agent.init(jax.random.PRNGKey(seed)))
    self.opt_steps = 0
    self._metrics: dict | None = None
    self._pending_feedback = None  # (source, info, device feedback) of the call in flight
    self.time_update = 0.0

  def step(self, source) -> int:
    """One update call on ``source``'s next sample; returns the SGD steps it advanced."""
    sample = source.sample(self.opt_steps)
    t0 = time.perf_counter()
    previous = self._metrics
    if self.parallel is None:
      self.state, self._metrics, feedback = self.agent.update(self.state, sample.batch,
                                                              sample.weights)
    else:
      batch, weights = self.parallel.place_batch(sample.batch, sample.weights)
      with jax.set_mesh(self.parallel.mesh):  # (for constrain_to_batch_shards)
        self.state, self._metrics, feedback = self.agent.update(self.state, batch, weights)
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

  def finish_update(self) -> None:
    """Waits for the update call in flight, counting the wait as update time: a host copy of
    the params would wait for it anyway, and the stage fractions (and the bottleneck verdict)
    would show the update's arithmetic as the copy's."""
    t0 = time.perf_counter()
    jax.block_until_ready((self.state, self._metrics))
    self.time_update += time.perf_counter() - t0

  def place_state(self, state: PyTree) -> PyTree:
    """``state`` (e.g. restored from a checkpoint) on the learner's devices: replicated over
    several, committed to a single one."""
    if self.parallel is not None:
      return self.parallel.place_state(state)
    return jax.device_put(state)

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

  def evaluation_params(self) -> PyTree:
    return self.agent.evaluation_params(self.state)

  def model_info(self, host: bool = True) -> ModelInfo:
    """Copies of the policy params (never the buffers the next update donates) with the
    current version: host (numpy) copies, or with ``host=False`` copies on the learner's
    devices (``device_copy``: one dispatch, no wait for the update in flight)."""
    if host:
      self.finish_update()
    params = self.policy_params()
    return ModelInfo(version=self.opt_steps,
                     params=host_copy(params) if host else device_copy(params))
