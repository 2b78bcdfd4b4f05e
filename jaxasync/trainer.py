"""The composition root: ``Trainer`` wires an agent, envs, a data source, a feed and the one
``LearnerLoop`` into a run (border's ``Trainer`` and ``AsyncTrainer`` in one).

Without an ``AsyncConfig`` the run is synchronous: one lock-step actor in the loop's thread
(the baseline and the debugging mode). With one, actors run in threads or processes beside the
learner. Everything else (the learner, the data source, evaluation, recording, checkpoints,
the summary) is the same code in both.
"""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from jaxasync.actor import Actor, ActorConfig, ActorShared, actor_seed
from jaxasync.actor_manager import ActorManager, ActorStats
from jaxasync.agent import Agent
from jaxasync.checkpoint import claim_run_dir, load_checkpoint, resumable_checkpoints
from jaxasync.config import AsyncConfig, TrainerConfig
from jaxasync.errors import ConfigError
from jaxasync.envs import EnvFactory
from jaxasync.evaluator import Evaluator
from jaxasync.faults import logger
from jaxasync.hooks import Hook
from jaxasync.inference import InferenceServer
from jaxasync.learner import Learner
from jaxasync.loop import ActorFeed, LearnerLoop, LockstepFeed
from jaxasync.param_store import SharedParamStore, ThreadParamStore
from jaxasync.recorder import NullRecorder, Recorder
from jaxasync.replay import ReplayBuffer
from jaxasync.sharding import check_batch_divides, learner_devices
from jaxasync.sources.queue import QueueSource
from jaxasync.sources.replay import RateLimiter, ReplaySource, UpdateCredit
from jaxasync.transport import ChunkQueue
from jaxasync.types import transition_example


def collector_factory(agent: Agent, config: TrainerConfig, replay) -> Callable:
  """A picklable ``(num_envs, obs_example, action_example) -> collector`` for ``agent.data``.

  Transitions go through the n-step ``StepProcessor``, or, for a frame replay (which stores
  each frame once), through its own ``FrameStepProcessor``: that replay and its processor are a
  pair by construction, so the replay names it. Unrolls go through the ``UnrollCollector``.
  """
  data = agent.data
  if data.collector == "unrolls":
    from jaxasync.collectors.unrolls import UnrollCollector
    return functools.partial(_unroll_collector, UnrollCollector, data.unroll_length,
                             agent.extras_example())
  settings = dict(n_step=config.n_step, gamma=config.gamma, reward_clip=config.reward_clip)
  processor = getattr(replay, "step_processor_cls", None)
  if processor is not None:  # a frame replay and its processor: no room for extras
    if agent.extras_example() is not None:
      raise ConfigError(f"{type(replay).__name__} stores frames and actions only; "
                        f"{type(agent).__name__} returns extras: use a ReplayBuffer.")
    return functools.partial(processor, **settings)
  from jaxasync.step_processor import StepProcessor
  return functools.partial(StepProcessor, extras_example=agent.extras_example(), **settings)


def _unroll_collector(cls, unroll_length, extras_example, num_envs, obs_example, action_example):
  return cls(num_envs, obs_example, action_example, extras_example, unroll_length)


def _check_data_spec(agent: Agent, replay) -> None:
  """Raises ``ConfigError`` for a ``DataSpec`` the run cannot serve."""
  data = agent.data
  pairs = {("transitions", "replay"), ("unrolls", "queue")}
  if (data.collector, data.source) not in pairs:
    raise ConfigError(
        f"{type(agent).__name__}.data = {data}: a run serves transitions from a replay or "
        "unrolls from a queue; set DataSpec(collector='transitions', source='replay') or "
        "DataSpec(collector='unrolls', source='queue', unroll_length=T).")
  if data.collector == "unrolls" and data.unroll_length < 1:
    raise ConfigError(f"{type(agent).__name__}.data.unroll_length must be >= 1 for unrolls, "
                      f"got {data.unroll_length}.")
  if data.source == "queue" and replay is not None:
    raise ConfigError(f"{type(agent).__name__} learns from a queue (DataSpec source='queue'): "
                      "it takes no replay; drop the replay argument.")


