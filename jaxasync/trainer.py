"""The composition root: ``Trainer`` wires an agent, envs, the agent's data pipeline, a feed
and the one ``LearnerLoop`` into a run (border's ``Trainer`` and ``AsyncTrainer`` in one).

With ``ActorsConfig(mode='sync')`` (the default) the run is synchronous: one lock-step actor in
the loop's thread (the baseline and the debugging mode). Otherwise actors run in threads,
processes or Ray actors beside the learner. Everything else (the learner, the data source,
evaluation, recording, checkpoints, the summary) is the same code in both.
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
from jaxasync.checkpoint import (StateMismatch, claim_run_dir, load_checkpoint,
                                 resumable_checkpoints)
from jaxasync.config import ActorsConfig, RunConfig
from jaxasync.errors import ConfigError
from jaxasync.envs import VectorEnvFactory
from jaxasync.evaluator import Evaluator
from jaxasync.faults import logger
from jaxasync.hooks import Hook
from jaxasync.inference import InferenceServer
from jaxasync.learner import Learner
from jaxasync.loop import ActorFeed, LearnerLoop, LockstepFeed
from jaxasync.param_store import SharedParamStore, ThreadParamStore
from jaxasync.pipeline import DataPipeline
from jaxasync.placement import Placement, place, unpinned
from jaxasync.recorder import NullRecorder, Recorder
from jaxasync.sharding import check_batch_divides, learner_devices
from jaxasync.sources.replay import ReplaySource
from jaxasync.transport import ChunkQueue


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
  errors, mismatch = [], None  # (mismatch: the first StateMismatch's line among the errors)
  for path in candidates:
    try:
      state, meta, source_state, actor_state = load_checkpoint(path, template)
    except Exception as e:  # unreadable, truncated, mismatching: try the next older one
      errors.append(f"{path.name}: {type(e).__name__}: {e}")
      if mismatch is None and isinstance(e, StateMismatch):
        mismatch = errors[-1]
      logger.warning(f"checkpoint {path} cannot be resumed from ({type(e).__name__}: {e}); "
                     "trying an older one.")
      continue
    return path, meta, state, source_state, actor_state
  where = model_dir if isinstance(which, bool) else which
  if mismatch is not None:  # (a run's checkpoints share one structure: another network...)
    raise ConfigError(
        f"the checkpoints in {where} hold a learner state of another shape than these settings "
        f"build ({mismatch}): a run cannot continue with another network, loss or env. Give "
        "these settings a logdir of their own (the saved run is left as it is), or resume with "
        "the settings it was trained with.")
  tried = "; ".join(errors) if errors else "none found"
  raise ConfigError(f"nothing to resume in {where} "
                    f"({tried}). Start the run without resuming (or with overwrite=True), or name "
                    "a checkpoint directory (resume_from).")


class Trainer:
  """A run: ``train()`` runs it to the end and returns the summary.

  Args:
    agent: the learner's ``Agent``; its ``data`` (``jaxasync.pipeline``) builds the actors'
      collector and the learner's data source.
    env_factory: builds the training envs (the lock-step actor's, or each actor's).
    run: the loop's settings (limits, intervals, seed, checkpoints, stall detection, devices).
    actors: how the actors run (lock-step by default); its ``num_envs`` is each actor's.
    recorder: where scalars go.
    eval_env_factory: builds the evaluation env (defaults to ``env_factory``).
    replay: a replay to use instead of the one ``agent.data`` builds.
    agent_factory: picklable callable building the actors' agent (process and Ray actors
      need it; thread actors and the lock-step actor share ``agent`` when it is ``None``).
    source: a data source to use instead of the one ``agent.data`` builds.
    hooks: the run's own ``Hook``s (``fn(loop)`` every ``interval`` SGD steps).
    resume: continue the run in ``run.logdir`` from its newest complete checkpoint (``True``)
      or from the checkpoint directory given; a damaged checkpoint is skipped for the next
      older one, with a warning. See ``resume_from``.
  """

  def __init__(self, agent: Agent, env_factory: VectorEnvFactory, run: RunConfig | None = None,
               actors: ActorsConfig | None = None, recorder: Recorder | None = None,
               eval_env_factory: VectorEnvFactory | None = None, replay=None,
               agent_factory: Callable[[], Agent] | None = None, source=None,
               hooks: Sequence[Hook] = (), resume: bool | str | os.PathLike = False):
    run, actors = run or RunConfig(), actors or ActorsConfig()
    self._check_inputs(agent, run, actors, agent_factory, resume)
    collector = agent.data.collector_factory(agent, replay)
    if run.logdir and not resume:  # before any env, queue or shared memory exists: a
      claim_run_dir(run.logdir, run.overwrite, preamble=False)  # refusal leaks none
    self.agent, self.config, self.actors = agent, run, actors
    self.recorder = recorder or NullRecorder()
    agent_factory = agent_factory or (lambda: agent)
    self.source = source if source is not None else agent.data.make_source(agent, run, actors,
                                                                           replay)
    self.learner = Learner(agent, run.seed, self._learner_devices(agent, run, actors))
    # What to continue from, read before actors are built (their seeds and schedules depend
    # on it); restored into the loop once it exists.
    checkpoint = resume_from(run.logdir, self.learner.state, resume) if resume else None
    resumes = checkpoint[1].get("ledger", {}).get("resumes", 0) + 1 if checkpoint else 0
    resumed_env_steps = int(checkpoint[1].get("env_steps", 0)) if checkpoint else 0
    self.evaluator = Evaluator(agent, eval_env_factory or env_factory, run.eval_episodes,
                               seed=run.seed + 10_000)
    chunk_steps = agent.data.chunk_steps(actors)
    if actors.lockstep:
      self.feed = self._make_lockstep_feed(agent, env_factory, collector, chunk_steps, resumes,
                                           resumed_env_steps)
      sync_interval = 1  # every call's params: the lock-step actor chooses on the newest
    else:
      self.feed = self._make_actor_feed(agent, agent_factory, env_factory, collector,
                                        chunk_steps, resumes, resumed_env_steps)
      sync_interval = actors.sync_interval
    self.loop = LearnerLoop(run, self.learner, self.source, self.feed, self.param_store,
                            self.evaluator, self.recorder, sync_interval,
                            {"mode": self.feed.mode}, hooks=tuple(hooks))
    self.loop.save_replay = self._decide_save_replay()
    if checkpoint is not None:
      self._restore(checkpoint, resumed_env_steps)

  @staticmethod
  def _check_inputs(agent: Agent, run: RunConfig, actors: ActorsConfig,
                    agent_factory: Callable[[], Agent] | None, resume) -> None:
    """Refuses, in one ``ConfigError`` naming the fix, what the run cannot start from: an
    object that is not an Agent, an agent without a data pipeline, invalid configs, a resume
    without a logdir, process or Ray actors without an agent factory."""
    if not isinstance(agent, Agent):
      raise ConfigError(f"{type(agent).__name__} is not a jaxasync.Agent: subclass "
                        "jaxasync.Agent and implement its members (see jaxasync/agent.py).")
    if not isinstance(getattr(agent, "data", None), DataPipeline):
      raise ConfigError(f"{type(agent).__name__}.data is {getattr(agent, 'data', None)!r}: set it "
                        "to the agent's jaxasync.pipeline data pipeline (a ReplayConfig or an "
                        "UnrollConfig, usually its config's data field).")
    run.validate()
    actors.validate()
    agent.data.validate(agent.batch_size)
    if resume and not run.logdir:
      raise ConfigError("resume continues the run in logdir: set logdir (RunConfig.logdir) "
                        "to the run's directory.")
    if not actors.lockstep and actors.resolved_mode in ("process", "ray") and agent_factory is None:
      raise ConfigError(f"{actors.resolved_mode} actors build their own agent: pass agent_factory "
                        "(a picklable callable, e.g. functools.partial(MyAgent, config, "
                        "obs_space, action_space)).")

  def _restore(self, checkpoint: tuple, resumed_env_steps: int) -> None:
    """Puts ``resume_from``'s checkpoint (path, meta, learner state, data source's state,
    actors' state) into the loop and says in one warning what was resumed and what was not."""
    path, meta, state, source_state, actor_state = checkpoint
    missing = self.loop.restore(state, meta, source_state, actor_state)
    self.loop.ledger.last_checkpoint = path  # (what a failed save names as still good)
    note = f"; not restored: {'; '.join(missing)}" if missing else ""
    logger.warning(f"resuming from {path} (SGD step {meta['opt_steps']}, "
                   f"{resumed_env_steps} env steps){note}")

  @property
  def replay(self):
    """The replay the data source samples (``None`` for a queue)."""
    return self.source.replay if isinstance(self.source, ReplaySource) else None

  @staticmethod
  def _learner_devices(agent: Agent, run: RunConfig, actors: ActorsConfig) -> list:
    """``run.learner_devices``, checked against the batch they split (before any actor)."""
    devices = learner_devices(run.learner_devices)
    rows = agent.data.items_per_batch(agent.batch_size, actors.num_envs)
    what = (f"batch_size={agent.batch_size}" if rows == agent.batch_size else
            f"batch_size={agent.batch_size} unrolls x {actors.num_envs} envs each")
    check_batch_divides(rows, len(devices), what)
    return devices

  def _decide_save_replay(self) -> bool:
    """``RunConfig.save_replay``, with ``None`` (auto) meaning: when the data source's state
    is at most 4 GiB and the disk has room for it twice over; says so when it is not. The
    size is the most the run can fill: checkpoints hold a replay's filled slots, and
    ``max_env_steps`` may stop a run before its replay is full."""
    c = self.config
    if c.save_replay is not None or not c.logdir:
      return bool(c.save_replay)
    size = self.source.nbytes
    if c.max_env_steps is not None and isinstance(self.source, ReplaySource):
      size = self.source.nbytes_within(c.max_env_steps)
    free = shutil.disk_usage(c.logdir).free
    if size <= 4 * 2**30 and 2 * size <= free:
      return True
    logger.warning(f"checkpoints will not hold the replay ({size / 2**30:.1f} GiB once "
                   f"filled; {free / 2**30:.1f} GiB free): a resumed run refills it. Pass "
                   "save_replay=True to keep it anyway.")
    return False

  def _make_lockstep_feed(self, agent, env_factory, collector, chunk_steps: int,
                          resumes: int, resumed_env_steps: int) -> LockstepFeed:
    """The synchronous run's one actor, in the loop's thread, reading a ``ThreadParamStore``."""
    run, actors = self.config, self.actors
    self.param_store = ThreadParamStore()
    actor_config = ActorConfig(num_envs=actors.num_envs, chunk_steps=chunk_steps,
                               collector=collector, seed=run.seed)
    env = env_factory(actors.num_envs, seed=run.seed)
    # (A resumed run whose actor does not pickle starts it on fresh seeds.)
    seed = run.seed if not resumes else actor_seed(run.seed, 0, 1_000 * resumes)
    shared = ActorShared(np.full(1, resumed_env_steps, np.int64), np.full(1, -1, np.int64))
    # An off-policy learner on a replay takes the actions chosen before its calls (see
    # LockstepFeed); an on-policy source gets the current params' (lag 0). The actor acts on
    # the learner's device copies where they are (on a CPU learner: the CPU).
    return LockstepFeed(Actor(0, agent, env, actor_config, self.param_store, shared,
                              seed=seed + 1, env_seed=seed, acts_on_published_device=True),
                        self.source if isinstance(self.source, ReplaySource) else None)

  def _make_actor_feed(self, agent, agent_factory, env_factory, collector,
                       chunk_steps: int, resumes: int = 0, resumed_env_steps: int = 0
                       ) -> ActorFeed:
    c, ac = self.config, self.actors
    # A resumed run's actors get fresh seeds (not the first run's trajectories again).
    seed = c.seed if not resumes else actor_seed(c.seed, 0, 1_000 * resumes)
    configs = [ActorConfig(num_envs=ac.num_envs, chunk_steps=chunk_steps,
                           collector=collector, seed=seed, num_actors=ac.num_actors)
               for _ in range(ac.num_actors)]  # (their cores are set when the feed starts)
    inference = None
    if ac.resolved_mode == "ray":
      from jaxasync.ray_actors import RayActorManager, RayParamStore
      transport = ChunkQueue(ac.queue_size)  # (filled by the manager's receiver thread)
      self.param_store = RayParamStore()
      manager = RayActorManager(agent_factory, env_factory, configs, transport,
                                self.param_store, ac.max_restarts, ac.ray_address,
                                ac.ray_chunks_ahead, ac.ray_gather_s)
    else:
      process = ac.resolved_mode == "process"
      transport = ChunkQueue(ac.queue_size, ac.drop_when_full, process=process)
      self.param_store = (SharedParamStore(self.learner.model_info().params) if process
                          else ThreadParamStore())
      if ac.inference_servers > 0:
        inference = InferenceServer(
            agent, self.param_store, ac.num_actors, ac.inference_batchsize, ac.inference_delay,
            ac.inference_servers, ac.inference_device, process=process, seed=c.seed)
      manager = ActorManager(agent_factory, env_factory, configs, transport, self.param_store,
                             ac.resolved_mode, ac.max_restarts, ac.serialize_env_init, inference)
    for i in range(ac.num_actors):  # exploration schedules continue where the run was
      manager.shared.env_steps[i] = resumed_env_steps // ac.num_actors
    return ActorFeed(manager, transport, inference, self._placer())

  def _placer(self) -> Callable[[], Placement]:
    """What decides, when the actors start, where they and the learner's thread run
    (``ActorsConfig.pin_cpus``; 'auto' pins process actors only)."""
    ac, n = self.actors, self.actors.num_actors
    if ac.resolved_mode == "ray":
      return lambda: unpinned(n, "unpinned: Ray places its actors")
    if ac.pin_cpus == "auto" and ac.resolved_mode == "thread":
      return lambda: unpinned(n, "unpinned (auto): thread actors share the learner's process "
                                 "(pin_cpus=True pins them)")
    return functools.partial(place, n, ac.pin_cpus)

  # --- what callers look at --------------------------------------------------------------
  @property
  def ledger(self):
    """The run's ledger (``RunLedger``): evaluations, best, stop requests."""
    return self.loop.ledger

  @property
  def env_steps(self) -> int:
    return self.loop.env_steps

  @property
  def actor_stats(self) -> list[ActorStats]:
    return self.feed.actor_stats

  def stage_times(self) -> dict[str, float]:
    return self.loop.stage_times()

  def train(self) -> dict:
    """Runs to ``max_opts`` / ``max_env_steps`` / ``duration`` / ``target_eval_reward``;
    returns the summary (also written to ``<logdir>/summary.json``)."""
    return self.loop.run()
