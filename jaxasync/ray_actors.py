"""Actors on a Ray cluster: jaxasync's actors in Ray actor processes, pulled by the learner.

``ActorsConfig(mode="ray")`` runs each actor as a Ray actor anywhere in a cluster (or in a
local Ray instance). The pieces are the ones process actors use: each Ray actor runs a process
actor (the same ``Actor``: agent, vector env, collector, in a child process of its own, so
that it does not share a GIL with Ray's worker), and its chunks enter the same data source
through the same ``ActorFeed``. What Ray changes is only how chunks and params travel:

* **Chunks are pulled.** Each Ray actor collects into a bounded queue of ``chunks_ahead``
  chunks (``ActorsConfig.ray_chunks_ahead``; its child's pipe holds up to as many more, and at
  most 1 MiB) and blocks when it is full. A receiver thread in the learner's process keeps
  one ``collect`` call outstanding per actor; a call returns every chunk collected so far
  (waiting for one, then up to ``ray_gather_s`` for more: each call costs the Ray actor's
  process CPU time its env steps then lack), the thread puts them into the bounded
  ``ChunkQueue`` the learner reads (as thread actors do) and calls again at once, so the actor
  keeps stepping while chunks travel and a call's cost is shared by its chunks. When the data
  source holds actors back (the replay ratio), the learner stops taking chunks, the
  ``ChunkQueue`` fills, the receiver blocks, the actors' queues fill and they block:
  back-pressure, with at most about ``3 * chunks_ahead`` chunks per actor in transit.
* **Params go out once per publish**, when newer than what an actor was sent, with its next
  ``collect`` call. On a cluster, params over ``INLINE_PARAMS_BYTES`` (100 KB): one
  ``ray.put`` of the host copy (``RayParamStore``), whose reference rides along; Ray moves the
  object to each node once, and actors on one node read the same shared-memory copy. Smaller
  params, and any params on the local instance jaxasync starts: the host copy itself, by
  value (see the last point).
* **Faults.** An actor whose env raised, whose process died or whose node was lost is replaced
  by a new Ray actor (wherever Ray finds a CPU) built with its restart count, so a fresh seed
  (``actor_seed(seed, i, restarts)``), and the env steps it had delivered, so its exploration
  schedule continues; it counts one restart. Calls are never retried, so a chunk is learnt
  from once or, if its actor died before the call returned, not at all. Past ``max_restarts``
  the run ends with ``ActorFailed`` and the actor's last traceback.
* **The learner's own Ray node dying** (its raylet exits: killed, or fate-sharing with an
  agent process the OOM killer took) ends the run with ``ActorFailed`` naming it, after the
  learner saved ``final`` and the summary as for any failed actor. The receiver sees it before
  each Ray call (the local raylet's process exited), when an actor dies (the node is dead for
  Ray's control store), or when a Ray call fails and the local raylet exits within
  ``RAYLET_EXIT_GRACE_S``, and makes no Ray call after that. Ray's core worker ends its process
  (``_Exit(1)``: no message, no cleanup) 10-70 ms after it learns that its node died if the
  process owns an object in that node's shared-memory store (a ``ray.put``, a call's argument
  or result over 100 KB), even while Python sleeps. So the local instance jaxasync starts
  keeps objects out of that store (``INLINE_BYTES``): params and chunks travel by value in
  the calls. The price is one copy of the params per actor instead of one per node (measured
  on 2 busy cores: 7 MB of params to 4 actors in 80-170 ms instead of 15-30 ms; 1 MB, 17-80
  ms against 11-30 ms); chunks of 400 KB come twice as fast, of 4 MB a quarter slower. A
  learner that joined a cluster (``--ray-address``) keeps the ``ray.put`` of params over
  100 KB, and with it the silent exit when its own node's raylet dies.

Ray is optional (``pip install 'jaxasync[ray]'``); it is imported when a Ray run starts.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import re
import subprocess
import threading
import time
import traceback
import warnings
from typing import Any, Callable

import jax
import numpy as np

from jaxasync.actor import ActorConfig, ActorShared
from jaxasync.actor_manager import (ACTOR_XLA_FLAGS, ActorStats, StopFlag,
                                    run_actor_process_and_freeze)
from jaxasync.envs import VectorEnvFactory
from jaxasync.errors import ActorFailed
from jaxasync.errors import ConfigError
from jaxasync.param_store import SharedParamStore
from jaxasync.placement import usable_cores
from jaxasync.transport import ChunkQueue
from jaxasync.types import ModelInfo

# Ray actors act on the CPU with one XLA thread each, as process actors do (their small policy
# calls gain nothing from more, and a node's actors would oversubscribe its cores).
ACTOR_ENV_VARS = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": ACTOR_XLA_FLAGS}


def import_ray():
  """``ray``, or a ``ConfigError`` naming the extra to install."""
  try:
    import ray
  except ImportError as e:
    raise ConfigError("mode='ray' needs Ray: "
                      "pip install 'jaxasync[ray]' (or pip install ray).") from e
  return ray


# Objects up to this size travel inside the calls rather than through the node's shared-memory
# store (set on the local instance jaxasync starts: the module's last point); under the gRPC
# message limit (512 MiB), above anything a chunk or a network's params come to.
INLINE_BYTES = 1 << 28
# On a cluster, params up to this size go inside each call too: Ray inlines arguments this
# small (its default max_direct_call_object_size), and a ray.put per publication, which each
# node then pulls, cost more (measured on a simulated cluster: docs/bench_learning_results.md,
# "Ray actors on a simulated cluster"). Larger params are put once per version.
INLINE_PARAMS_BYTES = 100 * 1024


def connect(address: str | None, num_actors: int) -> bool:
  """Joins the Ray cluster at ``address`` ('auto': the one this node belongs to, or
  'host:port'), or starts a local instance (``None``) with a CPU per actor at least, whose
  objects travel by value (``INLINE_BYTES``). Does nothing when this process is already
  connected (e.g. the caller ran ``ray.init``). Returns whether it started that instance."""
  ray = import_ray()
  if ray.is_initialized():
    return False
  with warnings.catch_warnings():
    # JAX warns on any os.fork once it runs threads; Ray starts its processes with
    # subprocess (fork then exec at once), which that warning is not about.
    warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
    if address is None:
      # Ray runs its workers at nice 15; beside the learner on one machine that starves the
      # actors (measured: a fifth of process actors' env steps/s). Actors are the work here.
      os.environ.setdefault("RAY_worker_niceness", "0")
      ray.init(address="local", num_cpus=max(len(usable_cores()), num_actors),
               include_dashboard=False,
               _system_config={"max_direct_call_object_size": INLINE_BYTES,
                               "task_rpc_inlined_bytes_limit": INLINE_BYTES})
      return True
    ray.init(address=address)
    return False


def local_raylet():
  """The raylet process (``subprocess.Popen``) of the local Ray instance this process started,
  or None (it joined a cluster, or Ray's internals moved: only the slower check of
  ``RayActorManager._node_lost`` is left)."""
  try:
    return import_ray()._private.worker._global_node.all_processes["raylet"][0].process
  except (AttributeError, KeyError, IndexError, TypeError):
    return None


def ray_logs() -> str:
  """Where this node's Ray logs are (they say why its raylet exited), or ''."""
  try:
    return import_ray()._private.worker._global_node.get_logs_dir_path()
  except (AttributeError, TypeError):
    return ""


