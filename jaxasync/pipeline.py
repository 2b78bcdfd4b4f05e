"""What an agent learns from, declared in its config and built by it (acme's builder idea):
the agent's ``data`` is a ``DataPipeline``, which makes the collector its actors run and the
data source its learner samples. The composition root (``Trainer``) only wires them.

* ``ReplayConfig``: n-step transitions (``StepProcessor``; each frame stored once with
  ``frames``: ``FrameStepProcessor``) into a replay (uniform or prioritized) sampled at a
  replay ratio (``ReplaySource``);
* ``UnrollConfig``: time-major ``[T+1, B]`` unrolls (``UnrollCollector``) through a FIFO
  queue, each used once, none older than ``max_policy_lag`` SGD steps (``QueueSource``).

An agent config holds one as its field ``data``; the experiment scripts show its fields with
the agent's (``--agent.n-step``, ``--agent.unroll-length``).
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import math
from typing import TYPE_CHECKING, Any, Callable

from jaxasync.config import ActorsConfig, RunConfig
from jaxasync.errors import ConfigError

if TYPE_CHECKING:
  from jaxasync.agent import Agent

# ``(num_envs, obs_example, action_example) -> collector``, picklable (process actors build
# their own collector from it).
CollectorFactory = Callable[..., Any]


class DataPipeline(abc.ABC):
  """The contract of an agent's ``data``: what its actors collect and how the learner is fed.

  Attributes:
    batch_axis: the batch axis of ``update``'s batch leaves: 1 for transitions ``[k, N, ...]``,
      2 for unrolls ``[k, T + 1, N, ...]`` (what a multi-device learner shards).
  """

  batch_axis: int = 1

  @abc.abstractmethod
  def validate(self, batch_size: int) -> None:
    """Raises ``ConfigError`` for settings no run could serve with ``batch_size`` items per
    SGD step."""

  @abc.abstractmethod
  def chunk_steps(self, actors: ActorsConfig) -> int:
    """Vector steps per chunk an actor pushes."""

  @abc.abstractmethod
  def items_per_batch(self, batch_size: int, num_envs: int) -> int:
    """Rows of the batch axis one SGD step sees (what learner devices must divide)."""

  @abc.abstractmethod
  def collector_factory(self, agent: "Agent", replay: Any = None) -> CollectorFactory:
    """The actors' collector (``jaxasync.collectors``), as a picklable factory."""

  @abc.abstractmethod
  def make_source(self, agent: "Agent", run: RunConfig, actors: ActorsConfig,
                  replay: Any = None) -> Any:
    """The learner's data source (``jaxasync.sources``); ``replay`` replaces the one the
    pipeline would build."""

  @abc.abstractmethod
  def starved_hint(self) -> str:
    """What to change when a run ended before its first SGD step."""

  def check_actors(self, actors: ActorsConfig) -> None:
    """Raises ``ConfigError`` for an arrangement of ``actors`` this pipeline cannot be fed
    by (called before the run directory is touched); any arrangement, unless overridden."""


