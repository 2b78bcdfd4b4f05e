"""What a data source hands the learner (``Sample``), and the contract every source keeps
(``DataSource``): the learner loop calls these members and nothing else.

Two kinds: ``ReplaySource`` (off-policy: a replay, a rate limit, priorities) and
``QueueSource`` (on-policy: FIFO, each item once, a bound on policy lag). An agent's data
pipeline (``jaxasync.pipeline``) builds one.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np


class Sample(NamedTuple):
  """What a data source hands the learner for one call of ``updates_per_call`` updates.

  Attributes:
    batch: pytree; every leaf has a leading ``[k]`` axis (``k = updates_per_call``), then
      the item's own axes with the batch axis grown to the batch size.
    weights: importance weights ``[k, batch_size]`` (prioritized replay), or ``None``.
    info: what ``feedback()`` needs back (a prioritized replay: the slots and their write
      generations), or ``None``.
  """

  batch: Any
  weights: np.ndarray | None
  info: Any


class LagTally:
  """The policy lags (SGD steps between the params that made an item and the learner's
  count) of a stream of items, as running min, max, sum and count: no list that grows."""

  def __init__(self):
    self.low, self.high, self.total, self.count = float("inf"), float("-inf"), 0, 0

  def add(self, *lags: int) -> None:
    self.low, self.high = min(self.low, *lags), max(self.high, *lags)
    self.total, self.count = self.total + sum(lags), self.count + len(lags)

  def figures(self) -> dict[str, float]:
    """``policy_lag_min`` / ``_mean`` / ``_max``; empty when nothing was added."""
    if not self.count:
      return {}
    return {"policy_lag_min": float(self.low), "policy_lag_mean": self.total / self.count,
            "policy_lag_max": float(self.high)}


@runtime_checkable
class DataSource(Protocol):
  """Sits between the transport (chunks from actors) and the learner's update.

  Attributes:
    updates_per_call: ``k``, the SGD steps one ``sample`` serves.
    batch_size: items per SGD step, as the learner counts samples.
    warmup_items: items it must hold before the first call (a replay's warmup; 0 for a
      queue), which the stall watchdog names when the run is stuck filling it.
    time_sample: seconds spent in ``sample``.
    nbytes: the most bytes its ``state_dict`` holds (whether checkpoints can afford it).
  """

  updates_per_call: int
  batch_size: int
  warmup_items: int
  time_sample: float
  nbytes: int

  def __len__(self) -> int:
    """Items held."""

  def add(self, payload: Any, version: int, env_steps: int) -> int:
    """One chunk's collector output, made with the params of ``version``, for ``env_steps``
    env steps; returns the items it counts as inserted."""

  def can_insert(self) -> bool:
    """Whether one more chunk may come in now (``False`` holds chunks in the bounded
    transport, so actors block: back-pressure)."""

  def needs_data(self) -> bool:
    """Whether the next call waits for more items (and not, say, for the clock of a
    training-frequency cap): the loop then takes chunks even when actors are ahead."""

  def can_sample(self, opt_steps: int) -> bool:
    """Whether one update call can be served now."""

  def sample(self, opt_steps: int) -> Sample:
    """The data of one update call of ``updates_per_call`` SGD steps."""

  def feedback(self, info: Any, feedback: Any) -> None:
    """What the agent's update returned for that call (new priorities), with ``Sample.info``."""

  def metrics(self) -> dict[str, float]:
    """Figures to record (it may keep a window that each call restarts)."""

  def summary(self) -> dict[str, float]:
    """Figures for the run's ``summary.json``: no window (the run's last record may have just
    restarted ``metrics``'s), and calling it changes nothing. Over this attempt of the run
    where ``state_dict`` does not keep them (a resumed ``QueueSource`` starts afresh)."""

  def rng_states(self) -> dict:
    """Generator states for checkpoint metadata."""

  def start_clock(self) -> None:
    """The run starts (a training-frequency cap counts from here)."""

  def state_dict(self) -> dict:
    """What a resumed run needs to continue (numpy arrays and scalars)."""

  def load_state_dict(self, state: dict) -> None:
    """Puts back a ``state_dict``."""
