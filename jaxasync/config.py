"""The settings of a run that belong to no agent: ``RunConfig`` (the learner loop's limits,
intervals, seed, checkpoints, stall detection and devices) and ``ActorsConfig`` (how the
actors run: lock-step in the loop's thread, or threads, processes or Ray actors beside it).

What an agent learns from (the replay and its ratio, the n-step return; or unrolls and their
lag bound) is the agent's own config's ``data`` (``jaxasync.pipeline``); its network,
optimizer and exploration are the rest of that config (e.g. ``DQNConfig``). Every setting has
one owner, so a field is declared once in the library and nested, never copied, by the
experiment scripts' flags (``jaxasync.experiment``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Literal

from jaxasync.errors import ConfigError
from jaxasync.placement import usable_cores

ActorMode = Literal["auto", "sync", "thread", "process", "ray"]


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """The learner loop's settings (border-core's ``TrainerConfig`` less the replay).

  Intervals count optimization (SGD) steps, as in border; on-policy agents count one
  ``update`` call's worth of SGD steps per unroll batch (PPO: one iteration).

  Attributes:
    max_opts: stop after this many SGD steps.
    max_env_steps: stop after this many env steps (all sub-envs together); None: no limit.
    duration: stop after this many wall-clock seconds of this attempt (a resumed run gets
      them afresh, like a job's time limit); None: no limit.
    target_eval_reward: stop once an evaluation's mean return reaches it; None: never.
    updates_per_call: SGD steps per jitted update call (one dispatch to the device).
    eval_interval: SGD steps between evaluations (the final params are evaluated too); 0: none.
    eval_episodes: episodes per evaluation (their mean return is the evaluation's).
    record_interval: SGD steps between recorded metrics; 0: none.
    save_interval: SGD steps between numbered checkpoints; 0: none (best/ and final/ are
      still saved).
    seed: seeds envs, network init, exploration and replay sampling.
    logdir: where checkpoints (best, final, one per saved SGD step count) and the summary go
      (the experiment scripts put TensorBoard files and config.json there too); None saves
      nothing (the experiment scripts: a new runs/ALGO/ENV__seedN__TIME).
    progress: show a tqdm progress bar.
    overwrite: start in a logdir that holds another run's checkpoints or summary by deleting
      them (otherwise ConfigError).
    keep_checkpoints: numbered checkpoints kept, the newest (best and final always stay); 0
      keeps all.
    save_replay: checkpoints (numbered and final) hold the data source's state, so that a
      resumed run samples the same replay; None: when it is at most 4 GiB and the disk has
      room for it twice over (with a message when it is skipped).
    stall_warning: seconds without progress (no env step, SGD step or evaluation step) after
      which a warning names the stage the run is stuck in; None or 0: never.
    stall_timeout: seconds without progress after which the run stops with StallError (also
      raised when the run is still stuck 10 s past duration); None or 0: never.
    learner_devices: local devices the learner's updates are split over, data-parallel (the
      first ones of jax.devices(); see jaxasync.sharding); None: every accelerator, or the
      CPU. The batch is global: each device takes batch / devices items.
  """

  # Each field's comment-free docstring above is its --help text in the experiment scripts
  # (tyro reads the Attributes section).
  max_opts: int = 50_000
  max_env_steps: int | None = None
  duration: float | None = None
  target_eval_reward: float | None = None
  updates_per_call: int = 4
  eval_interval: int = 1_000
  eval_episodes: int = 10
  record_interval: int = 500
  save_interval: int = 0
  seed: int = 0
  logdir: str | None = None
  progress: bool = True
  overwrite: bool = False
  keep_checkpoints: int = 5
  save_replay: bool | None = None
  stall_warning: float | None = 60.0
  stall_timeout: float | None = 300.0
  learner_devices: int | None = None

  def validate(self) -> None:
    if self.max_opts < 1:
      raise ConfigError(f"max_opts must be >= 1 SGD step, got {self.max_opts}.")
    for name in ("eval_interval", "record_interval", "save_interval"):
      if getattr(self, name) < 0:
        raise ConfigError(f"{name} must be >= 0 SGD steps (0 disables it), got "
                          f"{getattr(self, name)}.")
    if self.eval_episodes < 1:
      raise ConfigError(f"eval_episodes must be >= 1, got {self.eval_episodes} (an "
                        "eval_interval of 0 disables evaluation).")
    if self.keep_checkpoints < 0:
      raise ConfigError(f"keep_checkpoints must be >= 0 (0: keep all), got {self.keep_checkpoints}.")
    if self.updates_per_call < 1:
      raise ConfigError(f"updates_per_call must be >= 1, got {self.updates_per_call}.")
    # (``not 0 < x < inf`` is also true of NaN, which every ``<=`` comparison lets through.)
    if self.duration is not None and not 0 < self.duration < math.inf:
      raise ConfigError(f"duration must be a finite number of seconds > 0, or None for no "
                        f"limit; got {self.duration}.")
    if self.max_env_steps is not None and self.max_env_steps < 1:
      raise ConfigError(f"max_env_steps must be >= 1, or None for no limit; got "
                        f"{self.max_env_steps}.")


def default_actor_mode() -> str:
  """What ``mode='auto'`` means here: one actor process beside the learner when there are >= 2
  cores, else the lock-step actor (with one core there is nothing to overlap; README,
  'Choosing a mode', has the figures)."""
  return "process" if len(usable_cores()) >= 2 else "sync"


@dataclasses.dataclass(frozen=True)
class ActorsConfig:
  """How actors run and reach the learner.

  The lock-step actor (mode 'sync', or 'auto' where it resolves to 'sync') reads ``mode`` and
  ``num_envs`` only (``LOCKSTEP_FIELDS``); every other field arranges actors beside the learner,
  and ``validate`` refuses a lock-step run where one of them is set away from its class default
  rather than ignore it. (The experiment scripts put back the ones their own defaults set:
  ``jaxasync.experiment.lockstep_actors``.)

  Attributes:
    mode: 'sync' (one lock-step actor in the learner loop's thread: deterministic per seed,
      the debugging mode), 'thread', 'process' (spawned; no GIL shared with the learner),
      'ray' (Ray actors anywhere in a Ray cluster; pip install 'jaxasync[ray]'), or 'auto'
      ('process' on >= 2 cores, else 'sync').
    num_envs: sub-envs of each actor's vector env (the lock-step actor's too).
    num_actors: actor threads, processes or Ray actors (not the lock-step actor: one).
    chunk_steps: vector steps per chunk an actor pushes (one item per sub-env each); an
      agent learning from unrolls pushes one unroll per chunk instead.
    queue_size: chunks the actor->learner queue holds (bounded). Keep it small: chunks wait
      in a full queue and go stale (ARCHITECTURE.md, "In-flight data is bounded").
    drop_when_full: drop the oldest chunk (counted) instead of blocking actors.
    sync_interval: SGD steps between publications of the params to the actors (the lock-step
      actor acts on the params of the last update call).
    max_restarts: restarts allowed per actor; one more failure ends the run (ActorFailed).
    pin_cpus: 'auto': pinned like True when the learner's thread and the process actors
      fill the usable cores, one each, and no other jaxasync run on this machine holds any
      of them; else placed by the OS (jaxasync.placement says why); True: the learner on the
      first usable core and actor i on usable core 1 + i mod (cores - 1), whatever runs
      there; False: no pinning.
    serialize_env_init: build the actors' envs one at a time (border's guard_init_env).
    inference_servers: 0: each actor runs its own policy copy on its CPU; n >= 1: SEED-style
      central inference, n InferenceServer threads in the learner's process batch the
      actors' observations (see jaxasync.inference).
    inference_batchsize: actor requests per inference batch, at most.
    inference_delay: seconds a server waits for more requests after the first.
    inference_device: where the inference servers run: 'default' (the accelerator when there
      is one) or 'cpu'.
    ray_address: Ray actors: the cluster to join, 'auto' (the one this machine's 'ray start'
      joined) or 'host:port'; None: a local Ray instance (unless this process already
      called ray.init).
    ray_chunks_ahead: Ray actors: chunks an actor collects ahead of the learner before it
      blocks, besides those in its child process's pipe (up to as many more, at most 1 MiB)
      (back-pressure; one call to it brings back all it holds). More lets an actor
      run ahead when calls are slow, but a held-back actor's chunks wait that much longer
      (policy lag), as in a longer queue.
    ray_gather_s: Ray actors: seconds a call waits, once it has a chunk, for more (up to
      ray_chunks_ahead) before it returns. Each call costs the Ray actor's process CPU time
      that its env steps then lack; fewer, fuller calls leave more of it to the actor, for
      chunks up to that much older (docs/bench_learning_results.md, "Ray actors in a child
      process", and "Ray actors: calls that gather for 0.2 s"). 0: a call returns what is
      there (the on-policy scripts' setting, with ray_chunks_ahead 4).
  """

  mode: ActorMode = "sync"
  num_envs: int = 4
  num_actors: int = 1
  chunk_steps: int = 8
  # When the replay's samples-per-insert limiter holds actors back, the queue stays full and
  # every chunk waits behind the others, so its data is about queue_size * chunk_steps *
  # num_envs * samples_per_insert / batch_size SGD steps old when it is learnt from.
  queue_size: int = 4
  drop_when_full: bool = False
  sync_interval: int = 50
  max_restarts: int = 3
  pin_cpus: bool | Literal["auto"] = "auto"
  serialize_env_init: bool = False
  inference_servers: int = 0
  inference_batchsize: int = 4
  inference_delay: float = 0.002
  inference_device: Literal["default", "cpu"] = "default"
  ray_address: str | None = None
  ray_chunks_ahead: int = 16
  ray_gather_s: float = 0.2

  # What the lock-step actor reads; it ignores every other field.
  LOCKSTEP_FIELDS: ClassVar[tuple[str, ...]] = ("mode", "num_envs")

  @classmethod
  def actor_fields(cls) -> tuple[str, ...]:
    """The fields only actors beside the learner read (threads, processes, Ray)."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.name not in cls.LOCKSTEP_FIELDS)

  def set_actor_fields(self) -> dict[str, Any]:
    """``actor_fields`` set away from their class default, ``{name: value}``."""
    defaults = type(self)()
    return {name: getattr(self, name) for name in self.actor_fields()
            if getattr(self, name) != getattr(defaults, name)}

  @property
  def resolved_mode(self) -> str:
    """``mode`` with 'auto' resolved (``default_actor_mode``)."""
    return default_actor_mode() if self.mode == "auto" else self.mode

  @property
  def lockstep(self) -> bool:
    """The run is synchronous: one actor stepped by the learner loop itself."""
    return self.resolved_mode == "sync"

  def validate(self) -> None:
    if self.mode not in ("auto", "sync", "thread", "process", "ray"):
      raise ConfigError(f"mode must be 'auto', 'sync', 'thread', 'process' or 'ray', got "
                        f"{self.mode!r}.")
    if self.num_envs < 1:
      raise ConfigError(f"num_envs must be >= 1, got {self.num_envs}.")
    if self.lockstep:
      self._check_lockstep()
      return
    if self.resolved_mode == "ray":
      if self.inference_servers:
        raise ConfigError("Ray actors act with their own params copy: central inference "
                          "(inference_servers) serves thread and process actors; set "
                          "inference_servers=0 or another mode.")
      if self.drop_when_full or self.pin_cpus is True or self.serialize_env_init:
        raise ConfigError("drop_when_full, pin_cpus and serialize_env_init apply to thread and "
                          "process actors; Ray actors are pulled (nothing to drop) and placed by "
                          "Ray. Unset them for mode='ray'.")
      if self.ray_chunks_ahead < 1:
        raise ConfigError(f"ray_chunks_ahead must be >= 1, got {self.ray_chunks_ahead}.")
      if not 0.0 <= self.ray_gather_s < float("inf"):  # (also refuses NaN)
        raise ConfigError(f"ray_gather_s must be >= 0 seconds, got {self.ray_gather_s}.")
    if min(self.num_actors, self.chunk_steps, self.queue_size, self.sync_interval) < 1:
      raise ConfigError("num_actors, chunk_steps, queue_size and sync_interval must all be "
                        ">= 1.")
    if self.inference_servers < 0 or self.inference_batchsize < 1 or self.inference_delay < 0:
      raise ConfigError("inference_servers must be >= 0, inference_batchsize >= 1 and "
                        "inference_delay >= 0.")
    if not (isinstance(self.pin_cpus, bool) or self.pin_cpus == "auto"):
      raise ConfigError(f"pin_cpus must be True, False or 'auto', got {self.pin_cpus!r}.")
    if self.inference_device not in ("default", "cpu"):
      raise ConfigError(f"inference_device must be 'default' or 'cpu', got {self.inference_device!r}.")

  def _check_lockstep(self) -> None:
    """Refuses a lock-step run with actor fields set, which it would silently ignore
    (``pin_cpus=False`` asks for what a lock-step run does: nothing is pinned)."""
    ignored = self.set_actor_fields()
    if ignored.get("pin_cpus") is False:
      del ignored["pin_cpus"]
    if ignored:
      mode = "mode 'sync'" if self.mode == "sync" else "mode 'auto' (here 'sync': one core)"
      settings = ", ".join(f"{name}={value!r}" for name, value in ignored.items())
      raise ConfigError(f"{mode} runs one lock-step actor in the learner's thread, which "
                        f"ignores {settings}: drop them, or use mode 'thread' or 'process' "
                        "for actors beside the learner.")
