"""The settings of a run: ``TrainerConfig`` (the loop, the replay, the collector) and
``AsyncConfig`` (actors, transport, publication, inference). The agent's own settings
(network, optimizer, exploration) are its config (e.g. ``DQNConfig``)."""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

from jaxasync.errors import ConfigError
from jaxasync.step_processor import check_return_settings


@dataclasses.dataclass(frozen=True)
class TrainerConfig:
  """The training loop's settings (border-core's ``TrainerConfig`` plus replay and n-step).

  Intervals count optimization (SGD) steps, as in border.

  Attributes:
    max_opts: stop after this many SGD steps.
    max_env_steps: stop after this many env steps (all sub-envs together); None: no limit.
    duration: stop after this many wall-clock seconds; None: no limit.
    target_eval_reward: stop once an evaluation's mean return reaches it; None: never.
    warmup_period: env steps collected before the first SGD step (replay-fed agents; a queue
      serves its first call as soon as it holds one).
    opt_interval: sync only: env steps per SGD step (1/opt_interval SGD steps per env step).
    updates_per_call: SGD steps per jitted update call.
    eval_interval: SGD steps between evaluations (the final params are evaluated too); 0: none.
    record_interval: SGD steps between recorded metrics; 0: none.
    save_interval: SGD steps between numbered checkpoints; 0: none.
    eval_episodes: episodes per evaluation (their mean return is the evaluation's).
    num_envs: sub-envs of the (sync) training vector env.
    n_step: n-step returns (the StepProcessor's).
    gamma: discount per env step.
    reward_clip: clip each env reward to [-c, c] before the n-step sum (Atari: 1); episode
      returns and evaluations stay the game's score. 0: none.
    replay_capacity: transitions the replay holds (the oldest go first). (Agents that learn
      from a queue hold two update calls' worth of unrolls instead.)
    max_policy_lag: queue-fed agents: items made by params more than this many SGD steps old
      are dropped (counted); None: no bound.
    seed: seeds envs, network init, exploration and replay sampling.
    model_dir: where checkpoints go (subdirectories best, final and one per saved SGD step
      count); None saves nothing.
    progress: show a tqdm progress bar.
    overwrite: start in a model_dir that holds another run's checkpoints or summary by
      deleting them (otherwise ConfigError).
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
      first ones of ``jax.devices()``; see ``jaxasync.sharding``); None: every accelerator,
      or the CPU. The batch is global: each device takes batch / devices items.
  """

  max_opts: int = 50_000
  max_env_steps: int | None = None
  duration: float | None = None
  target_eval_reward: float | None = None
  warmup_period: int = 1_000
  opt_interval: float = 1.0
  updates_per_call: int = 4
  eval_interval: int = 1_000
  record_interval: int = 500
  save_interval: int = 0
  eval_episodes: int = 10
  num_envs: int = 4
  n_step: int = 3
  gamma: float = 0.99
  reward_clip: float = 0.0
  replay_capacity: int = 100_000
  max_policy_lag: int | None = None
  seed: int = 0
  model_dir: str | None = None
  progress: bool = True
  overwrite: bool = False
  keep_checkpoints: int = 5
  save_replay: bool | None = None
  stall_warning: float | None = 60.0
  stall_timeout: float | None = 300.0
  learner_devices: int | None = None

  def validate(self, batch_size: int) -> None:
    check_return_settings(self.n_step, self.gamma, self.reward_clip)
    if self.max_opts < 1:
      raise ConfigError(f"max_opts must be >= 1 SGD step, got {self.max_opts}.")
    if self.max_policy_lag is not None and self.max_policy_lag < 0:
      raise ConfigError(f"max_policy_lag must be >= 0 SGD steps, or None for no bound; got "
                        f"{self.max_policy_lag}.")
    if batch_size > self.warmup_period:
      raise ConfigError(
          f"batch_size={batch_size} is larger than warmup_period={self.warmup_period}: the "
          "first update would sample more than is stored. Raise warmup_period or lower batch_size.")
    if self.warmup_period > self.replay_capacity:
      raise ConfigError(
          f"warmup_period={self.warmup_period} exceeds replay_capacity={self.replay_capacity}; "
          "the replay could never hold the warmup. Lower warmup_period or raise replay_capacity.")
    for name in ("eval_interval", "record_interval", "save_interval"):
      if getattr(self, name) < 0:
        raise ConfigError(f"{name} must be >= 0 SGD steps (0 disables it), got "
                          f"{getattr(self, name)}.")
    if self.eval_episodes < 1:
      raise ConfigError(f"eval_episodes must be >= 1, got {self.eval_episodes}; pass "
                        "--eval-episodes 1 or more (--eval-interval 0 disables evaluation).")
    if self.keep_checkpoints < 0:
      raise ConfigError(f"keep_checkpoints must be >= 0 (0: keep all), got {self.keep_checkpoints}.")
    if not 0 < self.opt_interval < math.inf or self.updates_per_call < 1 or self.num_envs < 1:
      raise ConfigError(f"opt_interval must be a finite number > 0 (got {self.opt_interval}), "
                        "updates_per_call and num_envs >= 1.")
    # (``not 0 < x < inf`` is also true of NaN, which every ``<=`` comparison lets through.)
    if self.duration is not None and not 0 < self.duration < math.inf:
      raise ConfigError(f"duration must be a finite number of seconds > 0, or None for no "
                        f"limit; got {self.duration}.")
    if self.max_env_steps is not None and self.max_env_steps < 1:
      raise ConfigError(f"max_env_steps must be >= 1, or None for no limit; got "
                        f"{self.max_env_steps}.")


