"""Actors on a Ray cluster: jaxasync's ``Actor`` in Ray actor processes, pulled by the learner.

``AsyncConfig(actor_mode="ray")`` runs each actor as a Ray actor anywhere in a cluster (or in a
local Ray instance). The pieces are the ones thread and process actors use: the same ``Actor``
(agent, vector env, collector) steps the env, and its chunks enter the same data source through
the same ``ActorFeed``. What Ray changes is only how chunks and params travel:

* **Chunks are pulled.** The learner keeps at most ``ray_chunks_in_flight`` ``collect`` calls
  outstanding per actor (each returns one ``Chunk``), and asks for the next only when it takes
  one. When the data source holds actors back (the replay ratio), the learner stops taking, the
  calls run out and the actors idle: back-pressure, with at most that many chunks per actor
  waiting in Ray's object store. A Ray actor runs its calls one after the other, so while the
  learner reads one chunk the actor is already collecting the next.
* **Params go out once per publish**: one ``ray.put`` of the host copy (``RayParamStore``), whose
  reference rides along every ``collect`` call. Ray moves the object to each node once, and
  actors on one node read the same shared-memory copy; an actor adopts it when its version is
  newer than what it has, as thread and process actors do.
* **Faults.** A call that raises (the env failed) or an actor process or node that dies counts
  one restart of that actor (once, however many of its calls were in flight). Ray restarts a
  dead actor process (``max_restarts``), on another node if its node is gone; the next call
  rebuilds the actor's env with a fresh seed (``actor_seed(seed, i, restarts)``) and its
  exploration schedule at the env steps it had delivered. Calls are never retried, so a chunk
  is learnt from once or, if its actor died making it, not at all. Past ``max_restarts`` the
  run ends with ``ActorFailed`` and the actor's last traceback.

Ray is optional (``pip install 'jaxasync[ray]'``); it is imported when a Ray run starts.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import time
import warnings
from typing import Any, Callable

import numpy as np

from jaxasync.actor import Actor, ActorConfig, ActorShared, actor_seed
from jaxasync.actor_manager import ActorFailed, ActorStats
from jaxasync.envs import ConfigError
from jaxasync.param_store import ThreadParamStore
from jaxasync.transport import Chunk
from jaxasync.types import ModelInfo

# Ray actors act on the CPU with one XLA thread each, as process actors do (their small policy
# calls gain nothing from more, and a node's actors would oversubscribe its cores).
ACTOR_ENV_VARS = {"JAX_PLATFORMS": "cpu",
                  "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"}


def import_ray():
  """``ray``, or a ``ConfigError`` naming the extra to install."""
  try:
    import ray
  except ImportError as e:
    raise ConfigError("actor_mode='ray' (--async.actor-mode ray) needs Ray: "
                      "pip install 'jaxasync[ray]' (or pip install ray).") from e
  return ray


def connect(address: str | None, num_actors: int) -> None:
  """Joins the Ray cluster at ``address`` ('auto': the one this node belongs to, or
  'host:port'), or starts a local instance (``None``) with a CPU per actor at least. Does
  nothing when this process is already connected (e.g. the caller ran ``ray.init``)."""
  ray = import_ray()
  if ray.is_initialized():
    return
  with warnings.catch_warnings():
    # JAX warns on any os.fork once it runs threads; Ray starts its processes with
    # subprocess (fork then exec at once), which that warning is not about.
    warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
    if address is None:
      ray.init(address="local", num_cpus=max(os.cpu_count() or 1, num_actors),
               include_dashboard=False)
    else:
      ray.init(address=address)


RETRY_DELAY_S = 0.2  # between calls to an actor that Ray is restarting


class RayParamStore:
  """The latest ``ModelInfo``, put into Ray's object store once per publication (lazily: on
  the first request for it, so a publication no actor asks for costs nothing)."""

  def __init__(self):
    self._info: ModelInfo | None = None
    self._ref, self._ref_version = None, -1

  @property
  def version(self) -> int:
    return -1 if self._info is None else self._info.version

  def publish(self, info: ModelInfo) -> None:
    if self._info is None or info.version >= self._info.version:
      self._info = info

  def get(self) -> ModelInfo | None:
    return self._info

  def ref(self):
    """``(version, object ref of the params)`` of the latest publication."""
    if self._info is not None and self._ref_version != self._info.version:
      self._ref, self._ref_version = import_ray().put(self._info.params), self._info.version
    return self._ref_version, self._ref


class RayActorWorker:
  """The body of one Ray actor: builds and steps a jaxasync ``Actor``, one chunk per call.

  Args:
    actor_id: index of the actor.
    agent_factory, env_factory: as for process actors (picklable; called here).
    config: the actor's ``ActorConfig``.
  """

  def __init__(self, actor_id: int, agent_factory: Callable[[], Any], env_factory: Callable,
               config: ActorConfig):
    self.actor_id, self.config = actor_id, config
    self.agent_factory, self.env_factory = agent_factory, env_factory
    self.store = ThreadParamStore()
    self.actor: Actor | None = None

  def collect(self, version: int, params: Any, env_steps: int) -> Chunk:
    """Adopts ``params`` if newer, steps until one chunk is full and returns it.

    ``env_steps``: the env steps this actor delivered before (over its restarts), where its
    exploration schedule continues; read by the first call, which builds the env.
    """
    try:
      if self.actor is None:
        self._build(env_steps)
      self.store.publish(ModelInfo(version, params))
      chunk = None
      while chunk is None:
        chunk = self.actor.step()
      return chunk
    except BaseException:
      self.close()  # (the manager replaces this actor)
      raise

  def _build(self, env_steps: int) -> None:
    i, config = self.actor_id, self.config
    seed = actor_seed(config.seed, i, config.restart)
    agent = self.agent_factory()
    env = self.env_factory(config.num_envs, seed=seed)
    shared = ActorShared(np.zeros(i + 1, np.int64), np.full(i + 1, -1, np.int64))
    shared.env_steps[i] = env_steps
    self.actor = Actor(i, agent, env, config, self.store, shared, seed)

  def node_id(self) -> str:
    return import_ray().get_runtime_context().get_node_id()

  def close(self) -> None:
    if self.actor is not None:
      actor, self.actor = self.actor, None
      actor.env.close()


class RayActorManager:
  """Runs ``len(configs)`` Ray actors and is the transport they deliver through.

  The ``ActorManager`` interface (``start``, ``check``, ``stop_and_join``, ``shared``,
  ``restarts``, ``alive``) and the ``ChunkQueue`` interface the ``ActorFeed`` reads (``get``,
  ``pump``, ``qsize``, ``dropped``, ``close``): a chunk is the result of a ``collect`` call.

  Args:
    agent_factory, env_factory, configs: as ``ActorManager``'s.
    param_store: the ``RayParamStore`` the learner publishes to.
    max_restarts: restarts allowed per actor (also Ray's ``max_restarts`` for its process).
    address: the Ray cluster (see ``connect``).
    in_flight: ``collect`` calls outstanding per actor at most.
  """

  mode = "ray"

  def __init__(self, agent_factory: Callable[[], Any], env_factory: Callable,
               configs: list[ActorConfig], param_store: RayParamStore, max_restarts: int = 3,
               address: str | None = None, in_flight: int = 2):
    import_ray()  # (fails early, before the learner starts, when Ray is missing)
    self.agent_factory, self.env_factory, self.configs = agent_factory, env_factory, configs
    self.param_store, self.max_restarts = param_store, max_restarts
    self.address, self.in_flight = address, in_flight
    n = len(configs)
    self.shared = ActorShared(np.zeros(n, np.int64), np.full(n, -1, np.int64))
    self.restarts = [0] * n
    self.handles: list[Any] = []
    # Per actor, its calls (object refs) in the order made. Only the oldest is
    # waited on: an actor runs its calls in order, and ray.wait's ready list is in no order.
    self._calls: list[collections.deque] = [collections.deque() for _ in range(n)]
    self._retry_at = [0.0] * n  # an actor Ray is restarting gets no calls before then
    self._error: ActorFailed | None = None
    self._started = time.perf_counter()
    self.dropped = 0  # (nothing is dropped: calls are only made for chunks the learner takes)

  @property
  def num_actors(self) -> int:
    return len(self.configs)

  def start(self) -> None:
    ray = import_ray()
    connect(self.address, self.num_actors)
    # Restarts are the manager's (a new actor per failure, with its restart count and so a
    # fresh seed), not Ray's max_restarts: Ray would rebuild the actor with its first
    # arguments, replaying the first seed.
    self._remote = ray.remote(RayActorWorker).options(
        num_cpus=1, max_restarts=0, max_task_retries=0, scheduling_strategy="SPREAD",
        runtime_env={"env_vars": ACTOR_ENV_VARS})
    self.handles = [self._spawn(i) for i in range(self.num_actors)]
    self._started = time.perf_counter()

  # --- transport ----------------------------------------------------------------------------
  def _call(self, i: int) -> None:
    version, params = self.param_store.ref()
    ref = self.handles[i].collect.remote(version, params, int(self.shared.env_steps[i]))
    self._calls[i].append(ref)

  def _top_up(self) -> None:
    if self.param_store.version < 0 or self._error is not None:
      return  # (actors wait for the first publication)
    now = time.monotonic()
    for i in range(self.num_actors):
      if self._retry_at[i] > now:
        continue
      while len(self._calls[i]) < self.in_flight:
        self._call(i)

  def get(self, timeout: float | None = None) -> Chunk | None:
    """The next chunk that is ready (the oldest call first), or ``None`` after ``timeout``."""
    ray = import_ray()
    self._top_up()
    oldest = {calls[0]: i for i, calls in enumerate(self._calls) if calls}
    if not oldest:
      time.sleep(timeout or 0)
      return None
    ready, _ = ray.wait(list(oldest), num_returns=1, timeout=timeout)
    if not ready:
      return None
    i = oldest[ready[0]]
    ref = self._calls[i].popleft()
    try:
      chunk = ray.get(ref)
    except ray.exceptions.ActorUnavailableError:
      # Unreachable for now (e.g. its node stopped answering, not yet declared dead): call
      # again in a moment; calls made now would fail the same way at once.
      self._retry_at[i] = time.monotonic() + RETRY_DELAY_S
      return None
    except ray.exceptions.RayError as e:  # raised in collect, or the actor or its node died
      self._replace(i, e)
      return None
    self.shared.env_steps[i] += chunk.env_steps
    self.shared.adopted_version[i] = max(int(self.shared.adopted_version[i]), chunk.version)
    self._top_up()
    return chunk

  def _spawn(self, i: int):
    config = dataclasses.replace(self.configs[i], restart=self.restarts[i])  # a fresh seed
    return self._remote.remote(i, self.agent_factory, self.env_factory, config)

  def _replace(self, i: int, error: Exception) -> None:
    """Actor ``i`` failed: its other calls are abandoned (never retried, so no chunk comes
    twice) and a new Ray actor takes its place, wherever Ray finds room; past
    ``max_restarts`` the run fails (at the next ``check``)."""
    self._calls[i].clear()
    import_ray().kill(self.handles[i], no_restart=True)
    if self.restarts[i] >= self.max_restarts:
      self._error = ActorFailed(
          f"Ray actor {i} failed {self.restarts[i] + 1} times (max_restarts="
          f"{self.max_restarts}); last error:\n{error}")
      return
    self.restarts[i] += 1
    self.handles[i] = self._spawn(i)

  def pump(self, timeout: float | None = 0.0) -> None:
    """Actors are ahead: make no new calls (their chunks wait in the object store)."""
    time.sleep(timeout or 0)

  def qsize(self) -> int:
    """``collect`` calls outstanding (running, queued at an actor, or done and not taken)."""
    return sum(len(calls) for calls in self._calls)

  def close(self) -> None:
    for calls in self._calls:
      calls.clear()

  # --- supervision --------------------------------------------------------------------------
  def check(self) -> None:
    """Raises ``ActorFailed`` once an actor failed more than ``max_restarts`` times."""
    if self._error is not None:
      error, self._error = self._error, None
      self.stop_and_join()
      raise error

  def alive(self) -> list[bool]:
    return [r <= self.max_restarts for r in self.restarts] if self.handles else [False] * len(
        self.configs)

  def node_ids(self) -> list[str]:
    """The Ray node each actor runs on now (waits for actors that are restarting)."""
    ray = import_ray()
    return ray.get([h.node_id.remote() for h in self.handles])

  def stop_and_join(self, timeout: float = 10.0) -> list[ActorStats]:
    """Kills the Ray actors (calls in flight are abandoned: the run is over); never waits."""
    end = time.perf_counter()
    if self.handles:
      ray = import_ray()
      for handle in self.handles:
        ray.kill(handle, no_restart=True)
      self.handles = []
    self.close()
    dur = end - self._started
    return [ActorStats(i, int(self.shared.env_steps[i]), dur,
                       int(self.shared.env_steps[i]) / dur if dur > 0 else 0.0, self.restarts[i],
                       int(self.shared.adopted_version[i])) for i in range(self.num_actors)]
