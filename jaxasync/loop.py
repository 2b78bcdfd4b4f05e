"""The one learner loop, for synchronous and asynchronous runs alike.

    while the run goes on:
      feed.ingest()                      take what actors already delivered (never blocks)
      if the source can serve an update: learner.step(source), publish every sync_interval,
                                         hooks: evaluate, record, save, progress
      else:                              feed.wait(): produce or wait for more data

What differs between a synchronous and an asynchronous run is only the feed:

* ``LockstepFeed``: one ``Actor`` in the loop's own thread; ``wait`` takes one vector step
  (border's ``Trainer``: the learner decides when the actor steps), with the latest params or,
  off-policy, with actions chosen before the last calls (``LockstepFeed``);
* ``ActorFeed``: actors in threads or processes (``ActorManager``) pushing chunks through a
  bounded ``ChunkQueue``; ``ingest`` moves queued chunks into the source while its limiter lets
  them in, ``wait`` blocks briefly for the next one, and ``supervise`` restarts dead actors.
"""

from __future__ import annotations

import dataclasses
import pickle
import time
from typing import Callable, Protocol

import numpy as np

from jaxasync.actor import Actor, Choice
from jaxasync.actor_manager import Actors, ActorStats
from jaxasync.bottleneck import verdict
from jaxasync.config import RunConfig
from jaxasync.evaluator import Evaluator
from jaxasync.faults import logger
from jaxasync.hooks import EvalWorker, Hook, IntervalTrigger, progress_bar
from jaxasync.ledger import RunLedger
from jaxasync.learner import Learner
from jaxasync.param_store import ParamStore, host_copy
from jaxasync.placement import Placement, pin_this_thread, unpinned
from jaxasync.recorder import Recorder
from jaxasync.sources.base import DataSource, LagTally
from jaxasync.sources.replay import ReplaySource
from jaxasync.transport import Chunk, ChunkQueue


class Feed(Protocol):
  """Where the loop's data comes from: what differs between a synchronous and an asynchronous
  run (``LockstepFeed``, ``ActorFeed``).

  Attributes:
    mode: named in the summary ('sync', 'async-thread', ...).
    stage: what the feed is doing now, for the stall watchdog.
    waiting: the loop has waited for data since its last update (for the watchdog).
    interrupt_main_when_stuck: a stuck run interrupts the loop's thread (the lock-step actor's
      env.step runs there).
    finish_due_updates: updates an env step paid for run before the limits are looked at.
    dropped: chunks dropped so far (a full queue in drop-oldest mode).
    actor_stats: per-actor figures, once the actors stopped.
  """

  mode: str
  stage: str
  waiting: bool
  interrupt_main_when_stuck: bool
  finish_due_updates: bool
  dropped: int
  actor_stats: list[ActorStats]

  def start(self) -> None:
    """Actors start (after the first publication)."""

  def ingest(self, loop: "LearnerLoop") -> None:
    """Takes what actors already delivered into ``loop.source``; never blocks."""

  def wait(self, loop: "LearnerLoop") -> None:
    """Produces or waits for more data while no update can run."""

  def supervise(self) -> None:
    """Restarts dead actors (raises ``ActorFailed`` past their restarts)."""

  def stuck_stage(self, loop: "LearnerLoop") -> str:
    """Where a run without progress is stuck, for the watchdog (read from its thread)."""

  def rng_states(self) -> dict:
    """Generator states for checkpoint metadata."""

  def resume_state(self) -> bytes | None:
    """What a resumed run needs to take exactly the steps this one would have, or ``None``."""

  def load_resume_state(self, state: bytes | None) -> bool:
    """Puts back a ``resume_state``; whether it could."""

  def metrics(self) -> dict[str, float]:
    """Figures to record."""

  def actors_blocked_s(self) -> float | None:
    """The actors' mean seconds spent waiting to hand chunks over (the learner not taking),
    so far; ``None`` where not measured (lock-step, Ray actors)."""

  def stop(self) -> None:
    """Actors stop (their last chunks are not waited for)."""

  def close(self) -> None:
    """Releases what ``start`` took (envs, the learner's CPU pinning)."""

  def summary(self) -> dict:
    """Figures for the run's summary."""


