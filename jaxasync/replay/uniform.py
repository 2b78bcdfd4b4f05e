"""A preallocated numpy ring buffer over an arbitrary pytree of arrays."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from jaxasync.types import Transition

PyTree = Any


class ReplayBuffer:
  """Uniform-sampling FIFO ring buffer with storage preallocated from an example.

  Storage is one numpy array per leaf of ``example`` with a leading ``capacity``
  axis, allocated once. ``add`` writes a chunk (leading batch axis) with at most
  two slice assignments, wrapping around; ``sample`` draws uniformly with its own
  seeded ``numpy.random.Generator``.

  Args:
    example: one item (no batch axis): any pytree of arrays, any dtypes.
    capacity: the number of items kept; the oldest are overwritten first.
    seed: seed of the sampling generator.
  """

  def __init__(self, example: PyTree, capacity: int, seed: int = 0):
    if capacity < 1:
      raise ValueError(f"replay capacity must be >= 1, got {capacity}; pass a positive capacity.")
    leaves, self._treedef = jax.tree_util.tree_flatten(example)
    if not leaves:
      raise ValueError("replay example has no array leaves; pass one item, e.g. a Transition of arrays.")
    leaves = [np.asarray(x) for x in leaves]
    self._item_shapes = [x.shape for x in leaves]
    self._dtypes = [x.dtype for x in leaves]
    self._storage = [np.zeros((capacity,) + x.shape, x.dtype) for x in leaves]
    self._capacity = capacity
    self._next = 0  # slot the next item is written to
    self._size = 0
    self._added_total = 0
    self._rng = np.random.default_rng(seed)

  # --- introspection -------------------------------------------------------
  def __len__(self) -> int:
    return self._size

  @property
  def capacity(self) -> int:
    return self._capacity

  @property
  def added_total(self) -> int:
    """Items ever added (including the ones since overwritten)."""
    return self._added_total

  @property
  def rng_state(self) -> dict:
    """The sampling generator's state (for checkpoint metadata)."""
    return self._rng.bit_generator.state

  @property
  def filled(self) -> int:
    """Slots written at least once: ``[0, filled)``, since writing starts at slot 0 and goes
    round (``capacity`` once the ring has wrapped)."""
    return min(self._added_total, self._capacity)

  @property
  def nbytes(self) -> int:
    """Bytes held by the preallocated storage."""
    return sum(x.nbytes for x in self._storage)

  @property
  def bytes_per_item(self) -> float:
    return self.nbytes / self._capacity

  def max_items(self, env_steps: int) -> int:
    """The most items ``env_steps`` env steps can add: one each (an n-step collector emits
    at most one transition per env step)."""
    return env_steps

  # --- writing -------------------------------------------------------------
  def _check_chunk(self, chunk: PyTree) -> list[np.ndarray]:
    leaves, treedef = jax.tree_util.tree_flatten(chunk)
    if treedef != self._treedef:
      raise ValueError(
          f"chunk structure {treedef} does not match the replay's {self._treedef}; "
          "push items built like the example the buffer was created with.")
    leaves = [np.asarray(x) for x in leaves]
    n = leaves[0].shape[0] if leaves and leaves[0].ndim else None
    for i, (x, shape, dtype) in enumerate(zip(leaves, self._item_shapes, self._dtypes)):
      if x.ndim != len(shape) + 1 or x.shape[1:] != shape or x.shape[0] != n:
        raise ValueError(
            f"chunk leaf {i} has shape {x.shape}, expected (batch, *{shape}) with one batch size "
            "for all leaves; add chunks with a leading batch axis.")
      if x.dtype != dtype:
        raise ValueError(
            f"chunk leaf {i} has dtype {x.dtype}, expected {dtype}; cast it before adding.")
    return leaves

  def add(self, chunk: PyTree) -> np.ndarray:
    """Adds a chunk of items (leading batch axis). Returns the slots written, ``[n]``."""
    leaves = self._check_chunk(chunk)
    n = leaves[0].shape[0]
    if n == 0:
      return np.zeros((0,), np.int64)
    if n > self._capacity:  # only the newest `capacity` items survive anyway
      leaves = [x[-self._capacity:] for x in leaves]
      self._added_total += n - self._capacity
      n = self._capacity
    start = self._next
    first = min(n, self._capacity - start)
    for store, x in zip(self._storage, leaves):
      store[start:start + first] = x[:first]
      if first < n:
        store[:n - first] = x[first:]
    slots = (start + np.arange(n)) % self._capacity
    self._next = (start + n) % self._capacity
    self._size = min(self._size + n, self._capacity)
    self._added_total += n
    return slots

  # --- reading -------------------------------------------------------------
  def _check_sample_size(self, batch_size: int) -> None:
    """Raises ``ValueError`` unless ``1 <= batch_size <= len(self)``, naming the fix."""
    if batch_size < 1:
      raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
    if batch_size > self._size:
      raise ValueError(
          f"cannot sample {batch_size} items from a replay holding {self._size}; "
          "wait until warmup fills it (warmup_period >= batch_size).")

  def sample_indices(self, batch_size: int) -> np.ndarray:
    """Uniform slots, ``[batch_size]``, drawn with replacement."""
    self._check_sample_size(batch_size)
    return self._rng.integers(0, self._size, size=batch_size)

  def gather(self, indices: np.ndarray) -> PyTree:
    """Items at ``indices`` as a pytree with leading axes ``indices.shape``."""
    # (ndarray.take: ~3x faster than fancy indexing for the same items)
    return jax.tree_util.tree_unflatten(
        self._treedef, [store.take(indices, axis=0) for store in self._storage])

  def sample(self, batch_size: int) -> PyTree:
    """A uniform batch, a pytree with leading axis ``[batch_size]``."""
    return self.gather(self.sample_indices(batch_size))

  def returns_and_discounts(self) -> tuple[np.ndarray, np.ndarray] | None:
    """The stored items' n-step returns and bootstrap discounts, ``([N], [N])`` views of the
    filled slots (``N = len(self)``; slots ``[0, N)`` are the filled ones: writing starts at
    slot 0); ``None`` when the items are not ``Transition``s (no such fields)."""
    stored = jax.tree_util.tree_unflatten(self._treedef,
                                          [s[:self._size] for s in self._storage])
    if not isinstance(stored, Transition):
      return None
    return stored.reward, stored.discount

  # --- checkpointing -------------------------------------------------------
  def state_dict(self) -> dict:
    """A copy of the state. Its arrays hold the ``filled`` slots only, leaves
    ``[filled, *item_shape]``: a checkpoint of a partly filled ring costs what it stores,
    not its capacity (slots past ``filled`` hold nothing: ``load_state_dict`` blanks them)."""
    n = self.filled
    return {
        "capacity": self._capacity, "storage": [x[:n].copy() for x in self._storage],
        "next": self._next, "size": self._size, "added_total": self._added_total,
        "rng": self._rng.bit_generator.state}

  def load_state_dict(self, state: dict) -> None:
    """Puts back a ``state_dict``: this buffer then samples and inserts exactly as the saved
    one would have. Takes full-ring arrays ``[capacity, ...]`` too (what checkpoints held
    before they were trimmed to ``filled``)."""
    stored = [np.asarray(x) for x in state["storage"]]
    filled = self._saved_filled(state, stored[0] if stored else None)
    if len(stored) != len(self._storage):
      raise ValueError("replay state does not match this buffer's capacity, structure or dtypes; "
                       "restore into a buffer built with the same example and capacity.")
    for i, (x, store) in enumerate(zip(stored, self._storage)):
      check_saved_prefix(f"storage leaf {i}", x, store, filled)
    for x, store in zip(stored, self._storage):
      restore_prefix(store, x, 0)
    self._next, self._size = int(state["next"]), int(state["size"])
    self._added_total = int(state["added_total"])
    self._rng.bit_generator.state = state["rng"]

  def _saved_filled(self, state: dict, first: np.ndarray | None) -> int:
    """The saved buffer's ``filled``, once its capacity is checked to be this one's (a state
    without ``capacity`` holds full rings: its arrays' length is the capacity)."""
    saved = state.get("capacity", None if first is None else len(first))
    if saved is None or int(saved) != self._capacity:
      raise ValueError(
          f"replay state has capacity {saved}, this buffer {self._capacity}; restore into a "
          "buffer built with the same example and capacity.")
    return min(int(state["added_total"]), self._capacity)


def check_saved_prefix(name: str, x: np.ndarray, store: np.ndarray, filled: int) -> None:
  """Raises ``ValueError`` unless ``x`` fits ``store`` ``[capacity, ...]`` as a saved prefix:
  its first ``n`` slots, ``filled <= n <= capacity``, same item shape and dtype (or float64
  into float32: observations saved before ``types.storage_dtype`` stored them as float32)."""
  n = x.shape[0] if x.ndim else -1
  widened = x.dtype == np.float64 and store.dtype == np.float32
  if (x.shape[1:] != store.shape[1:] or (x.dtype != store.dtype and not widened)
      or not filled <= n <= store.shape[0]):
    raise ValueError(
        f"replay state {name} is {x.shape} {x.dtype}; this buffer needs ({filled} to "
        f"{store.shape[0]}, *{store.shape[1:]}) {store.dtype}. Restore into a buffer built "
        "with the same example and capacity.")


def restore_prefix(store: np.ndarray, x: np.ndarray, blank) -> None:
  """Copies a saved prefix ``x`` ``[n, ...]`` into ``store`` ``[capacity, ...]`` and sets the
  rest to ``blank``, what a never-written slot holds."""
  n = x.shape[0]
  store[:n] = x
  store[n:] = blank