def raylet_exit_reason(logs: str) -> str:
  """The reason a raylet that shut itself down wrote in ``raylet.out`` (e.g. 'dashboard_agent
  failed and raylet fate-shares with it'), or ''."""
  try:
    with open(os.path.join(logs, "raylet.out"), "rb") as f:
      f.seek(max(0, f.seek(0, os.SEEK_END) - (1 << 16)))
      tail = f.read().decode(errors="replace")
  except OSError:
    return ""
  found = re.findall(r'reason_message: "([^"]*)"', tail)
  return found[-1].rstrip(".") if found else ""


class RayNodeLost(Exception):
  """This process's Ray node died: no Ray call may be made from here on (see the module's
  docstring, **The learner's own Ray node dying**)."""


RETRY_DELAY_S = 0.2  # between calls to an unreachable actor
RAYLET_EXIT_GRACE_S = 2.0  # a failed Ray call waits this long for the local raylet's exit
CLOSE_TIMEOUT_S = 5.0  # an actor's child gets this long to exit when the run stops
FIRST_CHUNK_WAIT_S = 1.0  # a collect call with no chunk by then returns none


class RayParamStore:
  """The latest ``ModelInfo``, put into Ray's object store once per publication (lazily: on
  the first request for it, so a publication no actor asks for costs nothing)."""

  host_params = True

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

  def ref(self, by_value: bool = False):
    """``(version, params)`` of the latest publication: an object ref of them on a cluster
    where they are larger than ``INLINE_PARAMS_BYTES``, the params themselves otherwise or
    with ``by_value`` (called by the manager's receiver thread while the learner publishes:
    ``_info`` is read once)."""
    info = self._info
    if info is None:
      return -1, None
    if by_value or _nbytes(info.params) <= INLINE_PARAMS_BYTES:
      return info.version, info.params
    if self._ref_version != info.version:
      self._ref, self._ref_version = import_ray().put(info.params), info.version
    return self._ref_version, self._ref


