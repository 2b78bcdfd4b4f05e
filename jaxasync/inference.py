"""SEED-style central inference: actors send observations, servers batch them on one device.

With many actors, or a network too large for per-actor CPU inference, or an
accelerator, it pays to run the policy once for many actors' observations
instead of once per actor. ``InferenceServer`` threads in the learner's process
take requests from one queue, wait up to ``delay`` seconds for up to
``batch_size`` requests, run ``Agent.policy`` on ``device`` (honoured: params
are committed there) and answer each actor on its own queue. Actors keep their
exploration local (``Agent.select`` on the returned outputs), so the server runs
only the network.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import threading
import time
import traceback
from typing import Any, NamedTuple

import jax
import numpy as np


class _Request(NamedTuple):
  client_id: int
  request_id: int  # echoed back, so a restarted actor never takes a stale answer
  obs: np.ndarray


class InferenceClient:
  """An actor's end: ``policy(obs)`` -> ``(Agent.policy outputs, params version)``. Picklable."""

  def __init__(self, client_id: int, requests, responses):
    self.client_id, self._requests, self._responses = client_id, requests, responses
    self._next_id = None

  def policy(self, obs: np.ndarray, stop, poll: float = 0.1):
    """Blocks for the server's answer; returns ``None`` if ``stop`` is set meanwhile."""
    if self._next_id is None:  # drawn where the client runs: fresh after an actor restart
      self._next_id = int.from_bytes(os.urandom(6), "little") << 16
    request_id, self._next_id = self._next_id, self._next_id + 1
    self._requests.put(_Request(self.client_id, request_id, np.asarray(obs)))
    while not stop.is_set():
      try:
        answer_id, outputs, version = self._responses.get(timeout=poll)
      except queue.Empty:
        continue
      if answer_id == request_id:  # else: meant for this actor before it restarted
        return outputs, version
    return None

  def release(self) -> None:
    for q in (self._requests, self._responses):
      if hasattr(q, "cancel_join_thread"):
        q.cancel_join_thread()


class InferenceServer:
  """``num_servers`` threads batching ``num_clients`` actors' requests.

  Args:
    agent: an ``Agent``; the servers run its ``policy(params, obs, rng)``.
    param_store: where the learner publishes ``ModelInfo`` (the server follows its version).
    num_clients: actors that will ask.
    batch_size: requests per batch at most (SEED's ``inference_batchsize``).
    delay: seconds to wait for more requests after the first (SEED's ``inference_delay``).
    num_servers: server threads (SEED's ``inference_servers``).
    device: where the policy runs: ``"default"`` (the accelerator when there is one) or
      ``"cpu"``, or a ``jax.Device``.
    process: clients live in spawned processes (multiprocessing queues).
    seed: seeds the servers' generators (for any noise ``Agent.policy`` draws).
  """

  def __init__(self, agent, param_store, num_clients: int, batch_size: int = 4,
               delay: float = 0.002, num_servers: int = 1, device: Any = "default",
               process: bool = False, seed: int = 0):
    if batch_size < 1 or num_servers < 1 or delay < 0:
      raise ValueError("inference batch_size and num_servers must be >= 1 and delay >= 0.")
    self.agent, self.param_store = agent, param_store
    self.batch_size, self.delay, self.num_servers = batch_size, delay, num_servers
    if device == "default":
      device = jax.devices()[0]
    elif device == "cpu":
      device = jax.devices("cpu")[0]
    self.device = device
    ctx = mp.get_context("spawn")
    make = ctx.Queue if process else queue.Queue
    self._requests = make()
    self._responses = [make() for _ in range(num_clients)]
    self._stop = threading.Event()
    self._threads: list[threading.Thread] = []
    self._seed = seed
    self.error: str | None = None
    self.batches = 0
    self.requests_served = 0
    self._count_lock = threading.Lock()

  def client(self, client_id: int) -> InferenceClient:
    return InferenceClient(client_id, self._requests, self._responses[client_id])

  def start(self) -> None:
    for i in range(self.num_servers):
      t = threading.Thread(target=self._serve, args=(i,), name=f"jaxasync-inference-{i}",
                           daemon=True)
      t.start()
      self._threads.append(t)

  def _gather(self) -> list[_Request]:
    try:
      first = self._requests.get(timeout=0.05)
    except queue.Empty:
      return []
    batch = [first]
    deadline = time.perf_counter() + self.delay
    while len(batch) < self.batch_size:
      remaining = deadline - time.perf_counter()
      try:
        batch.append(self._requests.get(timeout=remaining) if remaining > 0
                     else self._requests.get_nowait())
      except queue.Empty:
        break
    return batch

  def _serve(self, index: int) -> None:
    rng = np.random.default_rng(self._seed + index)
    version, params = -1, None
    try:
      while not self._stop.is_set():
        batch = self._gather()
        if not batch:
          continue
        if self.param_store.version > version:  # follow the learner's publications
          info = self.param_store.get()
          version, params = info.version, jax.device_put(info.params, self.device)
        bounds = np.cumsum([len(r.obs) for r in batch])
        outputs = self.agent.policy(params, np.concatenate([r.obs for r in batch]), rng)
        for i, r in enumerate(batch):
          start = bounds[i - 1] if i else 0
          part = jax.tree.map(lambda x: x[start:bounds[i]], outputs)
          self._responses[r.client_id].put((r.request_id, part, version))
        with self._count_lock:
          self.batches += 1
          self.requests_served += len(batch)
    except BaseException:  # surfaced by the trainer through check()
      self.error = traceback.format_exc()

  def check(self) -> None:
    """Raises if a server thread failed."""
    if self.error is not None:
      raise RuntimeError(f"inference server failed:\n{self.error}")

  def stop(self) -> None:
    self._stop.set()
    for t in self._threads:
      t.join(5.0)
    for q in [self._requests, *self._responses]:
      if hasattr(q, "cancel_join_thread"):
        q.cancel_join_thread()
        q.close()
