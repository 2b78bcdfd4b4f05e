"""What a data source hands the learner, and the interface every source has.

A data source sits between the transport (chunks from actors) and the learner's update. The
learner loop calls, and only calls:

* ``add(payload, version, env_steps) -> items``: one chunk's collector output, made with the
  params of ``version``, for ``env_steps`` env steps; returns the items it counts as inserted;
* ``can_insert() -> bool``: whether one more chunk may come in now (``False`` holds the chunks
  in the bounded transport, so actors block: back-pressure);
* ``can_sample(opt_steps) -> bool``: whether one update call can be served now;
* ``needs_data() -> bool``: whether the next call waits for more items (and not, say, for the
  clock of a training-frequency cap): the loop then takes chunks even when actors are ahead;
* ``sample(opt_steps) -> Sample``: the data of one update call of ``updates_per_call`` SGD steps;
* ``feedback(info, feedback)``: what the agent's update returned for that call (new priorities);
* ``metrics() -> dict``: figures to record; ``rng_states() -> dict``: generator states for
  checkpoint metadata; ``start_clock()``: the run starts; ``time_sample``: seconds sampling;
* ``updates_per_call``, ``batch_size`` and ``__len__``.

Two kinds: ``ReplaySource`` (off-policy: a replay, a rate limit, priorities) and
``QueueSource`` (on-policy: FIFO, each item once, a bound on policy lag).
"""

from __future__ import annotations

from typing import Any, NamedTuple

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
