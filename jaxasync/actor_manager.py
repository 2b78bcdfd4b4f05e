"""Starts, supervises, restarts and stops actors, as threads or spawned processes."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import multiprocessing as mp
import os
import queue
import threading
import time
from typing import Any, Callable, Protocol

import jax
import numpy as np

from jaxasync.actor import ActorConfig, ActorShared, run_actor, run_actor_process
from jaxasync.envs import VectorEnvFactory
from jaxasync.errors import ActorFailed
from jaxasync.faults import logger
from jaxasync.transport import ChunkQueue


def run_actor_process_and_freeze(*args) -> None:
  """``run_actor_process``, then ``gc.freeze()`` so that the process's exit skips Python's last
  garbage collections over its objects. An actor holds some 300k (JAX's traces and caches);
  scanning them made a Rainbow MinAtar actor take 1.1-2.9 s to exit after its last chunk,
  which the learner waits out on every stop. Its env is closed and its pipe released by
  then, and its exit handlers (multiprocessing's flush of a process actor's error queue)
  still run."""
  run_actor_process(*args)
  gc.freeze()


# An actor's small policy calls gain nothing from XLA's thread pool, and several actors' pools
# would oversubscribe the cores the learner uses (process and Ray actors alike).
ACTOR_XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def actor_process_environ() -> dict[str, str]:
  """What an actor process's environment gets on top of the learner's.

  Actors act on the CPU: off the accelerator (and its memory), XLA kept to one thread for
  their small policy calls, so that actor processes do not oversubscribe the cores the
  learner uses (README, Performance, has the figures). And the learner's persistent
  compilation cache (``experiment.use_compile_cache``) with its minimum compile time, so that
  a later or restarted actor loads its policy instead of compiling it. (Ray actors, which
  may run on other machines, compile their own.)
  """
  env = {"JAX_PLATFORMS": "cpu",
         "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {ACTOR_XLA_FLAGS}".strip()}
  if jax.config.jax_compilation_cache_dir:
    env["JAX_COMPILATION_CACHE_DIR"] = jax.config.jax_compilation_cache_dir
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = str(
        jax.config.jax_persistent_cache_min_compile_time_secs)
  return env


class StopFlag:
  """A stop request shared with actor processes, read without a lock.

  ``multiprocessing.Event.is_set`` takes a lock, and actors read the flag every step: one
  killed inside it would leave the lock held, blocking every other actor and the learner's
  ``set``. A shared byte cannot be left held.
  """

  def __init__(self, ctx):
    self._flag = ctx.RawValue("b", 0)

  def is_set(self) -> bool:
    return bool(self._flag.value)

  def set(self) -> None:
    self._flag.value = 1


@dataclasses.dataclass
class ActorStats:
  """Per-actor figures returned by ``ActorManager.stop_and_join``."""

  actor_id: int
  env_steps: int
  duration_s: float
  samples_per_sec: float
  restarts: int
  adopted_version: int
  blocked_fraction: float | None = None
  """of ``duration_s`` spent waiting to hand chunks over (the queue full); None: not measured."""


class Actors(Protocol):
  """What the ``ActorFeed`` runs actors through: ``ActorManager`` (threads, processes) and
  ``ray_actors.RayActorManager`` (Ray actors).

  Attributes:
    mode: 'thread', 'process' or 'ray' (named in the summary).
    num_actors: actors run.
    shared: per-actor counters the actors write (env steps, adopted params version).
    restarts: per-actor restarts so far.
  """

  mode: str
  num_actors: int
  shared: ActorShared
  restarts: list[int]

  def start(self) -> None:
    """Starts every actor."""

  def check(self) -> None:
    """Restarts dead actors; raises ``ActorFailed`` past ``max_restarts``."""

  def alive(self) -> list[bool]:
    """Whether each actor runs."""

  def stop_and_join(self, timeout: float = 10.0) -> list[ActorStats]:
    """Stops and joins every actor (never hangs: stragglers are terminated); their figures."""


class ActorManager:
  """Runs ``len(configs)`` actors (border's ``ActorManager``) and keeps them alive.

  Args:
    agent_factory: picklable callable building the acting agent (called in the actor).
    env_factory: picklable callable ``(num_envs, seed) -> vector env``.
    configs: one ``ActorConfig`` per actor.
    transport: the ``ChunkQueue`` actors push to (``process=True`` for process actors).
    param_store: ``ThreadParamStore`` for threads, ``SharedParamStore`` for processes.
    mode: ``"thread"`` or ``"process"`` (spawn start method); ``ActorsConfig.validate`` checks it.
    max_restarts: restarts allowed per actor; one more failure fails the run.
    serialize_env_init: build envs one actor at a time (border's ``guard_init_env``).
    inference: an ``InferenceServer``: actors ask it for actions instead of acting locally.
  """

  def __init__(self, agent_factory: Callable[[], Any], env_factory: VectorEnvFactory,
               configs: list[ActorConfig], transport: ChunkQueue, param_store, mode: str = "process",
               max_restarts: int = 3, serialize_env_init: bool = False, inference=None):
    self.agent_factory, self.env_factory = agent_factory, env_factory
    self.configs, self.transport, self.param_store = configs, transport, param_store
    self.mode, self.max_restarts = mode, max_restarts
    self.inference = inference
    n = len(configs)
    if mode == "process":
      self._ctx = mp.get_context("spawn")
      self._stop = StopFlag(self._ctx)
      self._errors = self._ctx.Queue()
      self.shared = ActorShared.in_shared_memory(self._ctx, n)
      self._env_lock = self._ctx.Lock() if serialize_env_init else None
    else:
      self._stop = threading.Event()
      self._errors = queue.Queue()
      self.shared = ActorShared(np.zeros(n, np.int64), np.full(n, -1, np.int64), np.zeros(n))
      self._env_lock = threading.Lock() if serialize_env_init else None
    for i in range(n):
      self.shared.adopted_version[i] = -1
    self._workers: list[Any] = [None] * n
    # Process restarts in flight: each spawns from a thread of its own (see check), one at a
    # time (each sets os.environ around its spawn); an error of one is raised by check.
    self._restarting: dict[int, threading.Thread] = {}
    self._restart_errors: list[BaseException] = []
    self._spawn_lock = threading.Lock()
    self.restarts = [0] * n
    self._start_time = [0.0] * n
    self._started = time.perf_counter()

  @property
  def num_actors(self) -> int:
    return len(self.configs)

  def _worker(self, i: int) -> tuple[Any, Any]:
    """Actor ``i``'s thread or process, not started yet, and its channel."""
    config = dataclasses.replace(self.configs[i], restart=self.restarts[i])  # a fresh seed
    channel = self.transport.open_channel(i)  # processes: a fresh pipe, the old one discarded
    args = (i, self.agent_factory, self.env_factory, config, channel,
            self.param_store, self._stop, self._errors, self.shared, self._env_lock,
            None if self.inference is None else self.inference.client(i))
    if self.mode == "thread":
      return threading.Thread(target=run_actor, args=args, name=f"jaxasync-actor-{i}",
                              daemon=True), channel
    return self._ctx.Process(target=run_actor_process_and_freeze, args=args,
                             name=f"jaxasync-actor-{i}", daemon=True), channel

  def _launch(self, i: int, worker, channel) -> None:
    """Starts ``worker`` (from ``_worker``) as actor ``i``."""
    worker.start()
    if self.mode == "process":
      channel.close()  # the child has its copy; its death must read as end-of-file
    self._workers[i] = worker
    if not self._start_time[i]:
      self._start_time[i] = time.perf_counter()

  @contextlib.contextmanager
  def _actor_environ(self):
    """The learner's environment plus ``actor_process_environ()`` while process actors are
    spawned (a spawned child inherits ``os.environ``), restored afterwards."""
    if self.mode != "process":
      yield
      return
    child_env = actor_process_environ()
    saved = {k: os.environ.get(k) for k in child_env}
    os.environ.update(child_env)
    try:
      yield
    finally:
      for k, v in saved.items():
        if v is None:
          os.environ.pop(k, None)
        else:
          os.environ[k] = v

  def start(self) -> None:
    """Starts every actor; process actors side by side.

    A spawn returns only once its child has read all but a pipe's worth (64 KiB) of the
    pickled arguments, and a child reads them after importing the main module (jax and the
    rest). An Atari observation space alone pickles to 111 KiB (its bounds and masks), so
    spawned one after another, 14 Pong actors had not all started after 50 s
    (docs/accelerator.md).
    """
    self._started = time.perf_counter()
    errors: list[BaseException] = []
    workers = [self._worker(i) for i in range(self.num_actors)]  # (pipes made here, in order)

    def launch(i: int) -> None:
      try:
        self._launch(i, *workers[i])
      except BaseException as e:  # (re-raised below, in the caller's thread)
        errors.append(e)

    with self._actor_environ():
      if self.mode == "process":
        threads = [threading.Thread(target=launch, args=(i,), name=f"jaxasync-spawn-{i}")
                   for i in range(self.num_actors)]
        for t in threads:
          t.start()
        for t in threads:
          t.join()
      else:
        for i in range(self.num_actors):
          launch(i)
    if errors:
      # (No actor may outlive a start that failed: stop those launched, and close the write
      # ends of the pipes made for processes that were not.)
      self.stop_and_join()
      if self.mode == "process":
        for i, (_, channel) in enumerate(workers):
          if self._workers[i] is None:
            channel.close()
      raise errors[0]

  def check(self) -> None:
    """Restarts failed actors; raises ``ActorFailed`` past ``max_restarts``. Call it often.

    A process actor restarts from a thread of its own: its spawn returns only once the child
    has imported jax and read its arguments (``start``), seconds the learner's loop, which
    calls this, would otherwise stand still. Until it is up, the actor reads as not alive."""
    if self._restart_errors:
      self.stop_and_join()
      raise self._restart_errors[0]
    for i, thread in list(self._restarting.items()):
      if not thread.is_alive():
        del self._restarting[i]
    failures: dict[int, str] = {}
    if self.mode == "process":  # a process can also die without a word (killed, segfault)
      # (Looked at before the errors: a process found dead has sent its traceback already,
      # so its death and its traceback are one failure, not one now and one at the next call.)
      for i, w in enumerate(self._workers):
        if w is not None and not w.is_alive() and not self._stop.is_set():
          w.join(0.1)
          failures[i] = f"actor process {i} exited with code {w.exitcode} without a traceback"
    while True:
      try:
        actor_id, tb = self._errors.get_nowait()
      except queue.Empty:
        break
      if actor_id not in self._restarting:  # (none can come from an actor being restarted)
        failures[actor_id] = tb
    for i, tb in failures.items():
      w = self._workers[i]
      if w is not None:
        w.join(5.0)
      if self.restarts[i] >= self.max_restarts:
        self.stop_and_join()
        raise ActorFailed(
            f"actor {i} failed {self.restarts[i] + 1} times (max_restarts={self.max_restarts}); "
            f"last error:\n{tb}")
      self.restarts[i] += 1
      last_line = tb.strip().splitlines()[-1] if tb.strip() else "no traceback"
      logger.warning(f"actor {i} restarted ({self.restarts[i]} of at most {self.max_restarts}): "
                     f"{last_line}")
      worker, channel = self._worker(i)  # (its pipe made here, in the loop's thread)
      if self.mode == "thread":
        self._launch(i, worker, channel)
        continue
      self._workers[i] = None  # (the dead one is not counted again meanwhile)
      thread = threading.Thread(target=self._relaunch, args=(i, worker, channel),
                                name=f"jaxasync-restart-{i}", daemon=True)
      self._restarting[i] = thread
      thread.start()

  def _relaunch(self, i: int, worker, channel) -> None:
    """Launches a restarted process actor ``i`` (in its own thread, from ``check``)."""
    try:
      with self._spawn_lock, self._actor_environ():
        if self._stop.is_set():  # (the run ended first: no child to start, or to orphan)
          channel.close()
          return
        self._launch(i, worker, channel)
    except BaseException as e:
      if self._workers[i] is None:  # (not started: the write end is still ours)
        channel.close()
      self._restart_errors.append(e)

  def stop_and_join(self, timeout: float = 10.0) -> list[ActorStats]:
    """Stops all actors and waits for them; returns per-actor stats. Never hangs past ``timeout``."""
    self._stop.set()
    end = time.perf_counter()
    deadline = time.monotonic() + timeout
    for thread in list(self._restarting.values()):  # (a spawn under way ends, then is stopped)
      thread.join(max(0.0, deadline - time.monotonic()))
    for w in self._workers:
      if w is None:
        continue
      while w.is_alive() and time.monotonic() < deadline:
        self._drain()  # a process may be flushing a chunk into a full queue
        w.join(0.05)
      if self.mode == "process" and w.is_alive():
        w.terminate()
        w.join(1.0)
    stats = []
    for i in range(self.num_actors):
      dur = end - (self._start_time[i] or end)
      steps = int(self.shared.env_steps[i])
      stats.append(ActorStats(i, steps, dur, steps / dur if dur > 0 else 0.0, self.restarts[i],
                              int(self.shared.adopted_version[i]),
                              min(1.0, self.shared.blocked_s[i] / dur) if dur > 0 else 0.0))
    return stats

  def _drain(self) -> None:
    while self.transport.get(0) is not None:
      pass

  def alive(self) -> list[bool]:
    return [w is not None and w.is_alive() for w in self._workers]
