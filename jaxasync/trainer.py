"""The synchronous loop (border-core's ``Trainer``): the baseline and the debugging mode."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np
from tqdm.auto import tqdm

from jaxasync.checkpoint import claim_run_dir, save_checkpoint
from jaxasync.envs import ConfigError, EnvFactory
from jaxasync.evaluator import Evaluator, to_cpu
from jaxasync.faults import NonFiniteError, Watchdog, all_finite, divergence_hint, logger
from jaxasync.learner import IntervalTrigger, Learner
from jaxasync.recorder import NullRecorder, Recorder
from jaxasync.replay import ReplayBuffer
from jaxasync.types import transition_example


@dataclasses.dataclass(frozen=True)
class TrainerConfig:
  """The training loop's settings (border-core's ``TrainerConfig`` plus replay and n-step).

  Intervals count optimization (SGD) steps, as in border.

  Attributes:
    max_opts: stop after this many SGD steps.
    max_env_steps: stop after this many env steps (all sub-envs together); None: no limit.
    duration: stop after this many wall-clock seconds; None: no limit.
    target_eval_reward: stop once an evaluation's mean return reaches it; None: never.
    warmup_period: env steps collected before the first SGD step.
    opt_interval: sync only: env steps per SGD step (1/opt_interval SGD steps per env step).
    updates_per_call: SGD steps per jitted update call.
    eval_interval: SGD steps between evaluations (the final params are evaluated too); 0: none.
    record_interval: SGD steps between recorded metrics; 0: none.
    save_interval: SGD steps between numbered checkpoints; 0: none.
    eval_episodes: episodes per evaluation (their mean return is the evaluation's).
    eval_epsilon: epsilon-greedy exploration during evaluation (0: greedy).
    num_envs: sub-envs of the (sync) training vector env.
    n_step: n-step returns (the StepProcessor's).
    gamma: discount per env step.
    reward_clip: clip each env reward to [-c, c] before the n-step sum (Atari: 1); episode
      returns and evaluations stay the game's score. 0: none.
    replay_capacity: transitions the replay holds (the oldest go first).
    seed: seeds envs, network init, exploration and replay sampling.
    model_dir: where checkpoints go (subdirectories best, final and one per saved SGD step
      count); None saves nothing.
    progress: show a tqdm progress bar.
    overwrite: start in a model_dir that holds another run's checkpoints or summary by
      deleting them (otherwise ConfigError).
    keep_checkpoints: numbered checkpoints kept, the newest (best and final always stay); 0
      keeps all.
    stall_warning: seconds without progress (no env step, SGD step or evaluation step) after
      which a warning names the stage the run is stuck in; None or 0: never.
    stall_timeout: seconds without progress after which the run stops with StallError (also
      raised when the run is still stuck 10 s past duration); None or 0: never.
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
  eval_epsilon: float = 0.0
  num_envs: int = 4
  n_step: int = 3
  gamma: float = 0.99
  reward_clip: float = 0.0
  replay_capacity: int = 100_000
  seed: int = 0
  model_dir: str | None = None
  progress: bool = True
  overwrite: bool = False
  keep_checkpoints: int = 5
  stall_warning: float | None = 60.0
  stall_timeout: float | None = 300.0

  def validate(self, batch_size: int) -> None:
    if self.n_step < 1:
      raise ConfigError(f"n_step must be >= 1, got {self.n_step}.")
    if not 0.0 <= self.gamma <= 1.0:
      raise ConfigError(f"gamma must be in [0, 1], got {self.gamma}.")
    if not self.reward_clip >= 0.0:
      raise ConfigError(f"reward_clip must be >= 0 (0: no clipping), got {self.reward_clip}.")
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
    if self.opt_interval <= 0 or self.updates_per_call < 1 or self.num_envs < 1:
      raise ConfigError("opt_interval must be > 0, updates_per_call and num_envs >= 1.")


class _NoBar:
  n = 0

  def update(self, n): pass

  def set_postfix(self, **kw): pass

  def close(self): pass


def progress_bar(total: int, enabled: bool):
  """A tqdm bar over optimization steps, or a no-op (no tqdm monitor thread) when disabled."""
  return tqdm(total=total, desc="opt steps", mininterval=1.0) if enabled else _NoBar()


class RunState:
  """Bookkeeping shared by both trainers: best model, periodic saves, summary."""

  def __init__(self, config: TrainerConfig, learner: Learner, recorder: Recorder,
               extra_meta: dict | None = None):
    self.config, self.learner, self.recorder = config, learner, recorder
    self.best_eval_reward = -np.inf
    self.final_eval_reward = np.nan
    self.solved_at: dict | None = None
    self.evals: list[dict] = []
    self.extra_meta = extra_meta or {}
    self.start = time.perf_counter()
    self.model_dir = Path(config.model_dir) if config.model_dir else None
    if self.model_dir is not None:  # (event files are the recorder's: its caller checks them)
      claim_run_dir(self.model_dir, config.overwrite, events=False)
    self._stop_at = float("inf")
    self.interrupted = False
    self.error: str | None = None  # what ended the run, for the summary
    self.failure: BaseException | None = None  # set by the watchdog thread
    self.warnings: list[str] = []
    self.last_checkpoint: Path | None = None  # the last numbered or final one written

  def request_stop(self, after_s: float = 0.0) -> None:
    """Ends the run ``after_s`` seconds from now (thread-safe: a float assignment)."""
    self._stop_at = time.perf_counter() + after_s

  @contextlib.contextmanager
  def stop_on_sigint(self):
    """Within it, a first Ctrl-C or SIGTERM (what ``timeout``, ``docker stop`` and job
    schedulers send) ends the run after the update in flight (so the learner's donated state
    is never lost mid-swap) and the trainer stops its actors, saves ``final`` and the summary
    as usual; a second one raises ``KeyboardInterrupt``. Only in the main thread."""
    if threading.current_thread() is not threading.main_thread():
      yield
      return

    def on_signal(signum, frame):
      if self.failure is not None:  # the watchdog interrupts a main thread stuck in env.step
        raise self.failure
      if self.interrupted:
        raise KeyboardInterrupt
      self.interrupted = True
      self.request_stop()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
      yield
    finally:
      for s, handler in previous.items():
        signal.signal(s, handler)

  def fail(self, error: BaseException) -> None:
    """Ends the run with ``error`` (from any thread): the loop stops and raises it."""
    self.failure = error
    self.request_stop()

  def watchdog(self, progress, stage, interrupt_main=None) -> Watchdog:
    """A started ``Watchdog`` for this run. ``interrupt_main()`` says whether the main thread
    may be interrupted (it is stuck in env.step): the watchdog then signals it, and the signal
    handler of ``stop_on_sigint`` raises the ``StallError`` there."""
    main = threading.main_thread().ident

    def fail(error):
      self.fail(error)
      if interrupt_main is not None and interrupt_main():
        signal.pthread_kill(main, signal.SIGINT)

    c = self.config
    dog = Watchdog(progress, stage, fail, c.stall_warning, c.stall_timeout, c.duration)
    dog.warnings = self.warnings
    return dog.start()

  def record_error(self, error: BaseException | None) -> None:
    """Keeps what ended the run (the first error) for the summary's ``error``."""
    if error is not None and self.error is None:
      self.error = f"{type(error).__name__}: {error}"

  def should_stop(self, env_steps: int) -> bool:
    """``max_opts``, ``max_env_steps``, ``duration``, ``target_eval_reward`` or a requested stop."""
    c = self.config
    return (self.learner.opt_steps >= c.max_opts
            or time.perf_counter() >= self._stop_at
            or (c.max_env_steps is not None and env_steps >= c.max_env_steps)
            or (c.duration is not None and time.perf_counter() - self.start >= c.duration)
            or self.solved_at is not None)

  def save(self, name: str, counters: dict) -> None:
    if self.model_dir is None:
      return
    # numpy RNG states (replay sampling, and exploration where the caller passes it) go in
    # the meta; the JAX key is part of the agent state.
    replay_rng = getattr(self.learner.replay, "_rng", None)
    rng_states = {"replay": replay_rng.bit_generator.state} if replay_rng is not None else {}
    rng_states.update(counters.pop("rng_states", {}))
    meta = {"opt_steps": self.learner.opt_steps, "best_eval_reward": self.best_eval_reward,
            "rng_states": rng_states, **counters, **self.extra_meta}
    self.check_finite(self.learner.state, f"checkpoint {name!r}")
    self.last_checkpoint = save_checkpoint(self.model_dir / name, self.learner.state, meta)
    keep = self.config.keep_checkpoints
    numbered = sorted((p for p in self.model_dir.iterdir() if p.is_dir() and p.name.isdigit()),
                      key=lambda p: int(p.name))
    for old in numbered[:-keep] if keep > 0 else []:
      shutil.rmtree(old, ignore_errors=True)

  def check_finite(self, state, what: str) -> None:
    """Raises ``NonFiniteError`` instead of letting non-finite ``state`` be saved as ``what``."""
    if all_finite(state):
      return
    last = (f" The last checkpoint written, {self.last_checkpoint}, is the last good one."
            if self.last_checkpoint is not None else "")
    raise NonFiniteError(
        f"the agent state has NaN or infinite values at SGD step {self.learner.opt_steps}: "
        f"training diverged, {what} was not written.{last} {divergence_hint(self.learner.agent)}")

  def on_eval(self, reward: float, opt_steps: int, env_steps: int, params_version: int,
              state_for_best=None, wall_s: float | None = None) -> None:
    """Records an evaluation of the params of ``opt_steps`` (taken at ``wall_s`` seconds into
    the run; default: now); saves ``best`` when it improves."""
    self.final_eval_reward = reward
    wall = time.perf_counter() - self.start if wall_s is None else wall_s
    self.evals.append({"opt_steps": opt_steps, "env_steps": env_steps, "wall_s": wall,
                       "eval_reward": reward, "params_version": params_version})
    self.recorder.record(opt_steps, {"eval_reward": reward})
    if reward > self.best_eval_reward:
      if self.model_dir is not None:
        # Only here: an async evaluation runs in its own thread and is handed a host copy
        # (``state_for_best``) exactly when there is a model_dir; the learner's own state may
        # be donated to the next update call under its feet.
        state = state_for_best if state_for_best is not None else self.learner.state
        self.check_finite(state, "best")
      self.best_eval_reward = reward
      if self.model_dir is not None:
        save_checkpoint(self.model_dir / "best", state,
                        {"opt_steps": params_version, "eval_reward": reward,
                         "env_steps": env_steps, **self.extra_meta})
    target = self.config.target_eval_reward
    if target is not None and reward >= target and self.solved_at is None:
      self.solved_at = {"env_steps": env_steps, "opt_steps": opt_steps, "wall_s": wall}

  def evaluate_final(self, evaluate: Callable[[], float], env_steps: int) -> None:
    """Ends the run with ``evaluate()`` of its final params, so that ``final_eval_reward`` is
    always the return of what ``final`` holds: when evaluation is on, SGD steps were taken
    since the last evaluation and the run was not interrupted."""
    opt = self.learner.opt_steps
    if (self.config.eval_interval > 0 and opt > 0 and not self.interrupted
        and (not self.evals or self.evals[-1]["opt_steps"] < opt)):
      self.on_eval(evaluate(), opt, env_steps, opt)

  def summary(self, samples_total: int, env_steps: int, extra: dict | None = None) -> dict:
    wall = time.perf_counter() - self.start
    opt = self.learner.opt_steps
    out = {
        "samples_total": samples_total, "env_steps": env_steps, "opt_steps": opt,
        "wall_s": wall, "samples_per_sec": samples_total / wall,
        "opt_steps_per_sec": opt / wall,
        "samples_per_opt_steps": samples_total / opt if opt else float("nan"),
        "best_eval_reward": float(self.best_eval_reward),
        "final_eval_reward": float(self.final_eval_reward),
        "final_eval_opt_steps": self.evals[-1]["opt_steps"] if self.evals else None,
        "seed": self.config.seed,
        "solved_at": self.solved_at, "evals": self.evals, "interrupted": self.interrupted,
        "error": self.error, "warnings": self.warnings,
    }
    if opt == 0 and self.error is None:
      msg = (f"the run ended without a single SGD step ({env_steps} env steps collected, "
             f"warmup_period={self.config.warmup_period}): nothing was learned. Lower "
             "--warmup-period or run longer.")
      if msg not in self.warnings:
        self.warnings.append(msg)
        logger.warning(msg)
    out.update(extra or {})
    return out

  def write_summary(self, summary: dict) -> None:
    if self.model_dir is not None:
      self.model_dir.mkdir(parents=True, exist_ok=True)
      path = self.model_dir / "summary.json"
      tmp = path.with_suffix(".json.tmp")
      # Strict JSON: NaN and +-inf (no evaluation yet, a diverged loss) become null.
      tmp.write_text(json.dumps(_json_safe(summary), indent=1, allow_nan=False))
      tmp.replace(path)


def _json_safe(x):
  """``x`` with numpy scalars as Python numbers and non-finite floats as ``None``."""
  if isinstance(x, dict):
    return {str(k): _json_safe(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_json_safe(v) for v in x]
  if isinstance(x, np.generic):
    x = x.item()
  if isinstance(x, float) and not np.isfinite(x):
    return None
  if x is None or isinstance(x, (bool, int, float, str)):
    return x
  return str(x)


class Trainer:
  """Alternates env steps and optimization steps in one thread (border-core's loop).

  Each iteration steps the vector env once (``num_envs`` env steps), feeds the
  StepProcessor's n-step transitions to the replay, and once ``warmup_period``
  env steps are in, runs ``1 / opt_interval`` optimization steps per env step in
  update calls of ``updates_per_call`` steps. Evaluation, recording and saving
  follow border's intervals (in optimization steps).

  Args:
    agent: e.g. ``DQN``.
    env_factory: builds the training env.
    config: the loop's settings.
    recorder: where scalars go.
    eval_env_factory: builds the evaluation env (defaults to ``env_factory``).
    replay: a replay to use instead of a uniform ``ReplayBuffer(replay_capacity)``.
  """

  def __init__(self, agent, env_factory: EnvFactory, config: TrainerConfig,
               recorder: Recorder | None = None, eval_env_factory: EnvFactory | None = None,
               replay=None):
    config.validate(agent.config.batch_size)
    self.agent, self.config = agent, config
    self.recorder = recorder or NullRecorder()
    self.env = env_factory(config.num_envs, seed=config.seed)
    example = transition_example(agent.obs_space, agent.action_space)
    self.replay = replay if replay is not None else ReplayBuffer(
        example, config.replay_capacity, seed=config.seed)
    self.learner = Learner(agent, self.replay, config.seed, config.updates_per_call,
                           agent.config.batch_size, beta_anneal_steps=config.max_opts)
    self.evaluator = Evaluator(agent, eval_env_factory or env_factory, config.eval_episodes,
                               config.eval_epsilon, seed=config.seed + 10_000)
    self.run_state = RunState(config, self.learner, self.recorder)
    self.env_steps = 0

  def train(self) -> dict:
    """Runs to ``max_opts`` / ``max_env_steps`` / ``duration`` / ``target_eval_reward``; returns the summary."""
    c, agent, learner, run = self.config, self.agent, self.learner, self.run_state
    rng = np.random.default_rng(c.seed + 1)
    obs, _ = self.env.reset(seed=c.seed)
    proc = self.replay.step_processor_cls(
        c.num_envs, obs[0], np.asarray(self.env.single_action_space.sample()), c.n_step, c.gamma,
        c.reward_clip)
    proc.reset(obs)
    eval_t, record_t, save_t = (IntervalTrigger(c.eval_interval), IntervalTrigger(c.record_interval),
                                IntervalTrigger(c.save_interval))
    actor_params = to_cpu(learner.policy_params())
    credit = 0.0
    last = (time.perf_counter(), 0, 0, 0)  # time, env_steps, opt_steps, samples at the last record
    bar = progress_bar(c.max_opts, c.progress)
    error: BaseException | None = None
    self._stage = "env.step"
    with run.stop_on_sigint():
      dog = run.watchdog(lambda: self.env_steps + learner.opt_steps + self.evaluator.steps,
                         lambda: self._stage, lambda: self._stage == "env.step")
      try:
        while not run.should_stop(self.env_steps):
          actions = agent.act(actor_params, proc.obs, agent.epsilon(self.env_steps), rng)
          self._stage = "env.step"
          next_obs, reward, terminated, truncated, _ = self.env.step(actions)
          self._stage = "the replay and the SGD update (the first call compiles)"
          self.replay.add(proc.step(actions, reward, next_obs, terminated, truncated))
          self.env_steps += c.num_envs
          if self.env_steps < c.warmup_period or not learner.ready():
            continue
          credit += c.num_envs / c.opt_interval
          stepped = False
          while credit >= c.updates_per_call and learner.opt_steps < c.max_opts:
            credit -= learner.step()
            stepped = True
          if not stepped:
            continue
          actor_params = to_cpu(learner.policy_params())
          bar.update(learner.opt_steps - bar.n)
          opt = learner.opt_steps
          if eval_t(opt):
            self._stage = "evaluation"
            reward = self.evaluator.evaluate(learner.policy_params())
            run.on_eval(reward, opt, self.env_steps, opt)
            bar.set_postfix(eval_reward=f"{reward:.1f}", best=f"{run.best_eval_reward:.1f}")
          if record_t(opt):
            now = time.perf_counter()
            dt = now - last[0]
            fps = (self.env_steps - last[1]) / dt
            osps = (opt - last[2]) / dt
            sps = (self.replay.added_total - last[3]) / dt
            self.recorder.record(opt, {
                "env_steps": self.env_steps, "opt_steps": opt, "fps": fps,
                "samples_total": self.replay.added_total, "samples_per_sec": sps,
                "opt_steps_per_sec": osps,
                "samples_per_opt_steps": self.replay.added_total / opt,
                "epsilon": agent.epsilon(self.env_steps), **learner.metrics()})
            last = (now, self.env_steps, opt, self.replay.added_total)
          if save_t(opt):
            run.save(str(opt), {"env_steps": self.env_steps,
                                "rng_states": {"exploration": rng.bit_generator.state}})
        if run.failure is not None:
          raise run.failure
        self._stage = "evaluation"
        run.evaluate_final(lambda: self.evaluator.evaluate(learner.policy_params()),
                           self.env_steps)
      except BaseException as e:
        error = e
      finally:
        dog.stop()
        bar.close()
        try:
          run.save("final", {"env_steps": self.env_steps,
                             "rng_states": {"exploration": rng.bit_generator.state}})
        except Exception as save_error:  # never mask the error that ended the run
          error = error or save_error
        run.record_error(error)
        summary = run.summary(self.replay.added_total, self.env_steps, {"mode": "sync"})
        run.write_summary(summary)
        self.env.close()
        self.evaluator.close()
    if error is not None:
      raise error
    return summary
