"""An actor: a vector env, the StepProcessor and a CPU copy of the policy, pushing chunks.

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
from typing import Any, Callable, Sequence

import numpy as np

from jaxasync.types import Transition

PyTree = Any


def apex_epsilons(num: int, epsilon: float = 0.4, alpha: float = 7.0) -> np.ndarray:
  """Ape-X's ladder ``eps_i = epsilon^(1 + alpha * i / (num - 1))``, ``[num]``."""
  if num == 1:
    return np.array([epsilon])
  i = np.arange(num)
  return epsilon ** (1.0 + alpha * i / (num - 1))


@dataclasses.dataclass(frozen=True)
class ActorConfig:
  """What one actor needs besides the agent and env factories (picklable).

  Attributes:
    num_envs: sub-envs of its vector env.
    chunk_steps: vector steps per pushed chunk (a chunk has up to
      ``chunk_steps * num_envs`` transitions).
    n_step, gamma: the StepProcessor's settings.
    seed: base seed; actor ``i`` on its ``r``-th restart uses ``actor_seed(seed, i, r)``.
    epsilons: fixed per-env exploration ``[num_envs]`` (e.g. a slice of the Ape-X
      ladder); ``None`` follows the agent's schedule over the estimated global
      env steps (this actor's steps times ``num_actors``).
    num_actors: actors in the run (for the schedule estimate).
    cpu: pin the actor to this CPU core (``None``: no pinning).
    step_processor_cls: the learner replay's ``step_processor_cls``.
    reward_clip: the step processor's per-reward clipping (``TrainerConfig.reward_clip``).
  """

  num_envs: int = 8
  chunk_steps: int = 16
  n_step: int = 1
  gamma: float = 0.99
  seed: int = 0
  epsilons: tuple[float, ...] | None = None
  num_actors: int = 1
  cpu: int | None = None
  step_processor_cls: type | None = None  # the replay's; None: jaxasync.StepProcessor
  reward_clip: float = 0.0
  restart: int = 0  # set by the ActorManager: how many times this actor was restarted


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


def run_actor(actor_id: int, agent_factory: Callable[[], Any], env_factory: Callable,
              config: ActorConfig, transport, param_store, stop, errors, shared: ActorShared,
              env_init_lock=None, inference=None) -> None:
  """Runs one actor until ``stop`` is set. Exceptions go to ``errors`` with their traceback.

  With ``inference`` (an ``InferenceClient``) the actor asks the central server for the
  network's actions instead of running its own params copy, and keeps epsilon local.
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


def _actor_loop(actor_id, agent_factory, env_factory, config: ActorConfig, transport,
                param_store, stop, shared: ActorShared, env_init_lock, inference) -> None:
  from jaxasync.agents.dqn import epsilon_greedy
  from jaxasync.evaluator import to_cpu  # imported here: runs in the actor's own process
  from jaxasync.step_processor import StepProcessor
  from jaxasync.transport import Chunk

  if config.cpu is not None and hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, {config.cpu})
  seed = actor_seed(config.seed, actor_id, config.restart)
  agent = agent_factory()
  if env_init_lock is not None:
    with env_init_lock:  # border's guard_init_env: some envs must not be built concurrently
      env = env_factory(config.num_envs, seed=seed)
  else:
    env = env_factory(config.num_envs, seed=seed)
  try:
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    action_example = np.asarray(env.single_action_space.sample())
    proc = (config.step_processor_cls or StepProcessor)(
        config.num_envs, obs[0], action_example, config.n_step, config.gamma, config.reward_clip)
    proc.reset(obs)
    epsilons = None if config.epsilons is None else np.asarray(config.epsilons)

    # Wait for the learner's first publication.
    while param_store.version < 0:
      if stop.is_set():
        return
      time.sleep(0.01)
    info = param_store.get()
    version, params = info.version, to_cpu(info.params)
    shared.adopted_version[actor_id] = version

    pending, seq = [], 0
    steps_in_chunk, env_steps = 0, int(shared.env_steps[actor_id])
    chunk_steps, num_envs = config.chunk_steps, config.num_envs
    # env_steps only moves per chunk, so the schedule's epsilon is computed once a chunk.
    eps = epsilons if epsilons is not None else agent.epsilon(env_steps * config.num_actors)
    act, env_step, proc_step = agent.act, env.step, proc.step
    action_dtype = env.single_action_space.dtype
    while not stop.is_set():
      if inference is not None:  # SEED: the server runs the network on its device
        answer = inference.policy_actions(proc.obs, stop)
        if answer is None:
          break
        actions, version = answer
        actions = epsilon_greedy(actions, eps, agent.num_actions, rng).astype(action_dtype)
      else:
        if param_store.version > version:  # adopt as soon as published
          info = param_store.get()
          version, params = info.version, to_cpu(info.params)
          shared.adopted_version[actor_id] = version
        actions = act(params, proc.obs, eps, rng)
      if steps_in_chunk == 0:
        chunk_version = version  # the oldest params the chunk's steps were taken with
      next_obs, reward, terminated, truncated, _ = env_step(actions)
      pending.append(proc_step(actions, reward, next_obs, terminated, truncated))
      steps_in_chunk += 1
      if steps_in_chunk >= chunk_steps:
        chunk = Chunk(actor_id, chunk_version, _concat(pending), steps_in_chunk * num_envs,
                      tuple(proc.pop_episode_returns()), seq)
        if not transport.put(chunk, stop):
          break
        seq += 1
        env_steps += steps_in_chunk * num_envs
        shared.env_steps[actor_id] = env_steps
        pending, steps_in_chunk = [], 0
        if epsilons is None:
          eps = agent.epsilon(env_steps * config.num_actors)
    # The learner publishes its last params before stopping us: end on its latest version.
    if param_store.version > version:
      info = param_store.get()
      version, params = info.version, to_cpu(info.params)
      shared.adopted_version[actor_id] = version
  finally:
    env.close()


def _concat(parts: Sequence) -> Any:
  """The step outputs of one chunk as one batch: leaf-wise ``np.concatenate`` along axis 0.

  ``Transition`` outputs (jaxasync's StepProcessor) are joined field by field (~17 us for 16
  steps of 8 envs, against ~40 us through ``jax.tree.map``); any other pytree (another replay's
  step processor) goes through ``jax.tree.map``.
  """
  if all(type(p) is Transition for p in parts):
    return Transition(*(np.concatenate(field) for field in zip(*parts)))
  import jax
  return jax.tree.map(lambda *xs: np.concatenate(xs, axis=0), *parts)
