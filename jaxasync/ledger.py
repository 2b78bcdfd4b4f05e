"""The run's books: evaluations, best and periodic checkpoints, stop requests, the summary."""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Callable

import jax
import numpy as np

from jaxasync.checkpoint import save_checkpoint
from jaxasync.errors import CheckpointError, NonFiniteError
from jaxasync.faults import Watchdog, all_finite, logger
from jaxasync.learner import Learner
from jaxasync.recorder import Recorder

# The learning-health figures summary.json's ``health`` series keeps from each record (those
# present: an agent records its own). Where each comes from: the replay source
# (``replay_terminal_fraction``, ``q_bound``, ``q_floor``), the agents' update metrics (the rest;
# ``target_clipped``: DQN's fraction of targets clipped at its value bound).
HEALTH_KEYS = ("q_mean", "q_max", "q_bound", "q_floor", "action_gap", "replay_terminal_fraction",
               "target_clipped", "grad_norm", "critic_grad_norm", "actor_grad_norm", "entropy")
# q_max counts as over q_bound beyond the margin ``REL * scale + ABS``, ``scale`` the size of
# the values the replay spans, ``max(|q_bound|, |q_floor|)`` (``|q_bound|`` when all are >= 0).
# A value learned by regression misses its target by a fit error that grows with that scale:
# 5% of it lets a healthy run sit at the bound (5 units at CartPole's 100, where the runs that
# collapsed had even their q_mean above 100). The scale is the span, not the bound alone,
# because a bound near 0 with values far below it (Pendulum: 0 and -1,600) leaves no room
# for that error: a healthy SAC Pendulum run (eval -142 after 8k env steps) had q_max 0.6-8.6
# units above its bound (-8.6 early, -0.001 from 2.5k env steps on) in 13 of its 14 records.
# The absolute unit keeps a bound and floor both near 0 (sparse rewards) from being crossed
# by noise of about one reward.
OVERESTIMATION_MARGIN_REL = 0.05
OVERESTIMATION_MARGIN_ABS = 1.0
# Records in a row over the bound before the warning: one record's q_max is the largest Q of
# one call's batches, so a single record can be one badly fitted state; three in a row (1,500
# SGD steps at the default record interval) is a trend.
OVERESTIMATION_RECORDS = 3


def overestimation_margin(q_bound: float, q_floor: float | None = None) -> float:
  """How far ``q_max`` may exceed ``q_bound`` before it counts as over it:
  ``REL * max(|q_bound|, |q_floor|) + ABS`` (``q_floor`` ``None``: ``|q_bound|`` alone)."""
  scale = abs(q_bound) if q_floor is None else max(abs(q_bound), abs(q_floor))
  return OVERESTIMATION_MARGIN_REL * scale + OVERESTIMATION_MARGIN_ABS


def over_bound(values: dict) -> bool | None:
  """Whether a record's ``q_max`` exceeds its ``q_bound`` by more than the margin; ``None``
  when the record lacks either (no Q-values, or no finite bound)."""
  if values.get("q_max") is None or values.get("q_bound") is None:
    return None
  return values["q_max"] > values["q_bound"] + overestimation_margin(values["q_bound"],
                                                                     values.get("q_floor"))


# A Ctrl-C while the run is being built (actors spawning, the first compilations), before the
# loop takes SIGINT (``RunLedger.stop_on_sigint``), raises KeyboardInterrupt wherever it lands;
# landing inside a garbage collector's callback (a weakref finalizer of a JAX object), it is
# only printed as "Exception ignored" and the build goes on. ``early_interrupts_remembered``
# keeps a note of it, so that the loop starts stopped.
_early_interrupt = threading.Event()


def _interrupt_and_remember(signum, frame):
  _early_interrupt.set()
  raise KeyboardInterrupt


