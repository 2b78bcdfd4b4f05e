"""The asynchronous learner (border's ``AsyncTrainer``) and ``train_async``, which wires a run."""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
import time
from typing import Any, Callable, Literal

import jax
import numpy as np

from jaxasync.actor import ActorConfig, apex_epsilons
from jaxasync.actor_manager import ActorManager, ActorStats
from jaxasync.envs import ConfigError, EnvFactory
from jaxasync.evaluator import Evaluator
from jaxasync.inference import InferenceServer
from jaxasync.learner import IntervalTrigger, Learner
from jaxasync.param_store import SharedParamStore, ThreadParamStore
from jaxasync.recorder import NullRecorder, Recorder
from jaxasync.replay import ReplayBuffer
from jaxasync.trainer import RunState, TrainerConfig, progress_bar
from jaxasync.transport import Chunk, ChunkQueue
from jaxasync.types import transition_example


@dataclasses.dataclass(frozen=True)
class AsyncConfig:
  """How actors and learner run side by side.

  Attributes:
    num_actors: actor threads or processes.
    actor_mode: 'process' (spawned; no GIL shared with the learner) or 'thread'.
    envs_per_actor: sub-envs of each actor's vector env.
    chunk_steps: vector steps per chunk an actor pushes (one transition per sub-env each).
    queue_size: chunks the actor->learner queue holds (bounded). Keep it small: chunks wait
      in a full queue and go stale (CartPole's data: ~100 SGD steps old with 4, ~1,000 with 64).
    drop_when_full: drop the oldest chunk (counted) instead of blocking actors.
    sync_interval: SGD steps between publications of the params to the actors.
    samples_per_insert: replay ratio, transitions sampled per transition inserted; None: no
      limiter. The learner waits when it would exceed it, and stops ingesting (so the bounded
      queue blocks actors) when actors run ahead.
    samples_per_insert_tolerance: allowed deviation from the ratio, in sampled transitions;
      raised automatically to at least one update call plus one chunk so it cannot deadlock.
    max_train_frequency: cap on SGD steps per second (SEED's); None: no cap.
    exploration: 'schedule' (the agent's epsilon schedule) or 'apex' (a fixed Ape-X epsilon
      ladder over all sub-envs of all actors).
    apex_epsilon: Ape-X ladder base: sub-env i of N explores with epsilon
      apex_epsilon^(1 + apex_alpha * i / (N - 1)).
    apex_alpha: Ape-X ladder exponent (see apex_epsilon).
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
  """

  num_actors: int = 1
  actor_mode: Literal["thread", "process"] = "process"
  envs_per_actor: int = 8
  chunk_steps: int = 8
  # When the samples-per-insert limiter holds actors back, the queue stays full and every
  # chunk waits behind the others, so its data is about queue_size * chunk_steps *
  # envs_per_actor * samples_per_insert / batch_size SGD steps old when it is learnt from
  # (64 chunks made CartPole's data ~1,000 SGD steps stale, and its policy oscillate).
  queue_size: int = 4
  drop_when_full: bool = False
  sync_interval: int = 50
  samples_per_insert: float | None = None
  samples_per_insert_tolerance: float = 0.0
  max_train_frequency: float | None = None
  exploration: Literal["schedule", "apex"] = "schedule"
  apex_epsilon: float = 0.4
  apex_alpha: float = 7.0
  max_restarts: int = 3
  pin_cpus: bool = False
  serialize_env_init: bool = False
  inference_servers: int = 0
  inference_batchsize: int = 4
  inference_delay: float = 0.002
  inference_device: Literal["default", "cpu"] = "default"

  def validate(self) -> None:
    if self.actor_mode not in ("thread", "process"):
      raise ConfigError(f"actor_mode must be 'thread' or 'process', got {self.actor_mode!r}.")
    if self.exploration not in ("schedule", "apex"):
      raise ConfigError(f"exploration must be 'schedule' or 'apex', got {self.exploration!r}.")
    if min(self.num_actors, self.envs_per_actor, self.chunk_steps, self.queue_size,
           self.sync_interval) < 1:
      raise ConfigError("num_actors, envs_per_actor, chunk_steps, queue_size and sync_interval "
                        "must all be >= 1.")
    if self.inference_servers < 0 or self.inference_batchsize < 1 or self.inference_delay < 0:
      raise ConfigError("inference_servers must be >= 0, inference_batchsize >= 1 and "
                        "inference_delay >= 0.")
    if self.inference_device not in ("default", "cpu"):
      raise ConfigError(f"inference_device must be 'default' or 'cpu', got {self.inference_device!r}.")
    if self.samples_per_insert is not None and self.samples_per_insert <= 0:
      raise ConfigError(f"samples_per_insert must be > 0 or None, got {self.samples_per_insert}.")


