"""Proportional prioritized experience replay (Schaul et al., 2016)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from jaxasync.replay.sum_tree import SumTree
from jaxasync.replay.uniform import ReplayBuffer, restore_prefix

PyTree = Any


def linear_beta(step: int, total_steps: int, beta0: float) -> float:
  """Importance-sampling exponent annealed linearly from ``beta0`` to 1.

  Args:
    step: the current step; clamped to ``[0, total_steps]``.
    total_steps: the step at which beta reaches 1.0 (and stays there).
    beta0: beta at step 0.

  Returns:
    ``beta0 + (1 - beta0) * min(step / total_steps, 1)`` as a Python float.
  """
  if total_steps <= 0:
    raise ValueError(f"total_steps must be > 0 to anneal beta, got {total_steps}.")
  frac = min(max(step, 0), total_steps) / total_steps
  return float(beta0 + (1.0 - beta0) * frac)


class PrioritizedReplayBuffer(ReplayBuffer):
  """A ring buffer that samples slot ``i`` with probability ``P(i) ∝ p_i^alpha``.

  Storage, ``add``, ``gather`` and chunk validation are the uniform buffer's; a
  :class:`SumTree` over the slots holds ``(p_i + eps)^alpha`` (zero for slots
  never written). New items enter at the largest priority seen so far, so
  each is replayed at least once with high probability before its TD error is
  known (as in Dopamine and Acme).

  Because the learner is asynchronous, the priorities of a sampled batch come
  back after actors may have overwritten some of its slots. Each slot therefore
  has a write ``generation``; ``sample`` returns it, and ``update_priorities``
  drops entries whose slot has been rewritten since.

  Args:
    example: one item (no batch axis): any pytree of arrays, any dtypes.
    capacity: the number of items kept; the oldest are overwritten first.
    seed: seed of the sampling generator.
    alpha: priority exponent; 0 is uniform sampling, 1 fully proportional.
    beta: importance-sampling exponent used when ``sample`` gets no ``beta``;
      settable, the trainer anneals it to 1 (see :func:`linear_beta`).
    eps: added to every priority before the exponent so that no stored item
      gets zero probability.
  """

  def __init__(self, example: PyTree, capacity: int, seed: int = 0,
               alpha: float = 0.6, beta: float = 0.4, eps: float = 1e-6):
    super().__init__(example, capacity, seed)
    if not (math.isfinite(alpha) and alpha >= 0):
      raise ValueError(f"alpha must be finite and >= 0, got {alpha}.")
    if not (math.isfinite(eps) and eps >= 0):
      raise ValueError(f"eps must be finite and >= 0, got {eps}.")
    self._alpha = float(alpha)
    self._eps = float(eps)
    self.beta = beta
    self._tree = SumTree(capacity)
    self._generation = np.zeros((capacity,), np.int64)
    self._max_priority = 1.0  # raw p (before eps and alpha), as in Dopamine

  # --- introspection -------------------------------------------------------
  @property
  def alpha(self) -> float:
    return self._alpha

  @property
  def eps(self) -> float:
    return self._eps

  @property
  def beta(self) -> float:
    return self._beta

  @beta.setter
  def beta(self, value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
      raise ValueError(f"beta must be finite and >= 0, got {value}.")
    self._beta = float(value)

  @property
  def max_priority(self) -> float:
    """The largest raw priority seen so far (1.0 before any update)."""
    return self._max_priority

  @property
  def sum_tree(self) -> SumTree:
    """The tree of stored ``(p + eps)^alpha`` values; read it, do not write it."""
    return self._tree

  @property
  def generation(self) -> np.ndarray:
    """How many times each slot was written, ``[capacity]`` int64 (read-only view)."""
    view = self._generation.view()
    view.flags.writeable = False
    return view

  def _stored(self, priorities: np.ndarray) -> np.ndarray:
    return (np.asarray(priorities, np.float64) + self._eps) ** self._alpha

  # --- writing -------------------------------------------------------------
  def add(self, chunk: PyTree) -> np.ndarray:
    """Adds a chunk at the max priority so far. Returns the slots written, ``[n]``."""
    slots = super().add(chunk)
    # `slots` never repeats: the parent keeps at most `capacity` items per chunk.
    self._tree.update(slots, self._stored(self._max_priority))
    self._generation[slots] += 1
    return slots

  def update_priorities(self, indices: np.ndarray, priorities: np.ndarray,
                        generations: np.ndarray) -> int:
    """Sets the priorities of sampled slots that were not overwritten since.

    Args:
      indices: slots as returned by ``sample``, ``[B]``; repeats allowed, the
        last one wins.
      priorities: non-negative finite raw priorities (e.g. ``|td_error|``), ``[B]``.
      generations: the ``generations`` returned by ``sample`` with ``indices``,
        ``[B]``. Entries whose slot generation differs now hold a newer item and
        are ignored.

    Returns:
      The number of entries applied (``B`` minus the stale ones).
    """
    indices = np.asarray(indices)
    priorities = np.asarray(priorities, np.float64)
    generations = np.asarray(generations)
    if not indices.shape == priorities.shape == generations.shape:
      raise ValueError(
          f"indices {indices.shape}, priorities {priorities.shape} and generations "
          f"{generations.shape} must have the same shape; pass what sample returned.")
    if not np.all(np.isfinite(priorities)) or np.any(priorities < 0):
      bad = priorities[~(np.isfinite(priorities) & (priorities >= 0))]
      raise ValueError(
          f"priorities must be finite and >= 0 (e.g. |td_error|), got {bad[:5]}; "
          "check the loss for NaNs or take the absolute value.")
    if indices.size and (indices.min() < 0 or indices.max() >= self._capacity):
      raise ValueError(
          f"indices must lie in [0, {self._capacity}), got range "
          f"[{indices.min()}, {indices.max()}].")
    # Generation 0 means never written: matching it would give an empty slot
    # mass, so such entries are dropped like stale ones.
    current = self._generation[indices]
    live = (current == generations) & (current > 0)
    if not np.any(live):
      return 0
    indices, priorities = indices[live], priorities[live]
    self._tree.update(indices, self._stored(priorities))
    self._max_priority = max(self._max_priority, float(priorities.max()))
    return int(live.sum())

  # --- reading -------------------------------------------------------------
  def sample_indices(self, batch_size: int, num_batches: int = 1) -> np.ndarray:
    """Slots drawn proportionally to priority, ``[num_batches * batch_size]`` int64.

    Each consecutive block of ``batch_size`` is one stratified batch over the whole
    buffer: one uniform target in each of ``batch_size`` equal segments of the priority
    mass. (Stratifying all ``num_batches * batch_size`` draws at once would give each
    block one contiguous range of slots, i.e. one age band of a ring buffer.)
    """
    self._check_sample_size(batch_size)
    if num_batches < 1:
      raise ValueError(f"num_batches must be >= 1, got {num_batches}.")
    # Each slot is still expected B * P(i) times per batch, with lower variance than
    # i.i.d. draws. A target that float error puts at `total` is clamped by `find` to a
    # positive-mass leaf.
    segment = self._tree.total / batch_size
    u = self._rng.uniform(size=(num_batches, batch_size))
    return self._tree.find(((np.arange(batch_size) + u) * segment).reshape(-1))

  def sample(self, batch_size: int, beta: float | None = None, num_batches: int = 1
             ) -> tuple[PyTree, np.ndarray, np.ndarray, np.ndarray]:
    """``num_batches`` prioritized batches with their importance-sampling weights.

    Args:
      batch_size: the number of items per batch, ``B``.
      beta: importance-sampling exponent; defaults to ``self.beta``.
      num_batches: ``k`` independent batches (one per SGD step of an update call),
        concatenated: item ``j * B + i`` is item ``i`` of batch ``j``.

    Returns:
      ``(batch, indices, weights, generations)``: the items as a pytree with
      leading axis ``[k * B]``; their slots, ``[k * B]`` int64; the weights
      ``w_i = (N P(i))^-beta / max_{j in i's batch} w_j``, ``[k * B]`` float32 with max 1
      in each batch (``N`` is ``len(self)``); the slots' write generations, ``[k * B]``
      int64, to hand back to ``update_priorities``.
    """
    beta = self._beta if beta is None else float(beta)
    if not (math.isfinite(beta) and beta >= 0):
      raise ValueError(f"beta must be finite and >= 0, got {beta}.")
    indices = self.sample_indices(batch_size, num_batches)
    probs = self._tree.get(indices) / self._tree.total  # > 0: `find` avoids empty leaves
    weights = ((self._size * probs) ** -beta).reshape(num_batches, batch_size)
    weights /= weights.max(axis=1, keepdims=True)
    return (self.gather(indices), indices, weights.reshape(-1).astype(np.float32),
            self._generation[indices].copy())

  # --- checkpointing -------------------------------------------------------
  def state_dict(self) -> dict:
    """The uniform buffer's state plus the stored priorities ``(p + eps)^alpha`` and the
    write generations, ``[filled]`` each (slots never written hold 0 in both)."""
    state = super().state_dict()
    n = self.filled
    state.update(
        priorities=self._tree.get(np.arange(n)),
        generation=self._generation[:n].copy(),
        max_priority=self._max_priority,
        alpha=self._alpha, eps=self._eps, beta=self._beta)
    return state

  def load_state_dict(self, state: dict) -> None:
    # Stored values are (p + eps)^alpha: under another alpha or eps they mean
    # other probabilities, so refuse rather than silently reweight.
    if (float(state["alpha"]), float(state["eps"])) != (self._alpha, self._eps):
      raise ValueError(
          f"checkpoint has alpha={state['alpha']}, eps={state['eps']} but this replay "
          f"has alpha={self._alpha}, eps={self._eps}; build the replay with the same ones.")
    priorities = np.asarray(state["priorities"], np.float64)
    generation = np.asarray(state["generation"], np.int64)
    filled = min(int(state["added_total"]), self._capacity)
    for name, x in (("priorities", priorities), ("generation", generation)):
      if x.ndim != 1 or not filled <= x.shape[0] <= self._capacity:
        raise ValueError(
            f"checkpoint {name} {x.shape} do not fit capacity {self._capacity} with "
            f"{filled} slots filled.")
    super().load_state_dict(state)
    # Every leaf is written, the unsaved ones as 0, so that no slot keeps mass from before
    # the load; each node is then the sum of its children, as in the saved tree.
    leaves = np.zeros(self._capacity, np.float64)
    leaves[:priorities.shape[0]] = priorities
    self._tree.update(np.arange(self._capacity), leaves)
    restore_prefix(self._generation, generation, 0)
    self._max_priority = float(state["max_priority"])
    self.beta = float(state["beta"])