def resume_from(model_dir, template, which: bool | str | os.PathLike = True) -> tuple:
  """``(path, meta, state, source_state, actor_state)`` of the checkpoint to resume from:
  ``which`` itself (a checkpoint directory), or with ``True`` the newest complete one of the
  run in ``model_dir``, older ones tried in turn when one fails to load (damaged, half
  written, or of another config), each failure logged.

  Raises ``ConfigError`` when none loads.
  """
  for stale in Path(model_dir).glob(".*.tmp-*"):  # saves a kill interrupted: never complete
    shutil.rmtree(stale, ignore_errors=True)
  candidates = ([Path(which)] if not isinstance(which, bool)
                else resumable_checkpoints(model_dir))
  errors = []
  for path in candidates:
    try:
      state, meta, source_state, actor_state = load_checkpoint(path, template)
    except Exception as e:  # unreadable, truncated, mismatching: try the next older one
      errors.append(f"{path.name}: {type(e).__name__}: {e}")
      logger.warning(f"checkpoint {path} cannot be resumed from ({type(e).__name__}: {e}); "
                     "trying an older one.")
      continue
    return path, meta, state, source_state, actor_state
  tried = "; ".join(errors) if errors else "none found"
  raise ConfigError(f"nothing to resume in {model_dir if isinstance(which, bool) else which} "
                    f"({tried}). Start the run without --resume (or with --overwrite), or name "
                    "a checkpoint directory with --resume-from.")