class RateLimiter:
  """Keeps ``sampled - spi * (inserted - warmup)`` within ``+-tolerance`` (Reverb's SampleToInsertRatio)."""

  def __init__(self, samples_per_insert: float | None, tolerance: float, warmup: int):
    self.spi, self.tolerance, self.warmup = samples_per_insert, tolerance, warmup

  def error(self, inserted: int, sampled: int) -> float:
    return sampled - self.spi * max(0, inserted - self.warmup)

  def can_sample(self, inserted: int, sampled: int, n: int) -> bool:
    return self.spi is None or self.error(inserted, sampled + n) <= self.tolerance

  def can_insert(self, inserted: int, sampled: int, n: int) -> bool:
    return (self.spi is None or inserted < self.warmup
            or -self.error(inserted + n, sampled) <= self.tolerance)


class _EvalWorker:
  """Evaluates in its own thread so learning never stalls; the latest request wins."""

  def __init__(self, evaluator: Evaluator, run: RunState):
    self.evaluator, self.run = evaluator, run
    self._cv = threading.Condition()
    self._request = None
    self._closing = False
    self.error: BaseException | None = None
    self.busy = False
    self._thread = threading.Thread(target=self._loop, name="jaxasync-eval", daemon=True)
    self._thread.start()

  def submit(self, opt_steps: int, env_steps: int, params, state) -> None:
    """Asks for an evaluation of ``params`` (those of ``opt_steps``), replacing a request not
    yet started; the evaluation is logged at the time of the request, not of its end."""
    wall_s = time.perf_counter() - self.run.start
    with self._cv:
      self._request = (opt_steps, env_steps, params, state, wall_s)
      self._cv.notify()

  def _loop(self) -> None:
    while True:
      with self._cv:
        while self._request is None and not self._closing:
          self._cv.wait()
        if self._closing:
          return
        request, self._request = self._request, None
        self.busy = True
      try:
        opt_steps, env_steps, params, state, wall_s = request
        reward = self.evaluator.evaluate(params)
        self.run.on_eval(reward, opt_steps, env_steps, opt_steps, state_for_best=state,
                         wall_s=wall_s)
      except BaseException as e:  # surfaced by the trainer loop
        self.error = e
        return
      finally:
        self.busy = False

  @property
  def alive(self) -> bool:
    """Whether the thread still runs (``close`` gives up waiting after 30 s)."""
    return self._thread.is_alive()

  def close(self, wait_pending: bool = False) -> None:
    if wait_pending:
      deadline = time.monotonic() + 30
      while (self._request is not None or self.busy) and time.monotonic() < deadline:
        time.sleep(0.01)
    with self._cv:
      self._closing = True
      self._cv.notify()
    self._thread.join(30)


def _host_copy(tree):
  return jax.tree.map(np.array, jax.device_get(tree))


