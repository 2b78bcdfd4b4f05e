"""A FIFO on-policy data source with a bound on the policy lag of what it serves."""

from __future__ import annotations

import collections
from typing import Any

import jax
import numpy as np

from jaxasync.sources.base import LagTally, Sample


class QueueSource:
  """Serves items (e.g. ``Unroll``s) once each, oldest first, none staler than a bound.

  An item made with the params of version ``v`` (the learner's SGD-step count when they
  were published) has policy lag ``opt_steps - v`` when sampled at ``opt_steps``. With
  ``max_policy_lag`` set, items whose lag exceeds it are dropped (counted in
  ``dropped_stale``) before sampling: V-trace corrects for some lag, not for any.

  Not thread-safe: one learner thread owns it.

  Args:
    capacity: most items held; when full ``can_insert`` is False and the caller leaves
      data in its transport (back-pressure on the actors).
    items_per_batch: items concatenated along ``batch_axis`` into one update's batch.
    updates_per_call: batches ``k`` per ``sample``, stacked on a new leading axis.
    max_policy_lag: drop items whose lag exceeds it; ``None``: keep everything.
    batch_axis: the axis of every leaf along which items are concatenated (1 for the
      time-major ``[T + 1, B, ...]`` leaves of an ``Unroll``).
  """

  def __init__(self, capacity: int, items_per_batch: int, updates_per_call: int = 1,
               max_policy_lag: int | None = None, batch_axis: int = 1):
    if items_per_batch < 1:
      raise ValueError(f"items_per_batch must be >= 1, got {items_per_batch}.")
    if updates_per_call < 1:
      raise ValueError(f"updates_per_call must be >= 1, got {updates_per_call}.")
    per_call = items_per_batch * updates_per_call
    if capacity < per_call:
      raise ValueError(
          f"capacity ({capacity}) must be >= items_per_batch * updates_per_call "
          f"({items_per_batch} * {updates_per_call} = {per_call}), or sample() could never "
          f"be served: raise capacity or lower items_per_batch / updates_per_call.")
    if max_policy_lag is not None and max_policy_lag < 0:
      raise ValueError(f"max_policy_lag must be >= 0 or None (no bound), got "
                       f"{max_policy_lag}.")
    if batch_axis < 0:
      raise ValueError(f"batch_axis must be >= 0 (counted from the leading axis, the same "
                       f"for leaves of any rank), got {batch_axis}.")
    self.capacity, self.items_per_batch = capacity, items_per_batch
    self.updates_per_call, self.max_policy_lag = updates_per_call, max_policy_lag
    self.batch_axis = batch_axis
    self._items: collections.deque[tuple[Any, int]] = collections.deque()
    self._dropped_stale = 0
    self._window_lags = LagTally()  # the items sampled since the last metrics()
    self._attempt_lags = LagTally()  # those sampled in this attempt of the run (summary())

  def __len__(self) -> int:
    return len(self._items)

  @property
  def dropped_stale(self) -> int:
    """Items dropped for exceeding ``max_policy_lag``, in total."""
    return self._dropped_stale

  def can_insert(self, n: int = 1) -> bool:
    """Whether ``n`` more items fit (``capacity``)."""
    return len(self._items) + n <= self.capacity

  time_sample = 0.0  # (sampling is a pop and a concatenation: not timed)
  warmup_items = 0  # (served as soon as it holds one call's items)

  def start_clock(self) -> None:
    """(Nothing to time: a queue has no training-frequency cap.)"""

  def rng_states(self) -> dict:
    """(A queue draws nothing at random.)"""
    return {}

  @property
  def batch_size(self) -> int:
    """Items per update (``items_per_batch``), as the learner counts samples."""
    return self.items_per_batch

  def add(self, item: Any, version: int, env_steps: int = 0) -> int:
    """Appends ``item`` made by the params of ``version`` (an SGD-step count); returns 1, the
    items it inserted (``env_steps``, the steps it took, does not matter to a queue).

    Raises ``ValueError`` when full (check ``can_insert`` first) or when a leaf of
    ``item`` has no ``batch_axis``.
    """
    if not self.can_insert(1):
      raise ValueError(f"QueueSource is full ({self.capacity} items): check can_insert() "
                       f"and leave the data in the transport until sample() makes room.")
    for leaf in jax.tree.leaves(item):
      if np.ndim(leaf) <= self.batch_axis:
        raise ValueError(f"every leaf of an item needs batch_axis {self.batch_axis}; one "
                         f"has shape {np.shape(leaf)}.")
    self._items.append((item, int(version)))
    return 1

  def _drop_stale(self, opt_steps: int) -> None:
    lag = self.max_policy_lag
    # Items may arrive out of version order (actors adopt params at different times), so
    # stale ones are looked for everywhere, not only at the front.
    if lag is None or all(opt_steps - v <= lag for _, v in self._items):
      return
    fresh = [(x, v) for x, v in self._items if opt_steps - v <= lag]
    self._dropped_stale += len(self._items) - len(fresh)
    self._items = collections.deque(fresh)

  def needs_data(self) -> bool:
    """Whether fewer items are held than one call takes (stale ones included)."""
    return len(self._items) < self.items_per_batch * self.updates_per_call

  def can_sample(self, opt_steps: int) -> bool:
    """Whether ``sample(opt_steps)`` can be served; drops the items stale at ``opt_steps``."""
    self._drop_stale(opt_steps)
    return len(self._items) >= self.items_per_batch * self.updates_per_call

  def sample(self, opt_steps: int) -> Sample:
    """Pops the oldest fresh ``items_per_batch * updates_per_call`` items, in arrival order.

    Update ``i`` gets items ``i * m .. (i + 1) * m - 1`` (``m = items_per_batch``)
    concatenated along ``batch_axis``; the ``k`` batches are stacked on a new axis 0. For
    ``Unroll`` items ``[T + 1, B, ...]`` the batch leaves are ``[k, T + 1, m * B, ...]``.

    Raises ``ValueError`` if ``can_sample(opt_steps)`` is False.
    """
    if not self.can_sample(opt_steps):
      raise ValueError(
          f"QueueSource.sample needs {self.items_per_batch * self.updates_per_call} fresh "
          f"items and holds {len(self._items)}: check can_sample() first.")
    m, k = self.items_per_batch, self.updates_per_call
    popped = [self._items.popleft() for _ in range(m * k)]
    lags = [opt_steps - v for _, v in popped]
    self._window_lags.add(*lags)
    self._attempt_lags.add(*lags)

    def batch(*leaves):
      return np.stack([np.concatenate(leaves[i * m:(i + 1) * m], axis=self.batch_axis)
                       for i in range(k)])

    return Sample(batch=jax.tree.map(batch, *(x for x, _ in popped)), weights=None, info=None)

  def feedback(self, info: Any, feedback: Any) -> None:
    """Nothing to do: a queue serves every item once and keeps no priorities."""

  nbytes = 0  # (what state_dict keeps: no items)

  def state_dict(self) -> dict:
    """The count of dropped items; the items themselves are not kept: by the time a resumed
    run starts they would be too old to learn from on-policy."""
    return {"dropped_stale": self._dropped_stale}

  def load_state_dict(self, state: dict) -> None:
    self._dropped_stale = int(state["dropped_stale"])

  def metrics(self) -> dict[str, float]:
    """``dropped_stale`` (total) and the lag of the items sampled since the last call.

    ``policy_lag_min`` / ``_mean`` / ``_max`` are left out when nothing was sampled since
    the last call (no NaN in the logs); the lag window restarts.
    """
    out = {"dropped_stale": float(self._dropped_stale), **self._window_lags.figures()}
    self._window_lags = LagTally()
    return out

  def summary(self) -> dict[str, float]:
    """``dropped_stale`` and the lag of every item sampled in this attempt of the run
    (``policy_lag_min`` / ``_mean`` / ``_max``; left out when nothing was sampled; a resumed
    run starts them afresh, as its queue). Unlike ``metrics`` it keeps no window: the run's
    last record may have just taken it."""
    return {"dropped_stale": float(self._dropped_stale), **self._attempt_lags.figures()}