@contextlib.contextmanager
def early_interrupts_remembered():
  """Within it (``jaxasync.experiment.run_cli`` runs a command in it), a Ctrl-C outside a run's
  loop raises KeyboardInterrupt as usual and is remembered: if something swallowed it, the
  next loop stops (saving) as soon as it starts. On exit the previous SIGINT handler is back
  and nothing is remembered. Only in the main thread (elsewhere, nothing)."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  _early_interrupt.clear()
  previous = signal.signal(signal.SIGINT, _interrupt_and_remember)
  try:
    yield
  finally:
    signal.signal(signal.SIGINT, previous)
    _early_interrupt.clear()


class RunLedger:
  """The run's books, kept by the learner loop: evaluations and the best one (saved as ``best``),
  numbered and final checkpoints, stop requests and signals, the error that ended the run, the
  summary. (Not the run's state: that is the agent state, the counters and the data source.)"""

  def __init__(self, config, learner: Learner, recorder: Recorder,
               extra_meta: dict | None = None):
    self.config, self.learner, self.recorder = config, learner, recorder
    self.best_eval_reward = -np.inf
    self.final_eval_reward = np.nan
    self.solved_at: dict | None = None
    self.evals: list[dict] = []
    self.extra_meta = extra_meta or {}
    self.start = time.perf_counter()  # this attempt's (the process's) start
    # Seconds of training behind the checkpoint this attempt resumed from (0 for a fresh run):
    # a resumed run's clock continues from there, so its evaluations' wall_s never go back
    # and its rates divide the lineage's counters by the lineage's seconds.
    self.wall_before = 0.0
    # (The composition root claimed model_dir before building anything: see Trainer.)
    self.model_dir = Path(config.logdir) if config.logdir else None
    self._stop_at = float("inf")
    self.interrupted = False
    self.error: str | None = None  # what ended the run, for the summary
    self.failure: BaseException | None = None  # set by the watchdog thread
    self.warnings: list[str] = []
    self.health: list[dict] = []  # per record: opt_steps, env_steps and the HEALTH_KEYS present
    self.over_bound_streak = 0  # records in a row with q_max over q_bound (``over_bound``)
    self.overestimation_warned = False  # (once per run, resumes included)
    self.last_checkpoint: Path | None = None  # the last numbered or final one written
    self.resumes = 0  # resumes in the lineage of the checkpoint this run continues
    self._writer: threading.Thread | None = None  # a background save in flight
    self._write_error: BaseException | None = None

  def elapsed(self) -> float:
    """Seconds of training behind the run's state now: the resumed checkpoint's, plus this
    attempt's. (Time an earlier attempt spent after its last checkpoint is not in it: that
    work was lost with it.)"""
    return self.wall_before + time.perf_counter() - self.start

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
    if _early_interrupt.is_set():  # a Ctrl-C during the build that something swallowed
      _early_interrupt.clear()
      logger.warning("Ctrl-C while the run was being built: stopping at once (saving).")
      on_signal(signal.SIGINT, None)
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
    """``max_opts``, ``max_env_steps``, ``duration``, ``target_eval_reward`` or a requested stop;
    raises the error of a failed background save (the run ends at once, not one save later)."""
    if self._write_error is not None:
      self.wait_for_writes()
    c = self.config
    return (self.learner.opt_steps >= c.max_opts
            or time.perf_counter() >= self._stop_at
            or (c.max_env_steps is not None and env_steps >= c.max_env_steps)
            or (c.duration is not None and time.perf_counter() - self.start >= c.duration)
            or self.solved_at is not None)

  def save(self, name: str, counters: dict, source_state: dict | None = None,
           actor_state: bytes | None = None, background: bool = False) -> None:
    """Writes checkpoint ``name``: the learner's state (checked finite), ``counters`` and the
    ledger as meta, the data source's state and the lock-step actor's pickled state.

    With ``background`` the learner only waits for what must be copied now (the state to
    host memory; ``source_state`` is already a copy) and a writer thread does the rest; a
    save waits for the previous one's writer first, so at most one is in flight, and
    ``wait_for_writes`` (called at the end of a run) waits for it. A failed background write
    is raised by the next ``should_stop``, save or ``wait_for_writes``; an ``OSError`` of the
    write becomes a one-line ``CheckpointError``.
    """
    if self.model_dir is None:
      return
    self.wait_for_writes()
    # numpy RNG states (replay sampling, exploration: the caller's ``counters["rng_states"]``)
    # go in the meta; the JAX key is part of the agent state.
    meta = {"opt_steps": self.learner.opt_steps, "best_eval_reward": self.best_eval_reward,
            **counters, "ledger": self.state_dict(), **self.extra_meta}
    state = jax.device_get(self.learner.state)  # a host copy: the next update may donate it
    # Checked on the host copy: numpy needs no compile, where the jitted check compiled at the
    # first save (0.8-2.5 s of a Rainbow MinAtar run's SIGTERM exit, its first save that one).
    self.check_finite(state, f"checkpoint {name!r}")

    def write():
      try:
        path = save_checkpoint(self.model_dir / name, state, meta, source_state, actor_state)
      except OSError as e:
        raise CheckpointError(
            f"checkpoint {name!r} could not be written in {self.model_dir} "
            f"({e.strerror or e}{f': {e.filename}' if e.filename else ''}); the last complete "
            f"checkpoint is {self.last_checkpoint or 'none'}, untouched. Free space (or fix the "
            "directory) and continue the run by resuming it (resume=True).") from e
      self.last_checkpoint = path
      keep = self.config.keep_checkpoints
      numbered = sorted((p for p in self.model_dir.iterdir() if p.is_dir() and p.name.isdigit()),
                        key=lambda p: int(p.name))
      for old in numbered[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)

    if not background:
      write()
      return

    def run():
      try:
        write()
      except BaseException as e:  # surfaced by the next save or wait_for_writes
        self._write_error = e

    self._writer = threading.Thread(target=run, name=f"jaxasync-save-{name}", daemon=True)
    self._writer.start()

  def wait_for_writes(self) -> None:
    """Waits for a background save to finish; raises its error, if it failed."""
    if self._writer is not None:
      self._writer.join()
      self._writer = None
    if self._write_error is not None:
      error, self._write_error = self._write_error, None
      raise error

  def state_dict(self) -> dict:
    """The books a resumed run continues: evaluations, the best, when it was solved, how
    many times the run was resumed (``resumes``, counted by ``load_state_dict``), the seconds
    of training behind this state (``wall_s``), the health series, the warnings and the
    overestimation watch."""
    return {"best_eval_reward": _json_safe(float(self.best_eval_reward)),
            "final_eval_reward": _json_safe(float(self.final_eval_reward)),
            "evals": self.evals, "solved_at": self.solved_at, "resumes": self.resumes,
            "wall_s": self.elapsed(), "health": _json_safe(self.health), "warnings": list(self.warnings),
            "over_bound_streak": self.over_bound_streak,
            "overestimation_warned": self.overestimation_warned}

  def load_state_dict(self, state: dict) -> None:
    best = state.get("best_eval_reward")
    self.best_eval_reward = -np.inf if best is None else float(best)
    final = state.get("final_eval_reward")
    self.final_eval_reward = np.nan if final is None else float(final)
    self.evals = list(state.get("evals", []))
    self.solved_at = state.get("solved_at")
    self.resumes = int(state.get("resumes", 0)) + 1
    self.wall_before = float(state.get("wall_s", 0.0))
    self.health = list(state.get("health", []))
    self.warnings[:] = state.get("warnings", [])  # (in place: the watchdog appends to it)
    self.over_bound_streak = int(state.get("over_bound_streak", 0))
    self.overestimation_warned = bool(state.get("overestimation_warned", False))

  def check_finite(self, state, what: str) -> None:
    """Raises ``NonFiniteError`` instead of letting non-finite ``state`` be saved as ``what``."""
    if all_finite(state):
      return
    last = (f" The last checkpoint written, {self.last_checkpoint}, is the last good one."
            if self.last_checkpoint is not None else "")
    raise NonFiniteError(
        f"the agent state has NaN or infinite values at SGD step {self.learner.opt_steps}: "
        f"training diverged, {what} was not written.{last} {self.learner.agent.divergence_hint()}")

  def on_eval(self, reward: float, opt_steps: int, env_steps: int, params_version: int,
              state_for_best=None, wall_s: float | None = None) -> None:
    """Records an evaluation of the params of ``opt_steps`` (taken at ``wall_s`` seconds into
    the run; default: now); saves ``best`` when it improves."""
    self.final_eval_reward = reward
    wall = self.elapsed() if wall_s is None else wall_s
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

  def on_record(self, opt_steps: int, env_steps: int, values: dict) -> None:
    """Keeps a record's health figures (the summary's ``health`` series) and watches them:
    once ``q_max`` has been over ``q_bound`` (``over_bound``) for ``OVERESTIMATION_RECORDS``
    records in a row, warns, once per run (the log and the summary's ``warnings``; the run
    goes on). A record without both figures ends a streak."""
    health = {k: float(values[k]) for k in HEALTH_KEYS if k in values}
    if health:
      self.health.append({"opt_steps": opt_steps, "env_steps": env_steps, **health})
    self.over_bound_streak = self.over_bound_streak + 1 if over_bound(health) else 0
    if self.over_bound_streak >= OVERESTIMATION_RECORDS and not self.overestimation_warned:
      self.overestimation_warned = True
      msg = self._overestimation_message(opt_steps, env_steps, health)
      self.warnings.append(msg)
      logger.warning(msg)

  def _overestimation_message(self, opt_steps: int, env_steps: int, health: dict) -> str:
    q_max, q_bound = health["q_max"], health["q_bound"]
    return (f"Q-values above the largest return the replay supports at SGD step {opt_steps} "
            f"(env step {env_steps}): q_max {q_max:.4g} > q_bound {q_bound:.4g} + margin "
            f"{overestimation_margin(q_bound, health.get('q_floor')):.3g} for "
            f"{self.over_bound_streak} records in a row. This is overestimation, often followed "
            f"by a collapse of the policy. {self.learner.agent.overestimation_hint()}")

  def evaluate_final(self, evaluate: Callable[[], float], env_steps: int) -> None:
    """Ends the run with ``evaluate()`` of its final params, so that ``final_eval_reward`` is
    always the return of what ``final`` holds: when evaluation is on, SGD steps were taken
    since the last evaluation and the run was not interrupted."""
    opt = self.learner.opt_steps
    if (self.config.eval_interval > 0 and opt > 0 and not self.interrupted
        and (not self.evals or self.evals[-1]["opt_steps"] < opt)):
      self.on_eval(evaluate(), opt, env_steps, opt)

  def summary(self, samples_total: int, env_steps: int, extra: dict | None = None) -> dict:
    """The run's ``summary.json``. A resumed run's counters, ``wall_s`` and rates are those of
    the lineage (every attempt up to the checkpoint it resumed from, and this one);
    ``attempt_wall_s`` is this attempt's seconds alone (``duration`` limits it, and the
    loop's ``stage_fractions`` divide by it); ``resumes`` counts the resumes in
    that lineage (a resume from a checkpoint older than the last attempt's is not counted
    twice)."""
    wall = self.elapsed()
    opt = self.learner.opt_steps
    out = {
        "samples_total": samples_total, "env_steps": env_steps, "opt_steps": opt,
        "wall_s": wall, "attempt_wall_s": time.perf_counter() - self.start,
        "samples_per_sec": samples_total / wall,
        "opt_steps_per_sec": opt / wall,
        "samples_per_opt_steps": samples_total / opt if opt else float("nan"),
        "best_eval_reward": float(self.best_eval_reward),
        "final_eval_reward": float(self.final_eval_reward),
        "final_eval_opt_steps": self.evals[-1]["opt_steps"] if self.evals else None,
        "seed": self.config.seed,
        "solved_at": self.solved_at, "evals": self.evals, "interrupted": self.interrupted,
        "error": self.error, "warnings": self.warnings, "resumes": self.resumes,
        "health": self.health,
    }
    if opt == 0 and self.error is None:
      msg = (f"the run ended without a single SGD step ({env_steps} env steps collected): "
             f"nothing was learned. {self.learner.agent.data.starved_hint()}")
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