@dataclasses.dataclass(frozen=True)
class ReplayConfig(DataPipeline):
  """n-step transitions into a replay, sampled at a replay ratio (off-policy agents).

  Attributes:
    replay_capacity: transitions the replay holds (the oldest go first).
    warmup_period: env steps collected before the first SGD step.
    n_step: n-step returns (1: one-step TD targets).
    gamma: discount per env step.
    reward_clip: clip each env reward to [-c, c] before the n-step sum (Atari: 1); episode
      returns and evaluations stay the game's score; 0: none.
    opt_interval: lock-step (sync) runs: env steps per SGD step.
    samples_per_insert: actor runs: the replay ratio, transitions sampled per transition
      inserted; None: no limiter. The learner waits when it would exceed it, and stops
      ingesting (so the bounded queue blocks actors) when actors run ahead.
    samples_per_insert_tolerance: allowed deviation from the ratio, in sampled transitions;
      raised automatically to at least one update call plus one chunk so it cannot deadlock.
    max_train_frequency: actor runs: cap on SGD steps per second (SEED's); None: no cap.
    prioritized: proportional prioritized replay (Schaul et al. 2016); the agent's update
      returns the new priorities.
    priority_alpha: priority exponent (0: uniform sampling).
    priority_beta: initial importance-sampling exponent, annealed to 1 over the run's max_opts.
    frames: store each frame of a frame stack once (Atari: ~7 kB per transition instead of
      ~56 kB); the observations must be frame stacks like Atari's [84, 84, 4].
  """

  replay_capacity: int = 100_000
  warmup_period: int = 1_000
  n_step: int = 3
  gamma: float = 0.99
  reward_clip: float = 0.0
  opt_interval: float = 1.0
  samples_per_insert: float | None = None
  samples_per_insert_tolerance: float = 0.0
  max_train_frequency: float | None = None
  prioritized: bool = False
  priority_alpha: float = 0.5
  priority_beta: float = 0.4
  frames: bool = False

  batch_axis = 1

  def validate(self, batch_size: int) -> None:
    check_return_settings(self.n_step, self.gamma, self.reward_clip)
    if batch_size > self.warmup_period:
      raise ConfigError(
          f"batch_size={batch_size} is larger than warmup_period={self.warmup_period}: the "
          "first update would sample more than is stored. Raise warmup_period or lower batch_size.")
    if self.warmup_period > self.replay_capacity:
      raise ConfigError(
          f"warmup_period={self.warmup_period} exceeds replay_capacity={self.replay_capacity}; "
          "the replay could never hold the warmup. Lower warmup_period or raise replay_capacity.")
    if not 0 < self.opt_interval < math.inf:
      raise ConfigError(f"opt_interval must be a finite number > 0 env steps per SGD step, "
                        f"got {self.opt_interval}.")
    # (``not 0 < x < inf`` is also true of NaN, which every ``<=`` comparison lets through.)
    if self.samples_per_insert is not None and not 0 < self.samples_per_insert < math.inf:
      raise ConfigError(f"samples_per_insert must be a finite number > 0, or None for no "
                        f"replay ratio; got {self.samples_per_insert}.")
    if self.prioritized and not (self.priority_alpha >= 0 and 0 <= self.priority_beta <= 1):
      raise ConfigError(f"priority_alpha must be >= 0 and priority_beta in [0, 1], got "
                        f"{self.priority_alpha} and {self.priority_beta}.")

  def chunk_steps(self, actors: ActorsConfig) -> int:
    return 1 if actors.lockstep else actors.chunk_steps

  def starved_hint(self) -> str:
    return (f"The first {self.warmup_period} env steps (warmup_period) only fill the replay: "
            "lower warmup_period or run longer.")

  def items_per_batch(self, batch_size: int, num_envs: int) -> int:
    return batch_size

  def make_replay(self, agent: "Agent", seed: int) -> Any:
    """The replay these settings describe, for ``agent``'s transitions."""
    from jaxasync.replay import PrioritizedReplayBuffer, ReplayBuffer
    from jaxasync.replay.frames import FrameReplayBuffer, PrioritizedFrameReplayBuffer
    from jaxasync.types import transition_example
    example = transition_example(agent.obs_space, agent.action_space, agent.extras_example())
    priorities = dict(alpha=self.priority_alpha, beta=self.priority_beta)
    if self.frames:
      if self.prioritized:
        return PrioritizedFrameReplayBuffer(example, self.replay_capacity, seed, **priorities)
      return FrameReplayBuffer(example, self.replay_capacity, seed)
    if self.prioritized:
      return PrioritizedReplayBuffer(example, self.replay_capacity, seed, **priorities)
    return ReplayBuffer(example, self.replay_capacity, seed)

  def collector_factory(self, agent: "Agent", replay: Any = None) -> CollectorFactory:
    from jaxasync.collectors import FrameStepProcessor, StepProcessor
    from jaxasync.replay.frames import FrameReplayBuffer
    settings = dict(n_step=self.n_step, gamma=self.gamma, reward_clip=self.reward_clip)
    if replay is not None and isinstance(replay, FrameReplayBuffer) != self.frames:
      raise ConfigError(f"the replay given ({type(replay).__name__}) does not match "
                        f"frames={self.frames} of {type(agent).__name__}'s data: a frame "
                        "replay needs the frame collector and the other way round. Set "
                        "frames to match, or let the pipeline build the replay.")
    if self.frames:  # the frame replay and its collector are a pair: no room for extras
      if agent.extras_example() is not None:
        raise ConfigError(f"frames=True stores frames and actions only; "
                          f"{type(agent).__name__} returns extras: set frames=False.")
      return functools.partial(FrameStepProcessor, **settings)
    return functools.partial(StepProcessor, extras_example=agent.extras_example(), **settings)

  def make_source(self, agent: "Agent", run: RunConfig, actors: ActorsConfig,
                  replay: Any = None) -> Any:
    from jaxasync.sources.replay import RateLimiter, ReplaySource, UpdateCredit
    replay = replay if replay is not None else self.make_replay(agent, run.seed)
    k, batch = run.updates_per_call, agent.batch_size
    if actors.lockstep:  # border's opt_interval, counted in env steps
      return ReplaySource(replay, batch, k, UpdateCredit(self.opt_interval, self.warmup_period,
                                                         batch),
                          beta_anneal_steps=run.max_opts)
    chunk_items = actors.chunk_steps * actors.num_envs
    # The tolerance is raised to one update call plus one chunk, or it could deadlock.
    min_tol = k * batch + (self.samples_per_insert or 0.0) * chunk_items
    limiter = RateLimiter(self.samples_per_insert,
                          max(self.samples_per_insert_tolerance, min_tol), self.warmup_period)
    return ReplaySource(replay, batch, k, limiter, warmup_items=self.warmup_period,
                        max_train_frequency=self.max_train_frequency,
                        beta_anneal_steps=run.max_opts, chunk_items=chunk_items)