@dataclasses.dataclass(frozen=True)
class AsyncConfig:
  """How actors and learner run side by side.

  Attributes:
    num_actors: actor threads, processes or Ray actors.
    actor_mode: 'process' (spawned; no GIL shared with the learner), 'thread', or 'ray' (Ray
      actors anywhere in a Ray cluster; see jaxasync.ray_actors; pip install 'jaxasync[ray]').
    envs_per_actor: sub-envs of each actor's vector env.
    chunk_steps: vector steps per chunk an actor pushes (one transition per sub-env each).
    queue_size: chunks the actor->learner queue holds (bounded). Keep it small: chunks wait
      in a full queue and go stale (ARCHITECTURE.md, "In-flight data is bounded").
    drop_when_full: drop the oldest chunk (counted) instead of blocking actors.
    sync_interval: SGD steps between publications of the params to the actors.
    samples_per_insert: replay ratio, transitions sampled per transition inserted; None: no
      limiter. The learner waits when it would exceed it, and stops ingesting (so the bounded
      queue blocks actors) when actors run ahead.
    samples_per_insert_tolerance: allowed deviation from the ratio, in sampled transitions;
      raised automatically to at least one update call plus one chunk so it cannot deadlock.
    max_train_frequency: cap on SGD steps per second (SEED's); None: no cap.
    max_restarts: restarts allowed per actor; one more failure ends the run (ActorFailed).
    pin_cpus: pin the learner to core 0 and actor i to core 1 + i mod (cores - 1).
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
      blocks (back-pressure; one call to it brings back all it holds). More lets an actor
      run ahead when calls are slow, but a held-back actor's chunks wait that much longer
      (policy lag), as in a longer queue.
  """

  num_actors: int = 1
  actor_mode: Literal["thread", "process", "ray"] = "process"
  envs_per_actor: int = 8
  chunk_steps: int = 8
  # When the samples-per-insert limiter holds actors back, the queue stays full and every
  # chunk waits behind the others, so its data is about queue_size * chunk_steps *
  # envs_per_actor * samples_per_insert / batch_size SGD steps old when it is learnt from.
  queue_size: int = 4
  drop_when_full: bool = False
  sync_interval: int = 50
  samples_per_insert: float | None = None
  samples_per_insert_tolerance: float = 0.0
  max_train_frequency: float | None = None
  max_restarts: int = 3
  pin_cpus: bool = False
  serialize_env_init: bool = False
  inference_servers: int = 0
  inference_batchsize: int = 4
  inference_delay: float = 0.002
  inference_device: Literal["default", "cpu"] = "default"
  ray_address: str | None = None
  ray_chunks_ahead: int = 4

  def validate(self) -> None:
    if self.actor_mode not in ("thread", "process", "ray"):
      raise ConfigError(f"actor_mode must be 'thread', 'process' or 'ray', got "
                        f"{self.actor_mode!r}.")
    if self.actor_mode == "ray":
      if self.inference_servers:
        raise ConfigError("Ray actors act with their own params copy: central inference "
                          "(inference_servers) serves thread and process actors; set "
                          "--async.inference-servers 0 or another actor mode.")
      if self.drop_when_full or self.pin_cpus or self.serialize_env_init:
        raise ConfigError("drop_when_full, pin_cpus and serialize_env_init apply to thread and "
                          "process actors; Ray actors are pulled (nothing to drop) and placed by "
                          "Ray. Unset them for actor_mode='ray'.")
      if self.ray_chunks_ahead < 1:
        raise ConfigError(f"ray_chunks_ahead must be >= 1, got {self.ray_chunks_ahead}.")
    if min(self.num_actors, self.envs_per_actor, self.chunk_steps, self.queue_size,
           self.sync_interval) < 1:
      raise ConfigError("num_actors, envs_per_actor, chunk_steps, queue_size and sync_interval "
                        "must all be >= 1.")
    if self.inference_servers < 0 or self.inference_batchsize < 1 or self.inference_delay < 0:
      raise ConfigError("inference_servers must be >= 0, inference_batchsize >= 1 and "
                        "inference_delay >= 0.")
    if self.inference_device not in ("default", "cpu"):
      raise ConfigError(f"inference_device must be 'default' or 'cpu', got {self.inference_device!r}.")
    if self.samples_per_insert is not None and not 0 < self.samples_per_insert < math.inf:
      raise ConfigError(f"samples_per_insert must be a finite number > 0, or None for no "
                        f"replay ratio; got {self.samples_per_insert}.")
