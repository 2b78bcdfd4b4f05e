"""Fault detection: non-finite learning, stalled runs (the errors themselves: jaxasync.errors).

``NonFiniteError`` stops a run whose loss, priorities or params stopped being finite
(before any checkpoint of them is written); ``StallError`` stops a run that made no
progress (no env step, no SGD step, no evaluation step) for ``RunConfig.stall_timeout``
seconds, naming the stage it is stuck in; ``Watchdog`` is the thread that watches.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxasync.errors import StallError

logger = logging.getLogger("jaxasync")


def _inexact_leaves(tree: Any) -> list:
  return [x for x in jax.tree.leaves(tree)
          if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.inexact)]


@jax.jit
def _all_finite_jit(leaves: list) -> jax.Array:
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))


def all_finite(tree: Any) -> bool:
  """Whether every floating-point leaf of ``tree`` is finite (one jitted reduction on device
  arrays, numpy on host copies)."""
  leaves = _inexact_leaves(tree)
  if not leaves:
    return True
  if all(isinstance(x, np.ndarray) for x in leaves):
    return all(bool(np.isfinite(x).all()) for x in leaves)
  return bool(_all_finite_jit(leaves))


class Watchdog:
  """Warns, then fails a run that makes no progress; also enforces ``duration``.

  A daemon thread reads ``progress()`` (any number that moves while the run works: env
  steps + SGD steps + evaluation steps) every ``poll`` seconds. When it has not moved for
  ``warn_after`` seconds it logs a warning naming ``stage()``; after ``fail_after`` seconds,
  or ``grace`` seconds past ``duration``, it calls ``fail(StallError)``. ``None`` or ``<= 0``
  disables a limit.
  """

  def __init__(self, progress: Callable[[], float], stage: Callable[[], str],
               fail: Callable[[StallError], None], warn_after: float | None,
               fail_after: float | None, duration: float | None = None, grace: float = 10.0,
               poll: float = 0.5):
    self._progress, self._stage, self._fail = progress, stage, fail
    self.warn_after = warn_after if warn_after and warn_after > 0 else None
    self.fail_after = fail_after if fail_after and fail_after > 0 else None
    self.duration, self.grace, self.poll = duration, grace, poll
    self.warnings: list[str] = []
    self._last, self._last_move = progress(), time.monotonic()
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._loop, name="jaxasync-watchdog", daemon=True)

  def start(self) -> "Watchdog":
    if self.warn_after or self.fail_after or self.duration is not None:
      self._thread.start()
    return self

  def _moved(self) -> float:
    """Seconds since ``progress()`` last moved (reading it now)."""
    now, value = time.monotonic(), self._progress()
    if value != self._last:
      self._last, self._last_move = value, now
    return now - self._last_move

  def stall_at_end(self) -> StallError | None:
    """For a run that ``duration`` ended: a ``StallError`` naming the stage when nothing moved
    in its second half (the stall limits, sized for long runs, cannot fire in a short one, and
    such a run would otherwise end as if it had only learnt nothing); else None."""
    idle = self._moved()
    if self.duration is None or self.fail_after is None or idle < self.duration / 2:
      return None  # (no duration, or stall detection turned off)
    return StallError(
        f"duration={self.duration:g} s ended a run that made no progress (no env step, SGD "
        f"step or evaluation step) in its last {idle:.0f} s; stuck in: {self._stage()}. Check "
        "that env.step() returns and that actors are alive.")

  def _loop(self) -> None:
    start = time.monotonic()
    warned = False
    while not self._stop.wait(self.poll):
      now, idle = time.monotonic(), self._moved()
      if idle == 0.0:  # it moved since the last poll
        warned = False
        continue
      if self.warn_after and idle >= self.warn_after and not warned:
        warned = True
        msg = (f"no progress (no env step, SGD step or evaluation step) for {idle:.0f} s; "
               f"stuck in: {self._stage()}")
        self.warnings.append(msg)
        logger.warning(msg)
      if self.fail_after and idle >= self.fail_after:
        self._fail(StallError(
            f"no progress for {idle:.0f} s (stall_timeout={self.fail_after:g} s); stuck in: "
            f"{self._stage()}. Check that env.step() returns and that actors are alive, or "
            "raise stall_timeout if this stage is legitimately slow."))
        return
      if self.duration is not None and now - start >= self.duration + self.grace:
        self._fail(StallError(
            f"duration={self.duration:g} s passed {now - start - self.duration:.0f} s ago "
            f"but the run did not stop: stuck in {self._stage()} for {idle:.0f} s."))
        return

  def stop(self) -> None:
    self._stop.set()
    if self._thread.is_alive():
      self._thread.join(5.0)