@dataclasses.dataclass(frozen=True)
class UnrollConfig(DataPipeline):
  """Unrolls through a FIFO queue, each used once (on-policy agents).

  Attributes:
    unroll_length: T, env steps per unroll (one unroll: T steps of an actor's sub-envs, plus
      the boundary step it shares with the next one).
    max_policy_lag: drop unrolls made by params more than this many SGD steps old (counted);
      None: keep all.
  """

  unroll_length: int = 20
  max_policy_lag: int | None = None

  batch_axis = 2

  def validate(self, batch_size: int) -> None:
    if self.unroll_length < 1:
      raise ConfigError(f"unroll_length must be >= 1, got {self.unroll_length}.")
    if self.max_policy_lag is not None and self.max_policy_lag < 0:
      raise ConfigError(f"max_policy_lag must be >= 0 SGD steps, or None for no bound; got "
                        f"{self.max_policy_lag}.")

  def chunk_steps(self, actors: ActorsConfig) -> int:
    return self.unroll_length  # an actor pushes one unroll per chunk

  def starved_hint(self) -> str:
    return (f"An SGD step needs batch_size unrolls of {self.unroll_length} steps "
            "(unroll_length) from each actor's envs: run longer.")

  def items_per_batch(self, batch_size: int, num_envs: int) -> int:
    return batch_size * num_envs  # a batch of unrolls is their sub-envs side by side

  def collector_factory(self, agent: "Agent", replay: Any = None) -> CollectorFactory:
    if replay is not None:
      raise ConfigError(f"{type(agent).__name__} learns from unrolls in a queue: it takes no "
                        "replay; drop the replay argument.")
    return functools.partial(_unroll_collector, self.unroll_length, agent.extras_example(),
                             agent.unroll_return_discount())

  def check_actors(self, actors: ActorsConfig) -> None:
    lag = self.max_policy_lag
    if not actors.lockstep and lag is not None and actors.sync_interval > lag:
      # Actors get new params only every sync_interval SGD steps, so every unroll would be
      # stale before the next ones arrive: the learner would stop at a few SGD steps while
      # the actors' unrolls are all dropped.
      raise ConfigError(
          f"sync_interval={actors.sync_interval} SGD steps between param publications is more "
          f"than max_policy_lag={lag}, so every unroll would go stale before the actors get "
          "new params: set sync_interval to 1 (on-policy learning wants the freshest params) "
          "or raise max_policy_lag.")

  def make_source(self, agent: "Agent", run: RunConfig, actors: ActorsConfig,
                  replay: Any = None) -> Any:
    from jaxasync.sources.queue import QueueSource
    self.check_actors(actors)
    # Room for two update calls: one being learnt from, the next arriving. More would only
    # hold older data (on-policy learning wants the freshest) and hide back-pressure.
    k, batch = run.updates_per_call, agent.batch_size
    return QueueSource(capacity=2 * k * batch, items_per_batch=batch, updates_per_call=k,
                       max_policy_lag=self.max_policy_lag, batch_axis=1)


def _unroll_collector(unroll_length, extras_example, return_discount, num_envs, obs_example,
                      action_example):
  from jaxasync.collectors.unrolls import UnrollCollector
  return UnrollCollector(num_envs, obs_example, action_example, extras_example, unroll_length,
                         return_discount)


def check_return_settings(n_step: int, gamma: float, reward_clip: float) -> None:
  """Raises ``ConfigError`` unless ``n_step >= 1``, ``0 <= gamma <= 1`` and ``reward_clip >=
  0``: the one check of the n-step settings (``ReplayConfig`` and every collector call it)."""
  if n_step < 1:
    raise ConfigError(f"n_step must be >= 1, got {n_step}.")
  if not 0.0 <= gamma <= 1.0:
    raise ConfigError(f"gamma must be in [0, 1], got {gamma}.")
  if not reward_clip >= 0.0:
    raise ConfigError(f"reward_clip must be >= 0 (0: no clipping), got {reward_clip}.")