def _nbytes(params: Any) -> int:
  """The bytes of a params pytree's leaves."""
  return sum(np.asarray(leaf).nbytes for leaf in jax.tree.leaves(params))


class ErrorPipe:
  """A child actor's failure report to its Ray actor (``put``, as ``run_actor`` reports),
  through a pipe. Not a ``multiprocessing.Queue``: its three named semaphores are unlinked by
  finalizers, which a Ray actor ended by ``ray.kill`` never runs (Ray kills its resource
  tracker too), so each Ray actor left them in /dev/shm, and a tracker relaunched at the end
  printed a ``KeyError`` per name."""

  # A report's traceback, its last characters: a send that fits the pipe's buffer (64 KiB on
  # Linux) never blocks the child, read or not (a queue's feeder thread did not either).
  MAX_TRACEBACK_CHARS = 32_000

  def __init__(self, ctx):
    self._reader, self._writer = ctx.Pipe(duplex=False)

  def __getstate__(self) -> dict:
    return {"_reader": None, "_writer": self._writer}  # (the child only writes)

  def put(self, item: tuple[int, str]) -> None:
    actor_id, text = item
    self._writer.send((actor_id, text[-self.MAX_TRACEBACK_CHARS:]))

  def child_started(self) -> None:
    """Closes this side's copy of the writing end: the child's death then reads as the end
    of the pipe, and a report it was killed writing as no report (not a wait; unless a
    process the child forked, an env's worker, still holds a copy until it exits)."""
    self._writer.close()

  def report(self, timeout: float = 0.0) -> tuple[int, str] | None:
    """The child's report ``(actor_id, traceback)`` if one came within ``timeout``; ``None``
    if none did, or only part of one before the child's end closed."""
    try:
      return self._reader.recv() if self._reader.poll(timeout) else None
    except (EOFError, OSError, pickle.UnpicklingError):  # (its end closed, or cut short)
      return None


def _run_child_actor(payload: bytes, actor_id: int, channel, store, stop, errors,
                     shared: ActorShared) -> None:
  """A Ray actor's child process: ``run_actor_process`` on the factories and config that
  ``payload`` carries (cloudpickled by the Ray actor, which received them cloudpickled: they
  may be classes Ray shipped by value, which plain pickle cannot name)."""
  try:
    agent_factory, env_factory, config = import_ray().cloudpickle.loads(payload)
  except BaseException:  # (reported as run_actor reports its own failures)
    errors.put((actor_id, traceback.format_exc()))
    channel.release()
    return
  run_actor_process_and_freeze(actor_id, agent_factory, env_factory, config, channel, store,
                               stop, errors, shared)