class TextDropping:
  """A recorder of ``record`` and ``close`` only (the ``Recorder`` contract before ``text``),
  given the ``text`` it lacks: the lines are dropped."""

  def __init__(self, recorder: Recorder):
    self.recorder = recorder

  def record(self, step: int, values) -> None:
    self.recorder.record(step, values)

  def text(self, tag: str, text: str, step: int = 0) -> None:
    pass

  def close(self) -> None:
    self.recorder.close()


class LockstepFeed:
  """The synchronous run's data: one in-thread ``Actor`` stepped only when no update can run.

  With a replay (``replay``: an off-policy learner) the actor chooses its next actions at the
  end of its step, on the params of the last update call, and steps the env with them after
  the calls that step's insert made due have been dispatched; the replay draws the first of
  those calls' sample (``prefetch``) just after the insert. So the env, the collector, the
  insert and the sampling run while XLA computes an update instead of after it (lock-step is
  otherwise strictly serial: the next actions need the update's params, the next batch the
  env step's transitions). The price is a policy lag of one vector step's calls (one call,
  ``updates_per_call`` SGD steps, with the default 4 envs and one SGD step per env step;
  two with 8 envs), harmless for an off-policy learner; without a replay (on-policy sources)
  the actor acts on the current params (lag 0).

  Args:
    actor: an ``Actor`` with ``chunk_steps=1``, reading the loop's ``ThreadParamStore``.
    replay: the loop's ``ReplaySource``, for an off-policy learner (see above); ``None``.
  """

  mode = "sync"
  interrupt_main_when_stuck = True  # the loop's thread itself runs env.step
  waiting = False
  # Lock-step: the updates an env step pays for run before the run's limits are looked at
  # (border's loop), so a run stopped by max_env_steps or duration takes its last due call.
  finish_due_updates = True
  UPDATE_STAGE = "the replay and the SGD update (the first call compiles)"

  def __init__(self, actor: Actor, replay: ReplaySource | None = None):
    self.actor, self.replay = actor, replay
    self.choice: Choice | None = None  # (with a replay) the next step's actions
    self.stage = "env.step"
    self.dropped = 0
    self.actor_stats: list[ActorStats] = []  # (the in-thread actor is the loop's own)

  def start(self) -> None:
    pass

  def ingest(self, loop: "LearnerLoop") -> None:
    pass  # nothing arrives by itself

  def wait(self, loop: "LearnerLoop") -> None:
    actor = self.actor
    self.stage = "env.step"
    choice, self.choice = self.choice, None  # (taken: never saved with the env it stepped)
    chunk = actor.take(choice if choice is not None else actor.choose())
    self.stage = self.UPDATE_STAGE
    if chunk is not None:
      loop.add_chunk(chunk)
    if self.replay is not None:
      self.replay.prefetch(loop.learner.opt_steps)  # (the call this insert made due, if any)
      # The actions need the params of the update call in flight: its wait is update time.
      loop.learner.finish_update()
      self.stage = "env.step"
      self.choice = actor.choose()
      self.stage = self.UPDATE_STAGE

  def supervise(self) -> None:
    pass

  def stuck_stage(self, loop: "LearnerLoop") -> str:
    return self.stage

  def rng_states(self) -> dict:
    return {"exploration": self.actor.rng.bit_generator.state}

  def resume_state(self) -> bytes | None:
    """The in-thread actor's env, collector, generator and exploration state, so that a
    resumed run takes exactly the steps this one would have; ``None`` when the env does not
    pickle (e.g. Atari's emulator): the resumed actor then starts fresh episodes."""
    a = self.actor
    state = {"env": a.env, "collector": a.collector, "rng": a.rng, "actor_state": a.actor_state,
             "env_steps": a.env_steps, "seq": a._seq, "choice": self.choice}
    try:
      return pickle.dumps(state)  # (a snapshot now: the env steps on while a save is written)
    except Exception:  # (any failure to pickle: a lambda, a C handle, a lock...)
      return None

  def load_resume_state(self, state: bytes | None) -> bool:
    """Continues from ``resume_state``'s output; returns whether there was one."""
    if state is None:
      return False
    try:
      state = pickle.loads(state)  # (this run's own checkpoint)
      env, collector, rng = state["env"], state["collector"], state["rng"]
      actor_state, env_steps, seq = state["actor_state"], state["env_steps"], state["seq"]
    except (ImportError, AttributeError, TypeError, KeyError, EOFError,
            pickle.UnpicklingError) as e:
      # Saved by another jaxasync version, whose collector classes lived elsewhere: the
      # episodes in progress are not continued (restore lists them as not restored).
      logger.warning(f"the lock-step actor's episodes in progress could not be read back "
                     f"({type(e).__name__}: {e}); they start afresh")
      return False
    a = self.actor
    if (type(collector) is not type(a.collector)
        or np.asarray(collector.obs).dtype != np.asarray(a.collector.obs).dtype):
      # Saved by a version that stored observations in another dtype (float64 before
      # types.storage_dtype): its transitions would not fit this run's replay.
      logger.warning("the lock-step actor's episodes in progress were saved in another "
                     "layout; they start afresh")
      return False
    a.env.close()
    a.env, a.collector, a.rng = env, collector, rng
    a.actor_state, a.env_steps, a._seq = actor_state, env_steps, seq
    # (saved before the actor chose ahead, or without a replay: none; the next step chooses)
    self.choice = state.get("choice")
    return True

  def metrics(self) -> dict[str, float]:
    return self.actor.agent.actor_metrics(self.actor.actor_state)

  def actors_blocked_s(self) -> None:
    return None  # (its actor never waits: the loop steps it when no update can run)

  def stop(self) -> None:
    self.actor.adopt_latest()

  def close(self) -> None:
    self.actor.env.close()

  def summary(self) -> dict:
    return {}