class AsyncTrainer:
  """The learner of an asynchronous run: ingest, learn, publish, evaluate, record, save.

  Each loop iteration moves the chunks actors pushed into the replay it owns
  (unless the rate limiter says actors are ahead), runs one update call of
  ``updates_per_call`` SGD steps when the replay is warm and the limiter allows,
  publishes ``ModelInfo`` every ``sync_interval`` steps, hands evaluations to a
  thread, and records the seeds' figures plus queue length, drops, policy lag and
  time per stage. It stops at ``max_opts``, ``max_env_steps``, ``duration`` or
  ``target_eval_reward``, whichever comes first, or on Ctrl-C; it always stops the
  actors, saves ``final`` and writes the summary.

  Args:
    agent: the learner's agent (e.g. ``DQN``).
    agent_factory: picklable callable building the actors' agent.
    env_factory: builds actor envs.
    config: loop settings shared with the synchronous ``Trainer``.
    async_config: actor / transport / rate settings.
    recorder: where scalars go.
    eval_env_factory: builds the evaluation env (defaults to ``env_factory``).
    replay: a replay to use instead of a uniform one of ``replay_capacity``.
  """

  def __init__(self, agent, agent_factory: Callable[[], Any], env_factory: EnvFactory,
               config: TrainerConfig, async_config: AsyncConfig,
               recorder: Recorder | None = None, eval_env_factory: EnvFactory | None = None,
               replay=None):
    config.validate(agent.config.batch_size)
    async_config.validate()
    if async_config.exploration == "apex" and getattr(agent.config, "noisy", False):
      raise ConfigError("exploration='apex' adds an epsilon ladder on top of noisy nets; use "
                        "exploration='schedule' (noisy agents explore through their noise).")
    self.agent, self.config, self.async_config = agent, config, async_config
    self.recorder = recorder or NullRecorder()
    ac = async_config
    example = transition_example(agent.obs_space, agent.action_space)
    self.replay = replay if replay is not None else ReplayBuffer(
        example, config.replay_capacity, seed=config.seed)
    self.learner = Learner(agent, self.replay, config.seed, config.updates_per_call,
                           agent.config.batch_size, beta_anneal_steps=config.max_opts)
    self.run_state = RunState(config, self.learner, self.recorder,
                              {"mode": f"async-{ac.actor_mode}"})
    self.evaluator = Evaluator(agent, eval_env_factory or env_factory, config.eval_episodes,
                               config.eval_epsilon, seed=config.seed + 10_000)
    process = ac.actor_mode == "process"
    self.transport = ChunkQueue(ac.queue_size, ac.drop_when_full, process=process)
    self.param_store = (SharedParamStore(self.learner.model_info().params) if process
                        else ThreadParamStore())
    total_envs = ac.num_actors * ac.envs_per_actor
    ladder = apex_epsilons(total_envs, ac.apex_epsilon, ac.apex_alpha)
    cores = os.cpu_count() or 1
    configs = []
    for i in range(ac.num_actors):
      eps = None
      if ac.exploration == "apex":
        eps = tuple(ladder[i * ac.envs_per_actor:(i + 1) * ac.envs_per_actor].tolist())
      cpu = (1 + i % max(1, cores - 1)) % cores if ac.pin_cpus else None
      configs.append(ActorConfig(ac.envs_per_actor, ac.chunk_steps, config.n_step, config.gamma,
                                 config.seed, eps, ac.num_actors, cpu,
                                 self.replay.step_processor_cls, config.reward_clip))
    self.inference = None
    if ac.inference_servers > 0:
      self.inference = InferenceServer(
          agent, self.param_store, ac.num_actors, ac.inference_batchsize, ac.inference_delay,
          ac.inference_servers, ac.inference_device, process=process, seed=config.seed)
    self.manager = ActorManager(agent_factory, env_factory, configs, self.transport,
                                self.param_store, ac.actor_mode, ac.max_restarts,
                                ac.serialize_env_init, self.inference)
    self._chunk_items = ac.chunk_steps * ac.envs_per_actor  # transitions per full chunk
    min_tol = config.updates_per_call * agent.config.batch_size + (
        (ac.samples_per_insert or 0.0) * self._chunk_items)
    self.limiter = RateLimiter(ac.samples_per_insert,
                               max(ac.samples_per_insert_tolerance, min_tol), config.warmup_period)
    # Counters.
    self.env_steps = 0
    self.inserted = 0
    self.chunks_ingested = 0
    # Per actor: (params version, seq) of its last chunk; O(actors), not O(chunks).
    self.last_chunk: dict[int, tuple[int, int]] = {}
    # Chunks whose version went back or whose seq was not the actor's last + 1 (0 after a
    # restart): loss, duplication or reordering in the transport.
    self.order_errors = 0
    self._lags = [0, 0, 0, 0]  # min, max, sum, count since the last record
    self._returns = [0.0, 0]  # sum, count of episode returns since the last record
    self.times = {"ingest": 0.0, "sample": 0.0, "update": 0.0, "publish": 0.0, "wait": 0.0}
    self.actor_stats: list[ActorStats] = []
    self._waiting = False  # the loop waits for data (no update since), for the watchdog

  # --- pieces of the loop ----------------------------------------------------
  def _add_chunk(self, chunk: Chunk) -> None:
    self.replay.add(chunk.transitions)
    n = chunk.transitions.reward.shape[0]
    self.inserted += n
    self.env_steps += chunk.env_steps
    self.chunks_ingested += 1
    lag, lags = self.learner.opt_steps - chunk.version, self._lags
    lags[:] = ([min(lags[0], lag), max(lags[1], lag), lags[2] + lag, lags[3] + 1] if lags[3]
               else [lag, lag, lag, 1])
    self._returns[0] += sum(chunk.episode_returns)
    self._returns[1] += len(chunk.episode_returns)
    last = self.last_chunk.get(chunk.actor_id)
    if (chunk.seq != 0 if last is None else
        chunk.version < last[0] or chunk.seq not in (last[1] + 1, 0)):
      self.order_errors += 1
    self.last_chunk[chunk.actor_id] = (chunk.version, chunk.seq)

  def _ingest(self, max_chunks: int = 32) -> int:
    """Moves up to ``max_chunks`` queued chunks into the replay, unless actors are ahead."""
    t0 = time.perf_counter()
    moved = 0
    while moved < max_chunks and self.limiter.can_insert(
        self.inserted, self.learner.opt_steps * self.learner.batch_size, self._chunk_items):
      chunk = self.transport.get(0)
      if chunk is None:
        break
      self._add_chunk(chunk)
      moved += 1
    self.times["ingest"] += time.perf_counter() - t0
    return moved

  def _wait_for_data(self, timeout: float = 0.02) -> None:
    """Waits up to ``timeout`` while no update can run: takes one chunk if the learner is
    short of data or the limiter lets actors insert; otherwise (the learner is held back,
    e.g. by ``max_train_frequency``, and actors are ahead) leaves the queue full, so that
    actors block instead of running past the samples-per-insert budget."""
    t0 = time.perf_counter()
    self._waiting = True
    learner = self.learner
    sampled = learner.opt_steps * learner.batch_size
    if (self.limiter.can_insert(self.inserted, sampled, self._chunk_items)
        or not self.limiter.can_sample(self.inserted, sampled, learner.k * learner.batch_size)):
      chunk = self.transport.get(timeout)
      if chunk is not None:
        self._add_chunk(chunk)
    else:
      self.transport.pump(timeout)  # drop-oldest keeps reading; blocking mode reads only into room
    self.times["wait"] += time.perf_counter() - t0

  def _can_update(self) -> bool:
    c, learner = self.config, self.learner
    if len(self.replay) < c.warmup_period or not learner.ready() or learner.opt_steps >= c.max_opts:
      return False
    n = learner.k * learner.batch_size
    if not self.limiter.can_sample(self.inserted, learner.opt_steps * learner.batch_size, n):
      return False
    mtf = self.async_config.max_train_frequency
    if mtf is not None and learner.opt_steps >= mtf * (time.perf_counter() - self._train_start):
      return False
    return True

  def _publish(self) -> None:
    t0 = time.perf_counter()
    self.param_store.publish(self.learner.model_info())
    self.times["publish"] += time.perf_counter() - t0

  def _record(self, opt: int, last: tuple) -> tuple:
    now = time.perf_counter()
    dt = max(1e-9, now - last[0])
    sps = (self.inserted - last[1]) / dt
    fps = (self.env_steps - last[2]) / dt
    osps = (opt - last[3]) / dt
    lags = self._lags
    values = {
        "env_steps": self.env_steps, "opt_steps": opt, "fps": fps,
        "samples_total": self.inserted, "samples_per_sec": sps, "opt_steps_per_sec": osps,
        "samples_per_opt_steps": self.inserted / max(1, opt),
        "queue_length": self.transport.qsize(), "dropped_chunks": self.transport.dropped,
        "policy_lag_min": lags[0], "policy_lag_mean": lags[2] / max(1, lags[3]),
        "policy_lag_max": lags[1], "actor_restarts": sum(self.manager.restarts),
        **{f"time_{k}_frac": v / max(1e-9, now - self.run_state.start) for k, v in self.stage_times().items()},
        **self.learner.metrics()}
    if self._returns[1]:
      values["train_episode_return"] = self._returns[0] / self._returns[1]
    self.recorder.record(opt, values)
    self._lags, self._returns = [0, 0, 0, 0], [0.0, 0]
    return (now, self.inserted, self.env_steps, opt)

  def _stage(self) -> str:
    """Where a run without progress is stuck, for the watchdog (read from its thread)."""
    learner, c = self.learner, self.config
    if len(self.replay) < max(c.warmup_period, learner.k * learner.batch_size):
      steps = [int(self.manager.shared.env_steps[i]) for i in range(self.manager.num_actors)]
      return (f"waiting for the actors' chunks to fill the warmup ({len(self.replay)} of "
              f"{c.warmup_period} transitions; {self.chunks_ingested} chunks so far; actors' "
              f"env steps {steps}, alive {self.manager.alive()}): an actor's env.step() may "
              "not return")
    if self._waiting:
      return (f"waiting for the actors' chunks ({self.chunks_ingested} so far; actors alive "
              f"{self.manager.alive()}): an actor's env.step() may not return")
    return "the learner's update call"

  def stage_times(self) -> dict[str, float]:
    return {"ingest": self.times["ingest"], "sample": self.learner.time_sample,
            "update": self.learner.time_update, "publish": self.times["publish"],
            "wait": self.times["wait"]}

  # --- the loop --------------------------------------------------------------
  def train(self) -> dict:
    """Runs to the end; returns the summary (also written to ``<model_dir>/summary.json``)."""
    c, ac, learner, run = self.config, self.async_config, self.learner, self.run_state
    saved_affinity = None
    if ac.pin_cpus and hasattr(os, "sched_setaffinity"):
      saved_affinity = os.sched_getaffinity(0)
      os.sched_setaffinity(0, {0})
    eval_worker = _EvalWorker(self.evaluator, run)
    eval_t, record_t, save_t, sync_t = (IntervalTrigger(c.eval_interval),
                                        IntervalTrigger(c.record_interval),
                                        IntervalTrigger(c.save_interval),
                                        IntervalTrigger(ac.sync_interval))
    bar = progress_bar(c.max_opts, c.progress)
    self._publish()  # version 0: actors start acting with the initial params
    if self.inference is not None:
      self.inference.start()
    self.manager.start()
    self._train_start = time.perf_counter()
    last = (self._train_start, 0, 0, 0)
    last_check = 0.0
    error: BaseException | None = None
    forced = False
    with run.stop_on_sigint():
      dog = run.watchdog(lambda: self.env_steps + learner.opt_steps + self.evaluator.steps,
                         self._stage)
      try:
        while not run.should_stop(self.env_steps):
          self._ingest()
          now = time.perf_counter()
          if now - last_check > 0.1:
            self.manager.check()
            if self.inference is not None:
              self.inference.check()
            if eval_worker.error is not None:
              raise eval_worker.error
            last_check = now
          if not self._can_update():
            self._wait_for_data()
            continue
          learner.step()
          self._waiting = False
          opt = learner.opt_steps
          if sync_t(opt):
            self._publish()
          bar.update(opt - bar.n)
          if eval_t(opt):
            eval_worker.submit(opt, self.env_steps, _host_copy(learner.policy_params()),
                               _host_copy(learner.state) if c.model_dir else None)
          if record_t(opt):
            last = self._record(opt, last)
            if run.evals:
              bar.set_postfix(eval_reward=f"{run.final_eval_reward:.1f}",
                              best=f"{run.best_eval_reward:.1f}")
          if save_t(opt):
            run.save(str(opt), {"env_steps": self.env_steps})
        if run.failure is not None:
          raise run.failure
      except KeyboardInterrupt:  # outside the main thread, or a second Ctrl-C
        run.interrupted = forced = True
      except BaseException as e:
        error = e
      finally:
        dog.stop()
        bar.close()
        if error is None and not forced:  # (a forced stop may have lost the state mid-update)
          self._publish()  # actors end on the final params
        self.actor_stats = self.manager.stop_and_join()
        if self.inference is not None:
          self.inference.stop()
        self.transport.close()
        eval_worker.close(wait_pending=error is None and not run.interrupted)
        error = error or eval_worker.error  # an evaluation that failed after the loop's last look
        try:
          if error is None and not eval_worker.alive:  # (the worker's own error is in error)
            # The last evaluation may predate the last update call.
            run.evaluate_final(
                lambda: self.evaluator.evaluate(_host_copy(learner.policy_params())),
                self.env_steps)
        except Exception as eval_error:
          error = eval_error
        finally:
          self.evaluator.close()
        try:
          run.save("final", {"env_steps": self.env_steps})
        except Exception as save_error:  # never mask the error that ended the run
          error = error or save_error
        run.record_error(error)
        summary = self.summary()
        run.write_summary(summary)
        self.recorder.close()
        if saved_affinity is not None:
          os.sched_setaffinity(0, saved_affinity)
    if error is not None:
      raise error
    return summary

  def summary(self) -> dict:
    wall = time.perf_counter() - self.run_state.start
    return self.run_state.summary(self.inserted, self.env_steps, {
        "mode": f"async-{self.async_config.actor_mode}",
        "chunks_ingested": self.chunks_ingested,
        "dropped_chunks": self.transport.dropped,
        "actor_restarts": sum(self.manager.restarts),
        "stage_seconds": self.stage_times(),
        "stage_fractions": {k: v / wall for k, v in self.stage_times().items()},
        "actors": [dataclasses.asdict(s) for s in self.actor_stats],
    })


def train_async(agent_cls, agent_config, env_factory: EnvFactory, config: TrainerConfig,
                async_config: AsyncConfig, recorder: Recorder | None = None,
                eval_env_factory: EnvFactory | None = None, replay=None,
                ) -> tuple[dict, list[ActorStats]]:
  """Wires agent, envs, replay, actors and learner, runs to the end (border's ``train_async``).

  Args:
    agent_cls: the agent class, e.g. ``DQN``; built as ``agent_cls(agent_config, obs_space,
      action_space, env_id)`` in the learner and in every actor.
    agent_config: its config (picklable).
    env_factory, config, async_config, recorder, eval_env_factory, replay: see ``AsyncTrainer``.

  Returns:
    ``(summary, actor_stats)``: the trainer's summary dict and per-actor ``ActorStats``.
  """
  from jaxasync.envs import spaces_of
  obs_space, action_space = spaces_of(env_factory)
  agent_factory = functools.partial(agent_cls, agent_config, obs_space, action_space,
                                    env_factory.env_id)
  agent = agent_factory()
  trainer = AsyncTrainer(agent, agent_factory, env_factory, config, async_config, recorder,
                         eval_env_factory, replay)
  summary = trainer.train()
  return summary, trainer.actor_stats
