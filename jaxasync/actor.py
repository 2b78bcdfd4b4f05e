"""An actor: a vector env, a collector and a copy of the policy's params, pushing chunks.

``run_actor`` is the actor's whole life and runs the same way in a thread or in
a spawned process; ``ActorManager`` supervises it.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import signal
import threading
import time
import traceback
from typing import Any, Callable, NamedTuple, Sequence

import jax
import numpy as np

from jaxasync.agent import ActorContext
from jaxasync.collectors.nstep import StepProcessor
from jaxasync.envs import VectorEnvFactory
from jaxasync.param_store import to_cpu
from jaxasync.placement import pin_this_thread
from jaxasync.transport import Chunk
from jaxasync.types import Transition, storage_dtype

PyTree = Any


@dataclasses.dataclass(frozen=True)
class ActorConfig:
  """What one actor needs besides the agent and env factories (picklable).

  Attributes:
    num_envs: sub-envs of its vector env.
    chunk_steps: vector steps per pushed chunk.
    collector: picklable ``(num_envs, obs_example, action_example) -> collector`` (e.g. a
      ``functools.partial`` of ``StepProcessor`` with its n-step settings); ``None``: a 1-step
      ``StepProcessor``.
    seed: base seed; actor ``i`` on its ``r``-th restart uses ``actor_seed(seed, i, r)``.
    num_actors: actors in the run (the agent's exploration state may depend on it).
    cpu: pin the actor to this CPU core (``None``: no pinning).
    restart: set by the ``ActorManager``: how many times this actor was restarted.
  """

  num_envs: int = 8
  chunk_steps: int = 16
  collector: Callable | None = None
  seed: int = 0
  num_actors: int = 1
  cpu: int | None = None
  restart: int = 0


def actor_seed(base: int, actor_id: int, restart: int = 0) -> int:
  """The seed of actor ``actor_id``'s run after ``restart`` restarts (its envs get
  ``seed + e``, its exploration generator ``seed``).

  Hashed from all three with numpy's ``SeedSequence``, so actors, restarts and the
  evaluator (``base + 10_000 + k``) do not share env seeds (a restarted actor must not replay
  its first trajectories), and kept below ``2**31 - 2**16`` so that every sub-env's seed
  fits an int32 (envpool).
  """
  entropy = [base & (2**64 - 1), actor_id, restart]
  return int(np.random.SeedSequence(entropy).generate_state(1)[0]) % (2**31 - 2**16)


@dataclasses.dataclass
class ActorShared:
  """Per-actor counters the manager reads; multiprocessing arrays for processes, numpy for threads."""

  env_steps: Any  # [num_actors] int64
  adopted_version: Any  # [num_actors] int64, last params version adopted
  # [num_actors] float64: seconds spent waiting to hand chunks over (the queue full: the
  # learner not taking); None: not measured (the lock-step actor, Ray actors).
  blocked_s: Any = None

  @classmethod
  def in_shared_memory(cls, ctx, num_actors: int) -> "ActorShared":
    """Counters for ``num_actors`` actor processes of the multiprocessing context ``ctx``
    (zeroed ``RawArray``s: read and written without a lock, one writer per entry)."""
    return cls(ctx.RawArray("q", num_actors), ctx.RawArray("q", num_actors),
               ctx.RawArray("d", num_actors))


def run_actor(actor_id: int, agent_factory: Callable[[], Any], env_factory: VectorEnvFactory,
              config: ActorConfig, transport, param_store, stop, errors, shared: ActorShared,
              env_init_lock=None, inference=None) -> None:
  """Runs one actor until ``stop`` is set. Exceptions go to ``errors`` with their traceback.

  With ``inference`` (an ``InferenceClient``) the actor asks the central server for the
  network's outputs (``Agent.policy``) instead of running its own params copy, and keeps its
  exploration (``Agent.select``) local.
  """
  try:
    _actor_loop(actor_id, agent_factory, env_factory, config, transport, param_store, stop,
                shared, env_init_lock, inference)
  except BaseException:  # reported to the manager, which restarts or fails the run
    errors.put((actor_id, traceback.format_exc()))
  finally:
    transport.release()
    if inference is not None:
      inference.release()


def run_actor_process(*args) -> None:
  """``run_actor`` as a spawned process's target: it exits as soon as its parent is gone.

  A parent killed with ``kill -9`` (or OOM) runs no cleanup, so the actor watches the pipe
  that multiprocessing keeps open from the parent (``parent_process().sentinel``) and exits
  when it closes; otherwise orphaned actors (and, through them, the resource tracker and its
  ``/dev/shm`` semaphores) lived on forever. Ctrl-C reaches the whole process group: the
  actor ignores it and lets the learner stop it, instead of dying with a traceback.
  """
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  parent = mp.parent_process()
  if parent is not None:
    def exit_with_parent():
      mp.connection.wait([parent.sentinel])
      os._exit(3)  # nobody is left to report to, and the env may be stuck in step()

    threading.Thread(target=exit_with_parent, name="jaxasync-parent-watch", daemon=True).start()
  run_actor(*args)


def on_one_device(tree) -> bool:
  """Whether every leaf of ``tree`` is a ``jax.Array`` and all of them are on one device."""
  leaves = jax.tree.leaves(tree)
  return (all(isinstance(x, jax.Array) for x in leaves)
          and len({d for x in leaves for d in x.devices()}) == 1)


class Actor:
  """One actor's acting: a vector env, a collector, the agent's actor side and a params copy.

  ``step()`` takes one vector step (``choose`` its actions, then ``take`` them) and returns a
  ``Chunk`` every ``chunk_steps`` steps. The asynchronous actor (``run_actor``, in a thread or
  a process) calls it in a loop and pushes the chunks; the synchronous loop calls ``take`` and
  ``choose`` itself whenever its learner has no update to run (``chunk_steps=1``: lock-step;
  ``LockstepFeed``). Params are adopted in one place, ``adopt_latest``.

  Args:
    actor_id: index of the actor.
    agent: the ``Agent`` (its actor side: ``initial_actor_state``, ``act``/``select``).
    env: the vector env (already built).
    config: the actor's settings.
    param_store: where the learner publishes; the actor follows its version.
    shared: counters the supervisor reads (``adopted_version``, ``env_steps``).
    seed: seeds the exploration generator; ``env_seed`` (default: ``seed``) the env reset.
    inference: an ``InferenceClient``: the network runs on the central server.
    acts_on_published_device: act on the published params where they are when they live on
      one device (the lock-step actor, which reads the learner's own device copies) rather
      than on a CPU copy.
  """

  def __init__(self, actor_id: int, agent, env, config: ActorConfig, param_store,
               shared: ActorShared, seed: int, env_seed: int | None = None, inference=None,
               acts_on_published_device: bool = False):
    self.actor_id, self.agent, self.env, self.config = actor_id, agent, env, config
    self.acts_on_published_device = acts_on_published_device
    self._use_published: bool | None = None  # (set at the first adoption)
    self.param_store, self.shared, self.inference = param_store, shared, inference
    self.rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed if env_seed is None else env_seed)
    action_example = np.asarray(env.single_action_space.sample())
    obs_example = obs[0].astype(storage_dtype(obs.dtype), copy=False)
    self.collector = (config.collector or StepProcessor)(config.num_envs, obs_example,
                                                         action_example)
    self.collector.reset(obs)
    self.env_steps = int(shared.env_steps[actor_id])
    self.actor_state = agent.initial_actor_state(ActorContext(
        actor_id, config.num_actors, config.num_envs, env_steps=self.env_steps))
    self.version, self.params = -1, None
    self._pending, self._steps_in_chunk, self._seq = [], 0, 0
    self._chunk_version = -1

  def adopt_latest(self) -> None:
    """Takes the store's params if they are newer than ours: a CPU copy for jitted acting, or
    the published params themselves (``acts_on_published_device``)."""
    if self.param_store.version > self.version:
      info = self.param_store.get()
      # On a GPU learner a CPU copy per publication cost the lock-step loop 2.1 ms per vector
      # step, acting there ~1 ms (docs/accelerator.md, "The sync loop on a GPU").
      # (Params split over several learner devices are copied: acting would run on all. The
      # learner's devices are the run's, so the first publication decides.)
      params = info.params
      if self._use_published is None:
        self._use_published = self.acts_on_published_device and on_one_device(params)
      if not self._use_published:
        params = to_cpu(params, published=True)
      self.version, self.params = info.version, params
      self.shared.adopted_version[self.actor_id] = self.version

  def step(self, stop=None):
    """One vector step; returns a ``Chunk`` when ``chunk_steps`` steps are in, else ``None``.

    Raises ``ActorStopped`` when ``stop`` is set while waiting for the inference server.
    """
    return self.take(self.choose(stop))

  def choose(self, stop=None) -> "Choice":
    """The next vector step's actions, on the latest params (or the inference server's).

    Raises ``ActorStopped`` when ``stop`` is set while waiting for the inference server.
    """
    agent = self.agent
    if self.inference is not None:  # SEED: the server runs the network on its device
      answer = self.inference.policy(self.collector.obs, stop)
      if answer is None:
        raise ActorStopped
      outputs, version = answer
      actions, extras, self.actor_state = agent.select(outputs, self.actor_state, self.rng)
    else:
      self.adopt_latest()  # as soon as published
      version = self.version
      actions, extras, self.actor_state = agent.act(self.params, self.collector.obs,
                                                    self.actor_state, self.rng)
    return Choice(actions, extras, version)

  def take(self, choice: "Choice"):
    """Steps the env with ``choice`` (from ``choose`` on the current observations); returns a
    ``Chunk`` when ``chunk_steps`` steps are in, else ``None``."""
    collector, (actions, extras, version) = self.collector, choice
    if self._steps_in_chunk == 0:
      self._chunk_version = version  # the oldest params the chunk's steps were taken with
    next_obs, reward, terminated, truncated, _ = self.env.step(actions)
    if extras is None:
      piece = collector.step(actions, reward, next_obs, terminated, truncated)
    else:
      piece = collector.step(actions, reward, next_obs, terminated, truncated, extras)
    if piece is not None:
      self._pending.append(piece)
    self._steps_in_chunk += 1
    if self._steps_in_chunk < self.config.chunk_steps:
      return None
    steps = self._steps_in_chunk * self.config.num_envs
    chunk = Chunk(self.actor_id, self._chunk_version, _concat(self._pending), steps,
                  tuple(collector.pop_episode_returns()), self._seq)
    self._pending, self._steps_in_chunk = [], 0
    self._seq += 1
    self.env_steps += steps
    self.shared.env_steps[self.actor_id] = self.env_steps
    return chunk


class Choice(NamedTuple):
  """One vector step's actions ``[num_envs, ...]``, the agent's extras for them (or
  ``None``) and the params version they were chosen with."""

  actions: Any
  extras: Any
  version: int


class ActorStopped(Exception):
  """The run stopped while an actor waited for the inference server."""


def _actor_loop(actor_id, agent_factory, env_factory, config: ActorConfig, transport,
                param_store, stop, shared: ActorShared, env_init_lock, inference) -> None:
  pin_this_thread(config.cpu)
  seed = actor_seed(config.seed, actor_id, config.restart)
  agent = agent_factory()
  if env_init_lock is not None:
    with env_init_lock:  # border's guard_init_env: some envs must not be built concurrently
      env = env_factory(config.num_envs, seed=seed)
  else:
    env = env_factory(config.num_envs, seed=seed)
  try:
    actor = Actor(actor_id, agent, env, config, param_store, shared, seed, inference=inference)
    # Wait for the learner's first publication.
    while param_store.version < 0:
      if stop.is_set():
        return
      time.sleep(0.01)
    actor.adopt_latest()
    try:
      while not stop.is_set():
        chunk = actor.step(stop)
        if chunk is None:
          continue
        t0 = time.perf_counter()
        handed_over = transport.put(chunk, stop)
        if shared.blocked_s is not None:
          shared.blocked_s[actor_id] += time.perf_counter() - t0
        if not handed_over:
          break
    except ActorStopped:
      pass
    # The learner publishes its last params before stopping us: end on its latest version.
    actor.adopt_latest()
  finally:
    env.close()


def _concat(parts: Sequence) -> Any:
  """The step outputs of one chunk as one batch: leaf-wise ``np.concatenate`` along axis 0
  (a collector that emits whole items, such as one unroll per chunk, gives a single part,
  passed through).

  ``Transition`` outputs (jaxasync's StepProcessor) are joined field by field, cheaper than
  ``jax.tree.map`` on this per-chunk path; any other pytree goes through ``jax.tree.map``.
  """
  if len(parts) == 1:
    return parts[0]
  if all(type(p) is Transition and p.extras is None for p in parts):
    # (field by field, the extras field, None, left out)
    return Transition(*(np.concatenate(field) for field in zip(*(p[:-1] for p in parts))))
  return jax.tree.map(lambda *xs: np.concatenate(xs, axis=0), *parts)