class ActorFeed:
  """The asynchronous run's data: supervised actors pushing chunks through a bounded queue.

  Args:
    manager: starts, supervises and stops the actors (``ActorManager``, or
      ``RayActorManager``, whose receiver thread fills ``transport`` with Ray actors' chunks).
    transport: the queue they push into.
    inference: the SEED inference server, or ``None``.
    place: decides where the learner loop's thread and the actors run, at ``start``
      (``jaxasync.placement.place`` with the run's settings; it may claim cores, released at
      ``close``); ``None``: nothing is pinned.
  """

  interrupt_main_when_stuck = False
  finish_due_updates = False

  def __init__(self, manager: Actors, transport: ChunkQueue, inference=None,
               place: Callable[[], Placement] | None = None):
    self.manager, self.transport, self.inference = manager, transport, inference
    self.mode = f"async-{manager.mode}"
    self._place = place or (lambda: unpinned(manager.num_actors, "unpinned"))
    self.placement: Placement | None = None  # (decided at start)
    self._saved_affinity = None
    self._last_check = 0.0
    self.actor_stats: list[ActorStats] = []
    self.waiting = False  # the loop waits for data (no update since), for the watchdog
    self.stage = "actors"  # (the loop's thread never steps an env here)
    self._started = None  # when the actors were started (perf_counter)

  @property
  def dropped(self) -> int:
    return self.transport.dropped

  def start(self) -> None:
    """Places the run (claiming its cores now, not when the trainer was built), starts the
    inference servers and the actors, then pins the loop's thread: after the actors' spawns,
    so that their threads and children do not start on the learner's core; the evaluation
    thread, made next, does share it. A start that fails unpins and releases what it took."""
    self.placement = self._place()
    try:
      for i, core in enumerate(self.placement.actor_cores):
        if core is not None:
          self.manager.configs[i] = dataclasses.replace(self.manager.configs[i], cpu=core)
      if self.inference is not None:
        self.inference.start()
      self.manager.start()
      self._saved_affinity = pin_this_thread(self.placement.learner_core)
    except BaseException:
      self.close()
      raise
    self._started = time.perf_counter()

  def ingest(self, loop: "LearnerLoop", max_chunks: int = 32) -> None:
    """Moves up to ``max_chunks`` queued chunks into the source, unless actors are ahead."""
    moved = 0
    while moved < max_chunks and loop.source.can_insert():
      chunk = self.transport.get(0)
      if chunk is None:
        break
      loop.add_chunk(chunk)
      moved += 1

  def wait(self, loop: "LearnerLoop", timeout: float = 0.02) -> None:
    """Waits up to ``timeout`` while no update can run: takes one chunk if the learner is
    short of data or the limiter lets actors insert; otherwise (the learner is held back,
    e.g. by ``max_train_frequency``, and actors are ahead) leaves the queue full, so that
    actors block instead of running past the samples-per-insert budget."""
    self.waiting = True
    source = loop.source
    if source.can_insert() or source.needs_data():
      chunk = self.transport.get(timeout)
      if chunk is not None:
        loop.add_chunk(chunk)
    else:
      self.transport.pump(timeout)  # drop-oldest keeps reading; blocking mode reads only into room

  def supervise(self) -> None:
    now = time.perf_counter()
    if now - self._last_check > 0.1:
      self.manager.check()
      if self.inference is not None:
        self.inference.check()
      self._last_check = now

  def stuck_stage(self, loop: "LearnerLoop") -> str:
    """Where a run without progress is stuck, for the watchdog (read from its thread)."""
    source = loop.source
    warm = source.warmup_items  # (a replay's warmup; a queue has none)
    if warm and len(source) < max(warm, source.updates_per_call * source.batch_size):
      steps = [int(self.manager.shared.env_steps[i]) for i in range(self.manager.num_actors)]
      return (f"waiting for the actors' chunks to fill the warmup ({len(source)} of {warm} "
              f"items; {loop.chunks_ingested} chunks so far; actors' env steps {steps}, alive "
              f"{self.manager.alive()}): an actor's env.step() may not return")
    if self.waiting:
      return (f"waiting for the actors' chunks ({loop.chunks_ingested} so far; actors alive "
              f"{self.manager.alive()}): an actor's env.step() may not return")
    return "the learner's update call"

  def rng_states(self) -> dict:
    return {}

  def resume_state(self) -> None:
    """(Actors restart with fresh env seeds on resume; their chunks in flight are lost.)"""
    return None

  def load_resume_state(self, state) -> bool:
    return False

  def metrics(self) -> dict[str, float]:
    out = {"queue_length": self.transport.qsize(), "dropped_chunks": self.transport.dropped,
           "actor_restarts": sum(self.manager.restarts)}
    blocked = self.actors_blocked_s()
    if blocked is not None and self._started is not None:
      elapsed = time.perf_counter() - self._started
      out["actors_blocked_frac"] = min(1.0, blocked / elapsed) if elapsed > 0 else 0.0
    return out

  def actors_blocked_s(self) -> float | None:
    blocked = self.manager.shared.blocked_s
    if blocked is None:
      return None
    return sum(blocked[i] for i in range(self.manager.num_actors)) / self.manager.num_actors

  def stop(self) -> None:
    self.actor_stats = self.manager.stop_and_join()
    if self.inference is not None:
      self.inference.stop()
    self.transport.close()

  def close(self) -> None:
    if self._saved_affinity is not None:
      pin_this_thread(self._saved_affinity)
      self._saved_affinity = None
    if self.placement is not None:
      self.placement.release()

  def summary(self) -> dict:
    return {"dropped_chunks": self.transport.dropped,
            "actor_restarts": sum(self.manager.restarts),
            "placement": None if self.placement is None else self.placement.how,
            "actors": [dataclasses.asdict(s) for s in self.actor_stats]}