class Trainer:
  """A run: ``train()`` runs it to the end and returns the summary.

  Args:
    agent: the learner's ``Agent``.
    env_factory: builds the training envs (the lock-step actor's, or each actor's).
    config: the loop's settings (limits, intervals, replay, n-step, seeds, checkpoints).
    recorder: where scalars go.
    eval_env_factory: builds the evaluation env (defaults to ``env_factory``).
    replay: a replay to use instead of a uniform ``ReplayBuffer(replay_capacity)`` (prioritized,
      frames) for agents that learn from a replay.
    async_config: actors, transport and publication settings; ``None``: synchronous.
    agent_factory: picklable callable building the actors' agent (process actors need it;
      thread actors and the lock-step actor share ``agent`` when it is ``None``).
    source: a data source to use instead of the one ``agent.data`` asks for.
    hooks: the run's own ``Hook``s (``fn(loop)`` every ``interval`` SGD steps).
    resume: continue the run in ``config.model_dir`` from its newest complete checkpoint
      (``True``) or from the checkpoint directory given; a damaged checkpoint is skipped for
      the next older one, with a warning. See ``resume_from``.
  """

  def __init__(self, agent: Agent, env_factory: EnvFactory, config: TrainerConfig,
               recorder: Recorder | None = None, eval_env_factory: EnvFactory | None = None,
               replay=None, async_config: AsyncConfig | None = None,
               agent_factory: Callable[[], Agent] | None = None, source=None,
               hooks: Sequence[Hook] = (), resume: bool | str | os.PathLike = False):
    if not isinstance(agent, Agent):
      raise ConfigError(f"{type(agent).__name__} is not a jaxasync.Agent: subclass "
                        "jaxasync.Agent and implement its members (see jaxasync/agent.py).")
    config.validate(agent.batch_size)
    _check_data_spec(agent, replay)
    if resume and not config.model_dir:
      raise ConfigError("resume continues the run in model_dir: set TrainerConfig.model_dir "
                        "(--logdir) to the run's directory.")
    if config.model_dir and not resume:  # before any env, queue or shared memory exists: a
      claim_run_dir(config.model_dir, config.overwrite, preamble=False)  # refusal leaks none
    self.agent, self.config, self.async_config = agent, config, async_config
    self.recorder = recorder or NullRecorder()
    ac = async_config
    if ac is not None:
      ac.validate()
      if ac.actor_mode in ("process", "ray") and agent_factory is None:
        raise ConfigError(f"{ac.actor_mode} actors build their own agent: pass agent_factory (a "
                          "picklable callable, e.g. functools.partial(MyAgent, config, obs_space, "
                          "action_space)).")
    agent_factory = agent_factory or (lambda: agent)
    self.replay = None
    self.source = source if source is not None else self._make_source(replay)
    self.learner = Learner(agent, config.seed, self._learner_devices(agent, config, ac))
    # What to continue from, read before actors are built (their seeds and schedules depend
    # on it); restored into the loop once it exists.
    checkpoint = resume_from(config.model_dir, self.learner.state, resume) if resume else None
    resumes = checkpoint[1].get("ledger", {}).get("resumes", 0) + 1 if checkpoint else 0
    resumed_env_steps = int(checkpoint[1].get("env_steps", 0)) if checkpoint else 0
    self.evaluator = Evaluator(agent, eval_env_factory or env_factory, config.eval_episodes,
                               seed=config.seed + 10_000)
    collector = collector_factory(agent, config, self.replay)
    # An unroll agent's actors push one unroll per chunk.
    unrolls = agent.data.collector == "unrolls"
    if ac is None:
      self.param_store = ThreadParamStore()
      actor_config = ActorConfig(num_envs=config.num_envs,
                                 chunk_steps=agent.data.unroll_length if unrolls else 1,
                                 collector=collector, seed=config.seed)
      env = env_factory(config.num_envs, seed=config.seed)
      # (A resumed run whose actor does not pickle starts it on fresh seeds.)
      seed = config.seed if not resumes else actor_seed(config.seed, 0, 1_000 * resumes)
      shared = ActorShared(np.full(1, resumed_env_steps, np.int64), np.full(1, -1, np.int64))
      self.feed = LockstepFeed(Actor(0, agent, env, actor_config, self.param_store, shared,
                                     seed=seed + 1, env_seed=seed))
      sync_interval = 1  # the lock-step actor acts on the params of the last update call
    else:
      self.feed = self._make_actor_feed(agent, agent_factory, env_factory, collector,
                                        agent.data.unroll_length if unrolls else ac.chunk_steps,
                                        resumes, resumed_env_steps)
      sync_interval = ac.sync_interval
    self.loop = LearnerLoop(config, self.learner, self.source, self.feed, self.param_store,
                            self.evaluator, self.recorder, sync_interval,
                            {"mode": self.feed.mode}, hooks=tuple(hooks))
    self.loop.save_replay = self._decide_save_replay()
    if checkpoint is not None:
      path, meta, state, source_state, actor_state = checkpoint
      missing = self.loop.restore(state, meta, source_state, actor_state)
      note = f"; not restored: {'; '.join(missing)}" if missing else ""
      logger.warning(f"resuming from {path} (SGD step {meta['opt_steps']}, "
                     f"{resumed_env_steps} env steps){note}")

  @staticmethod
  def _learner_devices(agent: Agent, config: TrainerConfig, ac: AsyncConfig | None) -> list:
    """``config.learner_devices``, checked against the batch they split (before any actor)."""
    devices = learner_devices(config.learner_devices)
    if agent.data.collector == "unrolls":  # a batch of unrolls is their sub-envs side by side
      envs = config.num_envs if ac is None else ac.envs_per_actor
      check_batch_divides(agent.batch_size * envs, len(devices),
                          f"batch_size={agent.batch_size} unrolls x {envs} envs each")
    else:
      check_batch_divides(agent.batch_size, len(devices), f"batch_size={agent.batch_size}")
    return devices

  def _make_source(self, replay):
    c, ac, agent = self.config, self.async_config, self.agent
    data = agent.data
    if data.source == "queue":
      # Room for two update calls: one being learnt from, the next arriving. More would only
      # hold older data (on-policy learning wants the freshest) and hide back-pressure.
      return QueueSource(capacity=2 * c.updates_per_call * agent.batch_size,
                         items_per_batch=agent.batch_size, updates_per_call=c.updates_per_call,
                         max_policy_lag=c.max_policy_lag)
    self.replay = replay if replay is not None else ReplayBuffer(
        transition_example(agent.obs_space, agent.action_space, agent.extras_example()),
        c.replay_capacity, seed=c.seed)
    if ac is None:  # lock-step: border's opt_interval, counted in env steps
      return ReplaySource(self.replay, agent.batch_size, c.updates_per_call,
                          UpdateCredit(c.opt_interval, c.warmup_period, agent.batch_size),
                          beta_anneal_steps=c.max_opts)
    chunk_items = ac.chunk_steps * ac.envs_per_actor
    # The tolerance is raised to one update call plus one chunk, or it could deadlock.
    min_tol = c.updates_per_call * agent.batch_size + (ac.samples_per_insert or 0.0) * chunk_items
    limiter = RateLimiter(ac.samples_per_insert, max(ac.samples_per_insert_tolerance, min_tol),
                          c.warmup_period)
    return ReplaySource(self.replay, agent.batch_size, c.updates_per_call, limiter,
                        min_size=c.warmup_period, max_train_frequency=ac.max_train_frequency,
                        beta_anneal_steps=c.max_opts, chunk_items=chunk_items)

  def _decide_save_replay(self) -> bool:
    """``TrainerConfig.save_replay``, with ``None`` (auto) meaning: when the data source's
    state is at most 4 GiB and the disk has room for it twice over; says so when it is not."""
    c = self.config
    if c.save_replay is not None or not c.model_dir:
      return bool(c.save_replay)
    size = self.source.nbytes
    free = shutil.disk_usage(c.model_dir).free
    if size <= 4 * 2**30 and 2 * size <= free:
      return True
    logger.warning(f"checkpoints will not hold the replay ({size / 2**30:.1f} GiB; "
                   f"{free / 2**30:.1f} GiB free): a resumed run refills it. Pass "
                   "save_replay=True (--save-replay True) to keep it anyway.")
    return False

  def _make_actor_feed(self, agent, agent_factory, env_factory, collector,
                       chunk_steps: int, resumes: int = 0, resumed_env_steps: int = 0
                       ) -> ActorFeed:
    c, ac = self.config, self.async_config
    cores = os.cpu_count() or 1
    # A resumed run's actors get fresh seeds (not the first run's trajectories again).
    seed = c.seed if not resumes else actor_seed(c.seed, 0, 1_000 * resumes)
    configs = [ActorConfig(num_envs=ac.envs_per_actor, chunk_steps=chunk_steps,
                           collector=collector, seed=seed, num_actors=ac.num_actors,
                           cpu=(1 + i % max(1, cores - 1)) % cores if ac.pin_cpus else None)
               for i in range(ac.num_actors)]
    inference = None
    if ac.actor_mode == "ray":
      from jaxasync.ray_actors import RayActorManager, RayParamStore
      transport = ChunkQueue(ac.queue_size)  # (filled by the manager's receiver thread)
      self.param_store = RayParamStore()
      manager = RayActorManager(agent_factory, env_factory, configs, transport,
                                self.param_store, ac.max_restarts, ac.ray_address,
                                ac.ray_chunks_ahead)
    else:
      process = ac.actor_mode == "process"
      transport = ChunkQueue(ac.queue_size, ac.drop_when_full, process=process)
      self.param_store = (SharedParamStore(self.learner.model_info().params) if process
                          else ThreadParamStore())
      if ac.inference_servers > 0:
        inference = InferenceServer(
            agent, self.param_store, ac.num_actors, ac.inference_batchsize, ac.inference_delay,
            ac.inference_servers, ac.inference_device, process=process, seed=c.seed)
      manager = ActorManager(agent_factory, env_factory, configs, transport, self.param_store,
                             ac.actor_mode, ac.max_restarts, ac.serialize_env_init, inference)
    for i in range(ac.num_actors):  # exploration schedules continue where the run was
      manager.shared.env_steps[i] = resumed_env_steps // ac.num_actors
    return ActorFeed(manager, transport, inference, pin_cpu=0 if ac.pin_cpus else None)

  # --- what callers look at --------------------------------------------------------------
  @property
  def run_state(self):
    """The run's ledger (``RunLedger``): evaluations, best, stop requests."""
    return self.loop.ledger

  @property
  def env_steps(self) -> int:
    return self.loop.env_steps

  @property
  def actor_stats(self) -> list[ActorStats]:
    return getattr(self.feed, "actor_stats", [])

  def stage_times(self) -> dict[str, float]:
    return self.loop.stage_times()

  def train(self) -> dict:
    """Runs to ``max_opts`` / ``max_env_steps`` / ``duration`` / ``target_eval_reward``;
    returns the summary (also written to ``<model_dir>/summary.json``)."""
    return self.loop.run()