class RayActorWorker:
  """The body of one Ray actor: a process actor (``run_actor_process``, the code process
  actors run) in a child process of the Ray actor, its chunks drained by ``collect``.

  Why a child: Ray's worker runs the ``collect`` calls and (de)serializes chunks and params in
  its main thread. An actor thread beside it shared its GIL and, measured on 2 cores, made
  half the env steps a process actor made for the same CPU (README, Performance). In its own
  process the actor steps while the calls run. The child starts with the first params (its
  shared-memory param store is laid out from them) and exits with the Ray actor, killed or
  not (``run_actor_process``: it watches its parent).

  The actor keeps stepping while a call's chunks travel to the learner, and blocks once
  ``max_chunks`` chunks wait here and its pipe is full (up to as many more, at most 1 MiB):
  back-pressure without a call per chunk. What its chunks and params carry goes by plain
  pickle, as for process actors (only the factories may be classes Ray shipped by value).

  Args:
    actor_id: index of the actor.
    agent_factory, env_factory: as for process actors (called in the child).
    config: the actor's ``ActorConfig`` (its ``restart`` seeds it).
    env_steps: env steps it delivered before a restart (its exploration schedule continues).
    max_chunks: chunks collected ahead at most, here (and about as many in the pipe).
    gather_s: seconds a call waits, once it has a chunk, for more (up to ``max_chunks``).
  """

  def __init__(self, actor_id: int, agent_factory: Callable[[], Any], env_factory: VectorEnvFactory,
               config: ActorConfig, env_steps: int, max_chunks: int, gather_s: float = 0.0):
    self.actor_id, self.max_chunks, self.gather_s = actor_id, max_chunks, gather_s
    self._payload = import_ray().cloudpickle.dumps((agent_factory, env_factory, config))
    self._ctx = mp.get_context("spawn")
    # Chunks stay as the child pickled them: the learner's receiver unpickles them, so this
    # process does not unpickle each chunk and Ray pickle it again (its CPU is the actor's).
    self.chunks = ChunkQueue(max_chunks, process=True, ctx=self._ctx, decode=False)
    self.stop, self.errors = StopFlag(self._ctx), ErrorPipe(self._ctx)
    self.shared = ActorShared.in_shared_memory(self._ctx, actor_id + 1)  # (indexed by id)
    self.shared.env_steps[actor_id] = env_steps
    self.shared.adopted_version[actor_id] = -1
    self.store: SharedParamStore | None = None
    self.process = None

  def _start(self, params: Any) -> None:
    """Starts the child, its param store laid out from ``params``."""
    self.store = SharedParamStore(params, self._ctx)
    channel = self.chunks.open_channel(self.actor_id)
    self.process = self._ctx.Process(
        target=_run_child_actor, name=f"jaxasync-ray-actor-{self.actor_id}", daemon=True,
        args=(self._payload, self.actor_id, channel, self.store, self.stop, self.errors,
              self.shared))
    self.process.start()
    try:
      channel.close()  # the child has its copy; its death must read as end-of-file
    finally:
      self.errors.child_started()  # (the same for its reports)

  def _child_exited(self, timeout: float = 0.0) -> bool:
    """Whether the child exited (waiting up to ``timeout``). Its sentinel, not is_alive:
    where Ray ignores SIGCHLD, waitpid cannot see the exit."""
    return bool(mp.connection.wait([self.process.sentinel], timeout))

  def _raise_if_failed(self) -> None:
    """Raises ``RuntimeError`` with the child's traceback if it failed (its env raised), or
    with its exit code if it died without one (killed)."""
    report = self.errors.report()
    if report is None and self._child_exited():
      self.process.join(1.0)
      report = self.errors.report(0.5)  # (a traceback sent just before the exit)
      if report is None:
        code = self.process.exitcode
        raise RuntimeError(f"Ray actor {self.actor_id}'s actor process exited "
                           + ("" if code is None else f"with code {code} ")
                           + "without a traceback")
    if report is not None:
      raise RuntimeError(report[1])

  def collect(self, version: int, params: Any) -> list[bytes]:
    """Adopts ``params`` (``None``: nothing newer than it was sent) and returns the chunks
    collected so far, pickled (``pickle.loads`` gives each ``Chunk``), waiting for one if
    there is none and then up to ``gather_s`` for more (1 to ``max_chunks``, in order); none
    if none came within ``FIRST_CHUNK_WAIT_S`` (a child still starting, a slow env), so that
    a call never holds this actor's next method, ``close`` at a stop, for longer.

    Raises ``RuntimeError`` with the actor's traceback if it failed (its env raised), or
    with its exit code if its process died.
    """
    if params is not None:
      if self.process is None:
        self._start(params)
      self.store.publish(ModelInfo(version, params))
    if self.process is None:
      raise RuntimeError(f"Ray actor {self.actor_id} was called before it was sent params")
    give_up = time.monotonic() + FIRST_CHUNK_WAIT_S
    while True:
      self._raise_if_failed()
      chunk = self.chunks.get(0.05)
      if chunk is not None:
        break
      if time.monotonic() > give_up:
        return []
    chunks, until = [chunk], time.monotonic() + self.gather_s
    while len(chunks) < self.max_chunks:
      chunk = self.chunks.get(max(0.0, until - time.monotonic()))
      if chunk is None:
        break
      chunks.append(chunk)
    return chunks

  def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
    """Stops the child and waits up to ``timeout`` for its exit (draining its pipe, which it
    may be flushing a chunk into), then terminates it: the child ends its run itself (its
    env closed, its pipe released) instead of finding this process killed under it."""
    self.stop.set()
    if self.process is None:
      return
    deadline = time.monotonic() + timeout
    while not self._child_exited(0.05) and time.monotonic() < deadline:
      while self.chunks.get(0) is not None:
        pass
    if not self._child_exited():
      self.process.terminate()
    self.process.join(1.0)

  def node_id(self) -> str:
    return import_ray().get_runtime_context().get_node_id()


