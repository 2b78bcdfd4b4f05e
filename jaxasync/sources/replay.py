"""The off-policy data source: a replay, the replay ratio it is sampled at, and priorities.

``ReplaySource`` owns everything between the transport and an off-policy agent's update: the
replay (uniform, prioritized, frames), the limiter that keeps the replay ratio, the cap on SGD
steps per second (SEED's ``max_train_frequency``), the annealing of the importance-sampling
exponent, and the write-back of the priorities an update returns. Two limiters keep the ratio:

* ``RateLimiter`` (Reverb's ``SampleToInsertRatio``): items sampled per item inserted, within a
  tolerance; for actors that run freely beside the learner;
* ``UpdateCredit`` (border's ``opt_interval``): SGD steps per env step once the warmup is in;
  for the lock-step loop, where the learner decides when the actor steps.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import jax
import numpy as np

from jaxasync.errors import ConfigError
from jaxasync.replay.prioritized import PrioritizedReplayBuffer, linear_beta
from jaxasync.replay.uniform import ReplayBuffer
from jaxasync.sources.base import Sample
from jaxasync.types import Transition


class Limiter(Protocol):
  """Keeps the replay ratio: ``ReplaySource`` asks it before each insert and each sample.
  Counts are items (transitions) inserted into and sampled from the replay."""

  def can_sample(self, inserted: int, sampled: int, n: int) -> bool:
    """Whether ``n`` more items may be sampled now."""

  def can_insert(self, inserted: int, sampled: int, n: int) -> bool:
    """Whether ``n`` more items may be inserted now."""

  def on_add(self, env_steps_total: int, env_steps: int, ready: bool) -> None:
    """A chunk of ``env_steps`` came in (``env_steps_total`` in all; ``ready``: the replay
    can serve a call)."""

  def on_sample(self, n: int) -> None:
    """``n`` items were sampled."""

  def state_dict(self) -> dict:
    """What a resumed run needs to keep the ratio where it was."""

  def load_state_dict(self, state: dict) -> None:
    """Puts back a ``state_dict`` (keys it does not know are ignored)."""


class RateLimiter:
  """Keeps ``sampled - spi * (inserted - warmup)`` within ``+-tolerance`` (Reverb's
  SampleToInsertRatio). Counts are items (transitions): inserted into, and sampled from, the
  replay. ``samples_per_insert=None`` limits nothing."""

  def __init__(self, samples_per_insert: float | None, tolerance: float, warmup: int):
    self.spi, self.tolerance, self.warmup = samples_per_insert, tolerance, warmup

  def error(self, inserted: int, sampled: int) -> float:
    return sampled - self.spi * max(0, inserted - self.warmup)

  def can_sample(self, inserted: int, sampled: int, n: int) -> bool:
    return self.spi is None or self.error(inserted, sampled + n) <= self.tolerance

  def can_insert(self, inserted: int, sampled: int, n: int) -> bool:
    return (self.spi is None or inserted < self.warmup
            or -self.error(inserted + n, sampled) <= self.tolerance)

  def on_add(self, env_steps_total: int, env_steps: int, ready: bool) -> None:
    """(It reads the source's item counts: nothing to keep.)"""

  def on_sample(self, n: int) -> None:
    """(It reads the source's item counts: nothing to keep.)"""

  def state_dict(self) -> dict:
    return {}  # (the source's counts, which it saves, are all it reads)

  def load_state_dict(self, state: dict) -> None:
    pass


class UpdateCredit:
  """border's ``opt_interval``: each env step taken once ``env_steps_total >= warmup`` (and the
  replay can serve a call) earns ``1 / opt_interval`` SGD steps; a call of ``n`` sampled items
  spends ``n / batch_size`` of them. Never holds inserts back: in the lock-step loop the
  learner only asks the actor to step when it has no update to run.

  Args:
    opt_interval: env steps per SGD step.
    warmup: env steps before any credit is earned.
    batch_size: items per SGD step.
  """

  def __init__(self, opt_interval: float, warmup: int, batch_size: int):
    if not opt_interval > 0:
      raise ConfigError(f"opt_interval must be > 0 env steps per SGD step, got {opt_interval}.")
    self.opt_interval, self.warmup, self.batch_size = opt_interval, warmup, batch_size
    self.credit = 0.0  # SGD steps earned and not yet taken

  def on_add(self, env_steps_total: int, env_steps: int, ready: bool) -> None:
    if env_steps_total >= self.warmup and ready:
      self.credit += env_steps / self.opt_interval

  def can_sample(self, inserted: int, sampled: int, n: int) -> bool:
    return self.credit >= n / self.batch_size

  def can_insert(self, inserted: int, sampled: int, n: int) -> bool:
    return True

  def on_sample(self, n: int) -> None:
    self.credit -= n / self.batch_size

  def state_dict(self) -> dict:
    return {"credit": self.credit}

  def load_state_dict(self, state: dict) -> None:
    if state.get("credit") is not None:
      self.credit = float(state["credit"])


def terminal_fraction(discount: np.ndarray) -> float:
  """The fraction of items ``[N]`` (``N >= 1``) that end in a termination: bootstrap discount
  exactly 0. A truncated item bootstraps (``gamma^m > 0``), so it is not terminal."""
  return float(np.count_nonzero(discount == 0) / discount.size)


def segment_values(reward: np.ndarray, discount: np.ndarray) -> np.ndarray:
  """``R_i / (1 - d_i)`` ``[N]`` float64, for items ``[N]`` with n-step return ``R_i`` and
  bootstrap discount ``d_i`` (``gamma^m``, 0 if terminal): the value of repeating each stored
  segment forever (CartPole: ``1 / (1 - gamma) = 100`` for every non-terminal item).

  Guard: an item with ``d_i >= 1`` (``gamma = 1``) repeats its segment with no discount, worth
  ``+inf`` if ``R_i > 0``, 0 if ``R_i = 0`` and ``-inf`` below; never a division by
  ``1 - d_i = 0``.
  """
  reward, discount = np.asarray(reward, np.float64), np.asarray(discount, np.float64)
  undiscounted = np.where(reward > 0, np.inf, np.where(reward < 0, -np.inf, 0.0))
  return np.divide(reward, 1.0 - discount, out=undiscounted, where=discount < 1.0)


def return_bound(reward: np.ndarray, discount: np.ndarray) -> float | None:
  """``max_i R_i / (1 - d_i)`` over items ``[N]`` (``N >= 1``; ``segment_values``): the best
  stored segment repeated forever, a bound on the Q-values the data supports that needs no
  knowledge of the env. ``None`` when it is not finite (a positive reward with ``d_i = 1``:
  an undiscounted task has no such bound)."""
  bound = float(segment_values(reward, discount).max())
  return bound if np.isfinite(bound) else None


def _split(x: np.ndarray, k: int, b: int) -> np.ndarray:
  """``[k * b, ...]`` -> ``[k, b, ...]``."""
  return x.reshape((k, b) + x.shape[1:])


class ReplaySource:
  """Serves ``updates_per_call`` batches of ``batch_size`` items per call from ``replay``.

  Args:
    replay: a ``ReplayBuffer``: uniform, ``PrioritizedReplayBuffer`` (priorities written back,
      importance weights) or a frame replay.
    batch_size: items per SGD step (the agent's).
    updates_per_call: ``k`` SGD steps per update call.
    limiter: ``RateLimiter`` or ``UpdateCredit``; ``None``: no ratio (sample whenever the
      replay can serve a call and holds ``warmup_items`` items).
    warmup_items: items the replay must hold before the first call (the warmup, counted in items).
    max_train_frequency: at most this many SGD steps per second since ``start_clock``; ``None``:
      no cap.
    beta_anneal_steps: with a prioritized replay, anneal its importance-sampling exponent
      linearly from its initial ``beta`` to 1 over this many SGD steps; 0: keep it.
    chunk_items: items in a full chunk, the unit ``can_insert`` asks room for.
  """

  def __init__(self, replay: ReplayBuffer, batch_size: int, updates_per_call: int = 1,
               limiter: Limiter | None = None,
               warmup_items: int = 0, max_train_frequency: float | None = None,
               beta_anneal_steps: int = 0, chunk_items: int = 1):
    if updates_per_call < 1:
      raise ConfigError(f"updates_per_call must be >= 1, got {updates_per_call}.")
    capacity = replay.capacity
    if capacity < updates_per_call * batch_size:
      raise ConfigError(
          f"replay capacity {capacity} is below updates_per_call x batch_size = "
          f"{updates_per_call} x {batch_size} = {updates_per_call * batch_size}: no update call "
          "could ever be sampled and the run would never train. Raise replay_capacity, or "
          "lower updates_per_call or batch_size.")
    self.replay, self.batch_size, self.updates_per_call = replay, batch_size, updates_per_call
    self.limiter, self.warmup_items, self.chunk_items = limiter, warmup_items, chunk_items
    self.max_train_frequency = max_train_frequency
    self.prioritized = isinstance(replay, PrioritizedReplayBuffer)
    self._beta0 = replay.beta if self.prioritized else None
    self._beta_anneal_steps = beta_anneal_steps if self.prioritized else 0
    self.inserted = 0  # items added (transitions)
    self.sampled = 0  # items sampled (k * batch_size per call)
    self.env_steps = 0  # env steps the added chunks took
    self.time_sample = 0.0
    self._clock = time.perf_counter()
    # (prefetch) the next call's sample, and the generator state and counts before its draw
    self._prefetched: tuple[Sample, dict] | None = None

  def __len__(self) -> int:
    return len(self.replay)

  def rng_states(self) -> dict:
    """The replay's sampling generator state, for checkpoint metadata (before a held
    prefetch's draw, as ``state_dict``)."""
    return {"replay": self._saved_rng_state()}

  def _saved_rng_state(self) -> dict:
    """The replay generator's state as a checkpoint holds it: before a held prefetch's draw."""
    held = self._prefetched
    return self.replay.rng_state if held is None else held[1]["rng"]

  def start_clock(self) -> None:
    """Starts the ``max_train_frequency`` clock (when actors start)."""
    self._clock = time.perf_counter()

  # --- writing -----------------------------------------------------------------------------
  def add(self, payload: Any, version: int, env_steps: int) -> int:
    """Adds one chunk's items; returns how many (the replay counts them)."""
    before = self.replay.added_total
    self.replay.add(payload)
    n = self.replay.added_total - before
    self.inserted += n
    self.env_steps += env_steps
    if self.limiter is not None:
      self.limiter.on_add(self.env_steps, env_steps, self._ready())
    return n

  def can_insert(self) -> bool:
    """Whether the limiter lets one more full chunk in (actors are not ahead)."""
    return self.limiter is None or self.limiter.can_insert(
        self.inserted, self.sampled, self.chunk_items)

  # --- reading -----------------------------------------------------------------------------
  def _ready(self) -> bool:
    return len(self.replay) >= self.updates_per_call * self.batch_size

  def needs_data(self) -> bool:
    """Whether the next call waits for more items (too few, or the ratio forbids sampling),
    rather than for the clock (``max_train_frequency``)."""
    if len(self.replay) < self.warmup_items or not self._ready():
      return True
    n = self.updates_per_call * self.batch_size
    return self.limiter is not None and not self.limiter.can_sample(self.inserted, self.sampled, n)

  def can_sample(self, opt_steps: int) -> bool:
    """Whether one update call may run now: enough items, the ratio and the frequency cap."""
    if self._prefetched is not None:
      return True
    if self.needs_data():
      return False
    mtf = self.max_train_frequency
    return mtf is None or opt_steps < mtf * (time.perf_counter() - self._clock)

  def prefetch(self, opt_steps: int) -> None:
    """Draws the next call's sample now, if one may run (``sample`` then returns it): the
    lock-step loop samples while XLA computes the update in flight. Items added after it are
    not in that sample, so the loop calls it only once its insert for the call is in. A
    checkpoint taken while one is held (a run ended by an error before its next call) saves
    the source as it was before the draw: a resumed run draws that sample again."""
    if self._prefetched is None and self.can_sample(opt_steps):
      before = {"rng": self.replay.rng_state, "sampled": self.sampled,
                **(self.limiter.state_dict() if self.limiter is not None else {})}
      self._prefetched = (self._draw(opt_steps), before)

  def sample(self, opt_steps: int) -> Sample:
    """``k`` batches, leaves ``[k, batch_size, ...]``; a prioritized replay draws ``k``
    independently stratified batches, each with its own weight normalisation."""
    if self._prefetched is not None:
      (sample, _), self._prefetched = self._prefetched, None
      return sample
    return self._draw(opt_steps)

  def _draw(self, opt_steps: int) -> Sample:
    t0 = time.perf_counter()
    k, b = self.updates_per_call, self.batch_size
    weights = info = None
    if self.prioritized:
      beta = None
      if self._beta_anneal_steps > 0:
        beta = linear_beta(opt_steps, self._beta_anneal_steps, self._beta0)
      batch, idx, weights, gens = self.replay.sample(b, beta=beta, num_batches=k)
      weights, info = _split(weights, k, b), (_split(idx, k, b), _split(gens, k, b))
    else:
      batch = self.replay.sample(k * b)
    if type(batch) is Transition and batch.extras is None:  # cheaper than jax.tree.map
      batch = Transition(*(_split(x, k, b) for x in batch[:-1]))
    else:
      batch = jax.tree.map(lambda x: _split(x, k, b), batch)
    self.sampled += k * b
    if self.limiter is not None:
      self.limiter.on_sample(k * b)
    self.time_sample += time.perf_counter() - t0
    return Sample(batch, weights, info)

  def feedback(self, info: Any, priorities: Any) -> None:
    """Writes the new priorities ``[k, batch_size]`` of the slots ``info`` names (a slot
    rewritten since it was sampled keeps its new item's priority)."""
    if info is None or not self.prioritized:
      return
    idx, gens = info
    self.replay.update_priorities(idx.ravel(), np.asarray(priorities).ravel(), gens.ravel())

  def metrics(self) -> dict[str, float]:
    """The replay's health figures (none while it is empty, or if its items have no returns):
    ``replay_terminal_fraction`` (``terminal_fraction``), ``q_bound`` (``return_bound``) and
    ``q_floor``, its other end (``min_i R_i / (1 - d_i)``: the worst stored segment repeated
    forever; the two give the scale of the values the data spans), each absent when it is
    not finite.

    Reduced over the whole filled replay at each record (10-25 ms per million items, measured
    on a loaded 2-core machine; once per ``record_interval`` SGD steps) rather than kept as running counts on add and overwrite: nothing to keep consistent through the
    ring's wrap, the frame replay's transitions dying with their oldest frame, or resume, and
    a maximum does not come out of running counts."""
    stored = self.replay.returns_and_discounts()
    if stored is None or not len(stored[1]):
      return {}
    reward, discount = stored
    out = {"replay_terminal_fraction": terminal_fraction(discount)}
    values = segment_values(reward, discount)  # (once for both ends)
    for key, value in (("q_bound", values.max()), ("q_floor", values.min())):
      if np.isfinite(value):
        out[key] = float(value)
    return out

  def summary(self) -> dict[str, float]:
    """The ``metrics`` (they keep no window: each is over the whole filled replay)."""
    return self.metrics()

  # --- resume ------------------------------------------------------------------------------
  @property
  def nbytes(self) -> int:
    """Bytes a ``state_dict`` holds at most: the replay's storage once full (it holds the
    replay's filled slots only)."""
    return int(self.replay.nbytes)

  def nbytes_within(self, env_steps: int) -> int:
    """Bytes a ``state_dict`` holds at most once ``env_steps`` env steps in all were added:
    the replay's filled slots, no more than those steps can fill."""
    items = min(self.replay.capacity, self.replay.max_items(env_steps))
    return int(self.replay.bytes_per_item * items)

  def state_dict(self) -> dict:
    """The replay's contents (a copy of its filled slots: cursor, priorities, its generator)
    and the counts the limiter reads; what a resumed run needs to sample exactly as this one
    would have."""
    state = {"replay": self.replay.state_dict(), "inserted": self.inserted,
             "sampled": self.sampled, "env_steps": self.env_steps,
             **(self.limiter.state_dict() if self.limiter is not None else {})}
    if self._prefetched is not None:  # (as before the held sample's draw: see prefetch)
      state.update({k: v for k, v in self._prefetched[1].items() if k != "rng"})
      state["replay"]["rng"] = self._saved_rng_state()
    return state

  def load_state_dict(self, state: dict) -> None:
    self.replay.load_state_dict(state["replay"])
    self.inserted, self.sampled = int(state["inserted"]), int(state["sampled"])
    self.env_steps = int(state["env_steps"])
    if self.limiter is not None:
      self.limiter.load_state_dict(state)