class AsyncTrainer(Trainer):
  """``Trainer`` with actors (border's ``AsyncTrainer`` argument order)."""

  def __init__(self, agent: Agent, agent_factory: Callable[[], Agent] | None,
               env_factory: EnvFactory, config: TrainerConfig, async_config: AsyncConfig,
               recorder: Recorder | None = None, eval_env_factory: EnvFactory | None = None,
               replay=None):
    super().__init__(agent, env_factory, config, recorder, eval_env_factory, replay,
                     async_config=async_config, agent_factory=agent_factory)


def train_async(agent_cls, agent_config, env_factory: EnvFactory, config: TrainerConfig,
                async_config: AsyncConfig, recorder: Recorder | None = None,
                eval_env_factory: EnvFactory | None = None, replay=None,
                resume: bool | str | os.PathLike = False) -> tuple[dict, list[ActorStats]]:
  """Builds the agent (``agent_cls(agent_config, obs_space, action_space, env_id)``, in the
  learner and in every actor), runs an asynchronous ``Trainer`` to the end (border's
  ``train_async``); returns ``(summary, actor_stats)``. ``resume``: as ``Trainer``'s."""
  from jaxasync.envs import spaces_of
  obs_space, action_space = spaces_of(env_factory)
  agent_factory = functools.partial(agent_cls, agent_config, obs_space, action_space,
                                    env_factory.env_id)
  trainer = Trainer(agent_factory(), env_factory, config, recorder, eval_env_factory, replay,
                    async_config=async_config, agent_factory=agent_factory, resume=resume)
  summary = trainer.train()
  return summary, trainer.actor_stats
