"""A vectorized numpy sum tree for proportional prioritized sampling."""

from __future__ import annotations

import numpy as np


class SumTree:
  """A binary sum tree over ``capacity`` non-negative float64 leaves.

  The tree is one flat array ``nodes`` of size ``2 * width``, where ``width`` is
  ``capacity`` rounded up to a power of two: the root is ``nodes[1]``, the
  children of node ``k`` are ``2k`` and ``2k + 1``, and leaf ``i`` is
  ``nodes[width + i]``. Padding leaves (``i >= capacity``) stay zero, so they
  carry no mass and are never found.

  Every operation works on a whole batch at once and loops only over the
  ``log2(width)`` tree levels, never over items. Internal nodes are always
  recomputed as the sum of their two children (never incremented), so the
  totals do not drift however many updates are applied.

  Args:
    capacity: the number of leaves.
  """

  def __init__(self, capacity: int):
    if capacity < 1:
      raise ValueError(f"sum tree capacity must be >= 1, got {capacity}.")
    self._capacity = capacity
    self._width = 1 << (capacity - 1).bit_length()  # leaves, padded to 2^depth
    self._depth = self._width.bit_length() - 1  # levels below the root
    self._nodes = np.zeros((2 * self._width,), np.float64)
    self._max = 0.0

  @property
  def capacity(self) -> int:
    return self._capacity

  @property
  def total(self) -> float:
    """The sum of all leaves."""
    return float(self._nodes[1])

  @property
  def max(self) -> float:
    """The largest value ever written to a leaf (a running max, never lowered)."""
    return self._max

  def _check_indices(self, indices) -> np.ndarray:
    indices = np.asarray(indices)
    if indices.size and not np.issubdtype(indices.dtype, np.integer):
      raise ValueError(f"sum tree indices must be integers, got dtype {indices.dtype}.")
    indices = indices.astype(np.int64).reshape(-1)
    if indices.size and (indices.min() < 0 or indices.max() >= self._capacity):
      raise ValueError(
          f"sum tree indices must lie in [0, {self._capacity}), got range "
          f"[{indices.min()}, {indices.max()}].")
    return indices

  def get(self, indices: np.ndarray) -> np.ndarray:
    """Leaf values at ``indices``, float64 with the shape of ``indices`` (a copy)."""
    shape = np.shape(indices)
    return self._nodes[self._width + self._check_indices(indices)].reshape(shape)

  def update(self, indices: np.ndarray, values: np.ndarray) -> None:
    """Sets leaves ``indices`` to ``values`` and recomputes their ancestors.

    Args:
      indices: leaf indices, any shape; duplicates are allowed and the last
        occurrence (in C order) wins.
      values: finite non-negative values, broadcastable to ``indices``.
    """
    values = np.asarray(values, np.float64)
    idx_shape = np.shape(indices)
    indices = self._check_indices(indices)
    values = np.broadcast_to(values, idx_shape).reshape(-1)
    if not indices.size:
      return
    if not np.all(np.isfinite(values)) or np.any(values < 0):
      raise ValueError(
          f"sum tree values must be finite and >= 0, got min {values.min()}, "
          f"max {values.max()}.")
    # Fancy assignment with repeated indices does not promise which write lands,
    # so keep only the last occurrence of each index explicitly: the first
    # occurrence in the reversed array is the last one in the original.
    _, first_in_reversed = np.unique(indices[::-1], return_index=True)
    keep = indices.size - 1 - first_in_reversed
    indices, values = indices[keep], values[keep]
    nodes = self._nodes
    pos = self._width + indices
    nodes[pos] = values
    self._max = max(self._max, float(values.max()))
    for _ in range(self._depth):
      # `unique` bounds the work per level by the number of distinct ancestors.
      pos = np.unique(pos // 2)
      nodes[pos] = nodes[2 * pos] + nodes[2 * pos + 1]

  def find(self, targets: np.ndarray) -> np.ndarray:
    """Leaves whose cumulative-sum interval contains each target.

    With ``targets`` uniform in ``[0, total)``, leaf ``i`` is returned with
    probability ``value_i / total``. Targets outside that range (including the
    ones float error pushes to ``total`` or beyond) are clamped: the descent only
    enters a child with positive mass, so the result is always a leaf in
    ``[0, capacity)`` with a positive value.

    Args:
      targets: cumulative-mass targets, any shape.

    Returns:
      int64 leaf indices with the shape of ``targets``.
    """
    targets = np.asarray(targets, np.float64)
    shape = targets.shape
    if not self._nodes[1] > 0:
      raise ValueError(
          "cannot search a sum tree whose total is 0; give some leaf a positive value first.")
    t = np.clip(targets.reshape(-1), 0.0, None)
    t[np.isnan(t)] = 0.0
    node = np.ones(t.shape, np.int64)
    nodes = self._nodes
    for _ in range(self._depth):
      left = 2 * node
      left_mass, right_mass = nodes[left], nodes[left + 1]
      # Go right when the target is past the left mass and the right side has
      # mass; a node entered has positive mass, so if the right child is empty
      # the left one is not. Hence every visited node, and the leaf, is > 0.
      go_right = (t >= left_mass) & (right_mass > 0)
      t = np.where(go_right, t - left_mass, t)
      node = left + go_right
    return (node - self._width).reshape(shape)