class RayActorManager:
  """Runs ``len(configs)`` Ray actors and brings their chunks into ``transport``.

  The ``actor_manager.Actors`` contract (``start``, ``check``, ``stop_and_join``, ``shared``,
  ``restarts``, ``alive``), so the ``ActorFeed`` runs Ray actors as it runs the others. A
  receiver thread keeps one ``collect`` call outstanding per actor, puts the chunks each call
  returns into ``transport`` (a thread ``ChunkQueue``; it blocks while that is full, and the
  actors fill their own queues and block behind it), and calls that actor again. The Ray calls
  (``ray.wait``, ``ray.get``, the next ``.remote``, ``ray.put`` of new params) are made by that
  thread, not by the learner's, whose ``transport.get`` stays a queue read.

  Args:
    agent_factory, env_factory, configs: as ``ActorManager``'s.
    transport: the ``ChunkQueue`` (threads) the learner reads.
    param_store: the ``RayParamStore`` the learner publishes to.
    max_restarts: replacements allowed per actor; one more failure fails the run.
    address: the Ray cluster (see ``connect``).
    chunks_ahead: chunks an actor collects ahead at most (then it blocks).
    gather_s: seconds an actor's call waits, once it has a chunk, for more.
  """

  mode = "ray"

  def __init__(self, agent_factory: Callable[[], Any], env_factory: VectorEnvFactory,
               configs: list[ActorConfig], transport: ChunkQueue, param_store: RayParamStore,
               max_restarts: int = 3, address: str | None = None, chunks_ahead: int = 4,
               gather_s: float = 0.0):
    import_ray()  # (fails early, before the learner starts, when Ray is missing)
    self.agent_factory, self.env_factory, self.configs = agent_factory, env_factory, configs
    self.transport, self.param_store = transport, param_store
    self.max_restarts, self.address, self.chunks_ahead = max_restarts, address, chunks_ahead
    self.gather_s = gather_s
    n = len(configs)
    self.shared = ActorShared(np.zeros(n, np.int64), np.full(n, -1, np.int64))
    self.restarts = [0] * n
    self.handles: list[Any] = []
    self._calls: list[Any] = [None] * n  # each actor's outstanding collect call (object ref)
    self._retry_at = [0.0] * n  # an unreachable actor gets no call before then
    self._sent_version = [-1] * n  # the newest params version each actor was sent
    self._error: BaseException | None = None
    self._raylet = None  # the local instance's raylet process, when this process started it
    self._by_value = False  # params go by value (the local instance connect started)
    self._node_gone = False  # this process's Ray node died: Ray may no longer be called
    self._stop = threading.Event()
    self._receiver: threading.Thread | None = None
    self._started = time.perf_counter()

  @property
  def num_actors(self) -> int:
    return len(self.configs)

  def start(self) -> None:
    ray = import_ray()
    self._by_value = connect(self.address, self.num_actors)
    self._raylet = local_raylet()
    # Restarts are the manager's (a new actor per failure, with its restart count and so a
    # fresh seed), not Ray's max_restarts: Ray would rebuild the actor with its first
    # arguments, replaying the first seed.
    self._remote = ray.remote(RayActorWorker).options(
        num_cpus=1, max_restarts=0, max_task_retries=0, scheduling_strategy="SPREAD",
        runtime_env={"env_vars": ACTOR_ENV_VARS})
    self.handles = [self._spawn(i) for i in range(self.num_actors)]
    self._started = time.perf_counter()
    self._receiver = threading.Thread(target=self._receive, name="jaxasync-ray-receiver",
                                      daemon=True)
    self._receiver.start()

  def _spawn(self, i: int):
    config = dataclasses.replace(self.configs[i], restart=self.restarts[i])  # a fresh seed
    return self._remote.remote(i, self.agent_factory, self.env_factory, config,
                               int(self.shared.env_steps[i]), self.chunks_ahead, self.gather_s)

  # --- the receiver thread ------------------------------------------------------------------
  def _receive(self) -> None:
    try:
      while not self._stop.is_set() and self._error is None:
        self._receive_once(0.05)
    except RayNodeLost as e:
      self._lose_node(e)
    except BaseException as e:  # (a bug here must end the run, not starve it silently)
      # A Ray call that failed while the local raylet goes down (it kills its workers, then
      # exits: a call can fail before the exit shows) failed because of that exit.
      try:
        self._check_node(wait_s=RAYLET_EXIT_GRACE_S)
      except RayNodeLost as lost:
        self._lose_node(lost, failed_call=e)
        return
      self._error = e

  def _lose_node(self, e: RayNodeLost, failed_call: BaseException | None = None) -> None:
    self._node_gone = True
    where = "the local Ray instance" if self._raylet is not None else "this machine's Ray node"
    call = ""
    if failed_call is not None:  # (kept: it may be a bug of its own, not the node's loss)
      first = (str(failed_call).splitlines() or [""])[0][:200]
      call = f"; a Ray call failed as it went: {type(failed_call).__name__}: {first}"
    self._error = ActorFailed(
        f"{where} failed ({e}): its Ray actors are gone and this process "
        "can no longer use Ray. The run stops here, saving its final checkpoint and summary "
        "(continue it with --resume, which starts a new Ray instance)"
        + (f"; Ray's logs: {logs}" if (logs := ray_logs()) else "") + call + ".")
    self._error.__cause__ = failed_call

  def _check_node(self, wait_s: float = 0.0) -> None:
    """Raises ``RayNodeLost`` if the raylet of the local instance exited (a ``waitpid``: cheap
    enough for every call), or exits within ``wait_s``."""
    code = None if self._raylet is None else self._raylet.poll()
    if code is None and wait_s > 0 and self._raylet is not None:
      try:
        code = self._raylet.wait(wait_s)
      except subprocess.TimeoutExpired:
        return
    if code is not None:
      how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
      reason = raylet_exit_reason(ray_logs())
      raise RayNodeLost(f"its raylet exited, {how}" + (f": {reason}" if reason else ""))

  def _node_lost(self) -> None:
    """Raises ``RayNodeLost`` if this process's Ray node is dead for Ray's control store (asked
    whenever an actor's call fails, before it is replaced: a raylet shutting down drops its
    node there before it kills its actors, and may still be running). A control store that
    cannot be asked says nothing: the actor is replaced as before."""
    self._check_node()
    ray = import_ray()
    try:
      me = ray.get_runtime_context().get_node_id()
      nodes = ray.nodes()
    except Exception:  # (the GCS unreachable: whether this node died is unknown)
      return
    if any(n["NodeID"] == me and not n["Alive"] for n in nodes):
      reason = raylet_exit_reason(ray_logs()) if self._raylet is not None else ""
      raise RayNodeLost("its node died" + (f": {reason}" if reason else ""))

  def _receive_once(self, timeout: float) -> None:
    self._check_node()
    ray = import_ray()
    self._call_idle_actors()
    calls = {ref: i for i, ref in enumerate(self._calls) if ref is not None}
    if not calls:
      self._stop.wait(timeout)  # (before the first publication; or all actors unreachable)
      return
    ready, _ = ray.wait(list(calls), num_returns=1, timeout=timeout)
    if not ready:
      return
    i = calls[ready[0]]
    self._calls[i] = None
    try:
      chunks = [pickle.loads(frame) for frame in ray.get(ready[0])]
    except ray.exceptions.ActorUnavailableError:
      # Unreachable for now (e.g. its node stopped answering, not yet declared dead): call
      # again in a moment; a call made now would fail the same way at once. The params that
      # call carried may not have arrived: the next one carries them again.
      self._retry_at[i] = time.monotonic() + RETRY_DELAY_S
      self._sent_version[i] = -1
      return
    except ray.exceptions.RayError as e:  # raised in collect, or the actor or its node died
      self._node_lost()  # (a node going down kills its actors first: none is replaced then)
      self._replace(i, e)
      return
    for chunk in chunks:
      if not self.transport.put(chunk, self._stop):
        return  # stopping
      self.shared.env_steps[i] += chunk.env_steps
      self.shared.adopted_version[i] = max(int(self.shared.adopted_version[i]), chunk.version)
    self._call(i)

  def _call_idle_actors(self) -> None:
    if self.param_store.version < 0:
      return  # (actors wait for the first publication)
    now = time.monotonic()
    for i in range(self.num_actors):
      if self._calls[i] is None and self._retry_at[i] <= now:
        self._call(i)

  def _call(self, i: int) -> None:
    self._check_node()  # (see the module's last point)
    version, params = self.param_store.ref(self._by_value)
    if version <= self._sent_version[i]:  # it has them (its calls run in the order made)
      params = None
    else:
      self._sent_version[i] = version
    self._calls[i] = self.handles[i].collect.remote(version, params)

  def _replace(self, i: int, error: Exception) -> None:
    """Actor ``i`` failed: a new Ray actor takes its place, wherever Ray finds room (its
    call is not retried: a chunk never comes twice); past ``max_restarts`` the run fails
    (at the learner's next ``check``)."""
    import_ray().kill(self.handles[i], no_restart=True)
    if self.restarts[i] >= self.max_restarts:
      self._error = ActorFailed(
          f"Ray actor {i} failed {self.restarts[i] + 1} times (max_restarts="
          f"{self.max_restarts}); last error:\n{error}")
      return
    self.restarts[i] += 1
    self.handles[i] = self._spawn(i)
    self._sent_version[i] = -1

  # --- supervision --------------------------------------------------------------------------
  def check(self) -> None:
    """Raises ``ActorFailed`` once an actor failed more than ``max_restarts`` times (or what
    stopped the receiver thread)."""
    if self._error is not None:
      error, self._error = self._error, None
      self.stop_and_join()
      raise error

  def alive(self) -> list[bool]:
    running = self._receiver is not None and self._receiver.is_alive()
    return [running and r <= self.max_restarts for r in self.restarts]

  def node_ids(self) -> list[str]:
    """The Ray node each actor runs on now (waits for actors that are starting)."""
    ray = import_ray()
    return ray.get([h.node_id.remote() for h in list(self.handles)])

  def stop_and_join(self, timeout: float = 10.0) -> list[ActorStats]:
    """Stops the receiver thread (waiting at most ``timeout``), then each Ray actor's child
    (``RayActorWorker.close``, bounded), and kills the Ray actors (the chunks of a call in
    flight are abandoned: the run is over)."""
    end = time.perf_counter()
    self._stop.set()
    if self._receiver is not None:
      self._receiver.join(timeout)
    if not self._node_gone:  # (a raylet gone since the receiver's last look: no Ray call now)
      try:
        self._check_node()
      except RayNodeLost as e:
        self._lose_node(e)  # (check reports it)
    if self.handles and not self._node_gone:  # (a dead node's actors are gone already)
      ray = import_ray()
      # Each actor stops its child first, then is killed, closed or not: a hung one does not
      # hold up the end. (A Ray actor runs one method at a time: its close waits for the call
      # in flight, which returns within FIRST_CHUNK_WAIT_S + gather_s.)
      closing = [handle.close.remote() for handle in self.handles]
      ray.wait(closing, num_returns=len(closing),
               timeout=FIRST_CHUNK_WAIT_S + self.gather_s + CLOSE_TIMEOUT_S + 1.5)
      for handle in self.handles:
        ray.kill(handle, no_restart=True)
      self.handles = []
    self._calls = [None] * self.num_actors
    dur = end - self._started
    return [ActorStats(i, int(self.shared.env_steps[i]), dur,
                       int(self.shared.env_steps[i]) / dur if dur > 0 else 0.0, self.restarts[i],
                       int(self.shared.adopted_version[i])) for i in range(self.num_actors)]
