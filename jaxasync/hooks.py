"""What the learner loop does every so many SGD steps: triggers, the progress bar, evaluation."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Callable

from tqdm.auto import tqdm

from jaxasync.evaluator import Evaluator


class IntervalTrigger:
  """Fires when a counter crosses a multiple of ``interval`` (never when ``interval <= 0``):
  border's ``opt_steps % interval == 0``, made safe for update calls that advance several
  steps at once."""

  def __init__(self, interval: int, start: int = 0):
    self.interval = interval
    self._last = start  # (a resumed run's counter starts where the checkpoint was)

  def __call__(self, count: int) -> bool:
    if self.interval <= 0:
      return False
    fired = count // self.interval > self._last // self.interval
    self._last = count
    return fired


@dataclasses.dataclass(frozen=True)
class Hook:
  """``fn(loop)`` every ``interval`` SGD steps, after the update call that crosses a multiple
  of it (``interval <= 0``: never). The loop's own evaluation, recording and checkpoints are
  hooks; ``Trainer(hooks=[...])`` adds a run's own (custom logging, early stopping through
  ``loop.ledger.request_stop()``, ...), called in the learner's thread after those.

  Attributes:
    interval: SGD steps between calls.
    fn: called with the ``LearnerLoop`` (its ``learner``, ``source``, ``ledger``, counters).
    name: for messages.
  """

  interval: int
  fn: Callable
  name: str = "hook"


class _NoBar:
  n = 0

  def update(self, n): pass

  def set_postfix(self, **kw): pass

  def close(self): pass


def progress_bar(total: int, enabled: bool, initial: int = 0):
  """A tqdm bar over SGD steps (from ``initial``: a resumed run's), or a no-op (no tqdm
  monitor thread) when disabled."""
  return (tqdm(total=total, initial=initial, desc="opt steps", mininterval=1.0) if enabled
          else _NoBar())


class EvalWorker:
  """Evaluates in its own thread, so that learning never stalls; the latest request wins.

  The lock-step loop waits for each evaluation (``wait``), which keeps a synchronous run
  deterministic; the asynchronous loop does not.

  Args:
    evaluator: runs the episodes.
    on_eval: ``on_eval(reward, opt_steps, env_steps, state, wall_s)``, called in the worker's
      thread after each evaluation (the ledger's).
  """

  def __init__(self, evaluator: Evaluator, on_eval):
    self.evaluator, self.on_eval = evaluator, on_eval
    self._cv = threading.Condition()
    self._request = None
    self._closing = False
    self.error: BaseException | None = None
    self.busy = False
    self._thread = threading.Thread(target=self._loop, name="jaxasync-eval", daemon=True)
    self._thread.start()

  def submit(self, opt_steps: int, env_steps: int, params, state, wall_s: float) -> None:
    """Asks for an evaluation of ``params`` (those of ``opt_steps``; ``state``: host copy of
    the whole agent state, for ``best``), replacing a request not yet started. It is logged at
    ``wall_s``, the time of the request."""
    with self._cv:
      self._request = (opt_steps, env_steps, params, state, wall_s)
      self._cv.notify()

  def wait(self, timeout: float | None = None, abort=None) -> None:
    """Waits until no evaluation is pending or running, the worker died, ``timeout`` passed or
    ``abort()`` (e.g. the run failed) says to stop waiting."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while ((self._request is not None or self.busy) and self._thread.is_alive()
           and (deadline is None or time.monotonic() < deadline)
           and not (abort is not None and abort())):
      time.sleep(0.002)

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
        self.on_eval(reward, opt_steps, env_steps, state, wall_s)
      except BaseException as e:  # surfaced by the loop
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
      self.wait(timeout=30)
    with self._cv:
      self._closing = True
      self._cv.notify()
    self._thread.join(30)