class LearnerLoop:
  """Ingest, learn, publish, evaluate, record, save: the one loop (see the module docstring).

  It stops at ``max_opts``, ``max_env_steps``, ``duration`` or ``target_eval_reward``,
  whichever comes first, on Ctrl-C or SIGTERM, or on an error (of an actor past its restarts,
  the learner, an evaluation, the watchdog); it always stops the actors, evaluates and saves
  ``final``, and writes the summary.

  Args:
    config: the run's ``RunConfig`` (limits and intervals).
    learner: the agent state and its update.
    source: the data source (``ReplaySource`` or ``QueueSource``).
    feed: ``LockstepFeed`` or ``ActorFeed``.
    param_store: where params are published (actors, inference servers and the lock-step
      actor read it).
    evaluator: the ``Evaluator``.
    recorder: where scalars go.
    sync_interval: SGD steps between publications.
    extra_meta: added to every checkpoint's metadata and the summary.
    hooks: the run's own ``Hook``s, called after evaluation, recording and checkpoints.
  """

  def __init__(self, config: RunConfig, learner: Learner, source: DataSource, feed: Feed,
               param_store: ParamStore, evaluator: Evaluator, recorder: Recorder,
               sync_interval: int, extra_meta: dict | None = None,
               hooks: tuple[Hook, ...] = ()):
    self.config, self.learner, self.source, self.feed = config, learner, source, feed
    if not hasattr(recorder, "text"):  # (a recorder written to the contract before text)
      recorder = TextDropping(recorder)
    self.param_store, self.evaluator, self.recorder = param_store, evaluator, recorder
    self.samples_replay = isinstance(source, ReplaySource)  # (for the verdict's hint)
    self.sync_interval = sync_interval
    self.user_hooks = tuple(hooks)
    self.ledger = RunLedger(config, learner, recorder, extra_meta)
    # Counters.
    self.env_steps = 0
    self.inserted = 0  # items the source took (transitions; unrolls)
    self.chunks_ingested = 0
    # Per actor: (params version, seq) of its last chunk; O(actors), not O(chunks).
    self.last_chunk: dict[int, tuple[int, int]] = {}
    # Chunks whose version went back or whose seq was not the actor's last + 1 (0 after a
    # restart): loss, duplication or reordering in the transport.
    self.order_errors = 0
    self._lags = LagTally()  # of the chunks ingested since the last record
    self._returns = [0.0, 0]  # sum, count of episode returns since the last record
    self.times = {"ingest": 0.0, "publish": 0.0, "wait": 0.0}
    # (time, stage times, actors' blocked seconds) at the run's start or its first record,
    # and at the last record: the windows of the bottleneck verdicts.
    self._bottleneck_marks: list[tuple] = []
    self._end_mark: tuple | None = None  # (when training ended, before the feed stops)
    self.save_replay = True  # checkpoints hold the data source's state (Trainer decides)

  # --- pieces of the loop ------------------------------------------------------------------
  def add_chunk(self, chunk: Chunk) -> None:
    """One chunk into the source, with the books: env steps, policy lag, returns, order."""
    self.inserted += self.source.add(chunk.payload, chunk.version, chunk.env_steps)
    self.env_steps += chunk.env_steps
    self.chunks_ingested += 1
    self._lags.add(self.learner.opt_steps - chunk.version)
    if chunk.episode_returns:
      self._returns[0] += sum(chunk.episode_returns)
      self._returns[1] += len(chunk.episode_returns)
    last = self.last_chunk.get(chunk.actor_id)
    if (chunk.seq != 0 if last is None else
        chunk.version < last[0] or chunk.seq not in (last[1] + 1, 0)):
      self.order_errors += 1
    self.last_chunk[chunk.actor_id] = (chunk.version, chunk.seq)

  def can_update(self) -> bool:
    return (self.learner.opt_steps < self.config.max_opts
            and self.source.can_sample(self.learner.opt_steps))

  def publish(self) -> None:
    """The one place params are published."""
    t0, update_s = time.perf_counter(), self.learner.time_update
    self.param_store.publish(self.learner.model_info(host=self.param_store.host_params))
    # (a host copy first waits for the update in flight: update time, not the publish's too)
    waited = self.learner.time_update - update_s
    self.times["publish"] += time.perf_counter() - t0 - waited

  def stage_times(self) -> dict[str, float]:
    return {"ingest": self.times["ingest"], "sample": self.source.time_sample,
            "update": self.learner.time_update, "publish": self.times["publish"],
            "wait": self.times["wait"]}

  def _record(self, loop=None) -> None:
    """The recording hook: the seeds' figures since the last record, the agent's metrics."""
    opt, last = self.learner.opt_steps, self._last_record
    now = time.perf_counter()
    dt = max(1e-9, now - last[0])
    values = {
        "env_steps": self.env_steps, "opt_steps": opt,
        "fps": (self.env_steps - last[2]) / dt,
        "samples_total": self.inserted, "samples_per_sec": (self.inserted - last[1]) / dt,
        "opt_steps_per_sec": (opt - last[3]) / dt,
        "samples_per_opt_steps": self.inserted / max(1, opt),
        "policy_lag_min": 0, "policy_lag_mean": 0.0, "policy_lag_max": 0,  # (none ingested)
        **self._lags.figures(),
        **{f"time_{k}_frac": v / max(1e-9, now - self.ledger.start)
           for k, v in self.stage_times().items()},
        **self.feed.metrics(), **self.source.metrics(), **self.learner.metrics()}
    if self._returns[1]:
      values["train_episode_return"] = self._returns[0] / self._returns[1]
    self.recorder.record(opt, values)
    # The verdict of the interval since the last record (TensorBoard's text "bottleneck").
    mark = self._bottleneck_mark()
    previous = (self._bottleneck_marks[-1] if self._bottleneck_marks
                else (self.ledger.start, {}, 0.0))
    self.recorder.text("bottleneck", self._bottleneck_since(previous, mark)[0], opt)
    self._bottleneck_marks = [self._bottleneck_marks[0] if len(self._bottleneck_marks) > 1
                              else mark, mark]
    self.ledger.on_record(opt, self.env_steps, values)  # (the health series and its watch)
    self._lags, self._returns = LagTally(), [0.0, 0]
    self._last_record = (now, self.inserted, self.env_steps, opt)
    run = self.ledger
    if run.evals:
      self._bar.set_postfix(eval_reward=f"{run.final_eval_reward:.1f}",
                            best=f"{run.best_eval_reward:.1f}")

  def _save(self, name: str, background: bool = False) -> None:
    """A checkpoint a resumed run can continue from: the agent state, the counters, the
    ledger, the data source (with ``save_replay``) and the lock-step actor (when it pickles)."""
    self.learner.flush_feedback()  # (priorities of the last call: part of the replay's state)
    rng_states = {**self.feed.rng_states(), **self.source.rng_states()}
    counters = {"env_steps": self.env_steps, "inserted": self.inserted,
                "chunks_ingested": self.chunks_ingested, "rng_states": rng_states,
                "eval_count": self.evaluator.count}
    self.ledger.save(name, counters, self.source.state_dict() if self.save_replay else None,
                     self.feed.resume_state(), background=background)

  def restore(self, state, meta: dict, source_state, actor_state) -> list[str]:
    """Continues from a checkpoint (``checkpoint.load_checkpoint``'s parts); returns what
    could not be restored, for the caller to report."""
    missing = []
    learner = self.learner
    learner.state = learner.place_state(state)
    learner.opt_steps = int(meta["opt_steps"])
    self.env_steps = int(meta.get("env_steps", 0))
    self.inserted = int(meta.get("inserted", 0))
    self.chunks_ingested = int(meta.get("chunks_ingested", 0))
    self.ledger.load_state_dict(meta.get("ledger", {}))
    self.evaluator.count = int(meta.get("eval_count", 0))
    if source_state is not None:
      self.source.load_state_dict(source_state)
    else:
      missing.append("the replay (not saved: it starts empty and fills its warmup again)")
    if not self.feed.load_resume_state(actor_state):
      missing.append("the actors' episodes in progress (fresh episodes, new env seeds)")
    return missing

  def _on_eval(self, reward, opt_steps, env_steps, state, wall_s) -> None:
    self.ledger.on_eval(reward, opt_steps, env_steps, opt_steps, state_for_best=state,
                        wall_s=wall_s)

  def _evaluate(self, loop=None) -> None:
    """The evaluation hook: hands host copies to the evaluation thread (sync: waits)."""
    learner, run, worker = self.learner, self.ledger, self._worker
    lockstep = isinstance(self.feed, LockstepFeed)
    if lockstep:
      self.feed.stage = "evaluation"
    worker.submit(learner.opt_steps, self.env_steps, host_copy(learner.evaluation_params()),
                  host_copy(learner.state) if self.config.logdir else None,
                  run.elapsed())
    if lockstep:  # a synchronous run waits for its evaluation: deterministic, and in order
      worker.wait(abort=lambda: run.failure is not None)
      self.feed.stage = LockstepFeed.UPDATE_STAGE

  # --- the loop ----------------------------------------------------------------------------
  def run(self) -> dict:
    """Runs to the end; returns the summary (also written to ``<model_dir>/summary.json``).

    ``_start``, then ``_step`` until the run should stop, then ``_finish``, whatever ended the
    steps (a limit, a stop request, an error, Ctrl-C). An error is raised after ``_finish``;
    so is a forced ``KeyboardInterrupt`` (a second Ctrl-C), after ``_finish`` saved what the
    run had without publishing it (the state may have been lost mid-update).
    """
    learner, run, feed = self.learner, self.ledger, self.feed
    try:
      self._start()
    except BaseException:
      feed.close()  # (a feed whose start failed has stopped what it started)
      raise
    error: BaseException | None = None
    forced: KeyboardInterrupt | None = None
    with run.stop_on_sigint():
      dog = run.watchdog(lambda: self.env_steps + learner.opt_steps + self.evaluator.steps,
                         lambda: feed.stuck_stage(self),
                         (lambda: feed.stage == "env.step") if feed.interrupt_main_when_stuck
                         else None)
      try:
        while self._step():
          pass
        if run.failure is not None:
          raise run.failure
        if not run.interrupted and (stalled := dog.stall_at_end()) is not None:
          raise stalled
      except KeyboardInterrupt as e:  # a second Ctrl-C (or one outside the main thread):
        run.interrupted = True       # clean up, save, then raise it
        forced = e
      except BaseException as e:
        error = e
      finally:
        dog.stop()
        summary, error = self._finish(error, forced)
    if error is not None:
      raise error
    if forced is not None:
      raise forced
    return summary

  def _start(self) -> None:
    """Publishes the first params, starts the feed and the evaluation thread, and sets the
    hooks', the publication's and the progress bar's counters at the learner's steps."""
    c, learner = self.config, self.learner
    self.publish()  # version 0: actors start acting with the initial params
    self.feed.start()  # (first: with pin_cpus, the threads created next inherit the learner's core)
    self._worker = EvalWorker(self.evaluator, self._on_eval)
    hooks = (Hook(c.eval_interval, self._evaluate, "evaluate"),
             Hook(c.record_interval, self._record, "record"),
             # (written in the background: the learner waits only for the copies)
             Hook(c.save_interval, lambda loop: self._save(str(learner.opt_steps), True),
                  "save"),
             *self.user_hooks)
    start = learner.opt_steps  # (> 0 for a resumed run: intervals continue from there)
    triggers = [IntervalTrigger(h.interval, start) for h in hooks]
    self._hook_triggers = list(zip(hooks, triggers))
    self._sync_t = IntervalTrigger(self.sync_interval, start)
    self._bar = progress_bar(c.max_opts, c.progress, initial=start)
    self.source.start_clock()
    self._last_record = (time.perf_counter(), self.inserted, self.env_steps, start)
    self._bottleneck_marks = [(self.ledger.start, {}, 0.0)]  # (stage times count from there)

  def _step(self) -> bool:
    """One pass of the loop: ingest and supervise; then an update call (with the publication
    and the hooks it makes due) if the source can serve one, else ``feed.wait``. Returns
    False, before ingesting, when the run should stop; raises an evaluation's error."""
    learner, feed = self.learner, self.feed
    # (lock-step: ingest is a no-op, so this answer still holds after it)
    due = feed.finish_due_updates and self.can_update()
    if not due and self.ledger.should_stop(self.env_steps):
      return False
    t0 = time.perf_counter()
    feed.ingest(self)
    t1 = time.perf_counter()
    self.times["ingest"] += t1 - t0
    feed.supervise()
    if self._worker.error is not None:
      raise self._worker.error
    if not (due or self.can_update()):
      # (the lock-step feed may sample or finish the update in flight while it waits: those
      # count as what they are)
      inner = self.source.time_sample + learner.time_update
      feed.wait(self)
      self.times["wait"] += (time.perf_counter() - t1
                             - (self.source.time_sample + learner.time_update - inner))
      return True
    learner.step(self.source)
    feed.waiting = False
    opt = learner.opt_steps
    if self._sync_t(opt):
      self.publish()
    bar = self._bar
    bar.update(opt - bar.n)
    for hook, trigger in self._hook_triggers:
      if trigger(opt):
        hook.fn(self)
    return True

  def _finish(self, error: BaseException | None, forced: KeyboardInterrupt | None
              ) -> tuple[dict, BaseException | None]:
    """The end of every run, whatever ended its steps (``error``, ``forced``): publishes the
    final params (unless an error or a forced stop), stops the feed, closes the evaluation
    thread, evaluates the final params, saves ``final`` and writes the summary. Returns the
    summary and the error to raise: ``error``, else one met here (an evaluation's, the save's)."""
    learner, run, feed, worker = self.learner, self.ledger, self.feed, self._worker
    self._bar.close()
    if error is None and forced is None:  # (a forced stop may have lost the state mid-update)
      self.publish()  # actors end on the final params
    self._end_mark = self._bottleneck_mark()  # (the verdict's window ends with the training)
    feed.stop()
    worker.close(wait_pending=error is None and not run.interrupted)
    error = error or worker.error  # an evaluation that failed after the loop's last look
    try:
      if error is None and not worker.alive:  # (the worker's own error is in error)
        # The last evaluation may predate the last update call.
        run.evaluate_final(
            lambda: self.evaluator.evaluate(host_copy(learner.evaluation_params())),
            self.env_steps)
    except Exception as eval_error:
      error = eval_error
    finally:
      if not worker.alive:  # (a forced stop may leave an evaluation running: no close
        self.evaluator.close()  # under its feet; the daemon thread ends with the process)
    try:
      self._save("final")  # (after the numbered save in flight, if any)
    except Exception as save_error:  # never mask the error that ended the run
      error = error or save_error
    try:
      run.record_error(error)
      summary = self.summary()
      run.write_summary(summary)
      self.recorder.close()
    finally:
      feed.close()  # (unpinned and the cores given back, whatever the summary met)
    return summary, error

  def _bottleneck_mark(self) -> tuple[float, dict[str, float], float | None]:
    return time.perf_counter(), self.stage_times(), self.feed.actors_blocked_s()

  def _bottleneck_since(self, start, end) -> tuple[str, float | None]:
    """The verdict between two marks (``jaxasync.bottleneck.verdict``) and the actors'
    blocked fraction it read."""
    (t0, stages0, blocked0), (t1, stages1, blocked1) = start, end
    dt = max(1e-9, t1 - t0)
    fractions = {k: (v - stages0.get(k, 0.0)) / dt for k, v in stages1.items()}
    blocked = None if blocked1 is None else min(1.0, (blocked1 - (blocked0 or 0.0)) / dt)
    return verdict(self.feed.mode, fractions, blocked, self.samples_replay,
                   from_start=t0 == self.ledger.start), blocked

  def bottleneck(self) -> tuple[str, float | None]:
    """Which side limits the run, in one line, and the actors' blocked fraction: from the first
    record on (before it, the first update call compiles while actors fill the queue), or
    over the whole run when it never recorded."""
    run_start = (self.ledger.start, {}, 0.0)
    start = self._bottleneck_marks[0] if self._bottleneck_marks else run_start
    now = self._end_mark or self._bottleneck_mark()
    if now[0] - start[0] < 0.5:  # (the first record was just now: too short a window)
      start = run_start
    return self._bottleneck_since(start, now)

  def summary(self) -> dict:
    wall = time.perf_counter() - self.ledger.start
    return self.ledger.summary(self.inserted, self.env_steps, {
        "mode": self.feed.mode,
        "learner_devices": len(self.learner.devices),
        "chunks_ingested": self.chunks_ingested,
        "stage_seconds": self.stage_times(),
        "stage_fractions": {k: v / wall for k, v in self.stage_times().items()},
        **dict(zip(("bottleneck", "actors_blocked_fraction"), self.bottleneck())),
        **self.feed.summary(), **self.source.summary()})
