"""Where the learner publishes ``ModelInfo`` and actors pick it up: the one path params take.

Implementations of one interface (``ParamStore``):
  * ``ThreadParamStore``: a reference swap under a lock, for actor threads (and the
    synchronous run's lock-step actor). It holds device copies (``device_copy``): one
    dispatch per publication instead of a host round trip, which cost the sync loop more
    than its SGD step (docs/bench_learning_results.md, issue 28).
  * ``SharedParamStore``: one preallocated shared-memory block holding the flat
    params plus a version counter, for actor processes. Publishing is a memcpy;
    actors copy out only when the version moved. It is a seqlock, not a lock: an
    actor killed while copying cannot leave anything held that the learner waits on.
Actors read ``version`` (a plain load) every step and call ``get`` only when it
changed, so reading never stalls the learner for longer than one copy.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from jaxasync.types import ModelInfo

PyTree = Any


def host_copy(tree: PyTree) -> PyTree:
  """Numpy copies of ``tree``'s leaves (one device-to-host transfer for the whole tree): what
  is published, evaluated in another thread or checkpointed while the learner's own buffers
  may be donated to its next update call."""
  return jax.tree.map(np.array, jax.device_get(tree))


@jax.jit
def device_copy(tree: PyTree) -> PyTree:
  """Copies of ``tree``'s leaves on their own devices, in one dispatch: what an in-process
  store publishes, never donated by the learner's next update (which donates its state)."""
  return jax.tree.map(jnp.copy, tree)


def to_cpu(params: PyTree, published: bool = False) -> PyTree:
  """``params`` for jitted acting on the CPU. ``published`` params (what a ``ParamStore``
  holds: host copies or ``device_copy``s) are written by nobody again: host copies are acted
  on as they are (numpy; each call moves them), device copies go to the CPU device (as they
  are when already there). Anything else (device arrays the learner may donate) is copied to
  the host first, then put on the CPU device."""
  cpu, leaves = jax.devices("cpu")[0], jax.tree.leaves(params)
  if published and all(isinstance(x, np.ndarray) for x in leaves):
    # A process or Ray actor's copy of a publication: a device_put of the IMPALA CartPole
    # params took ~0.37 ms per adoption, where acting on numpy costs ~5 us more per call;
    # an actor adopting every SGD step's publication spent a fifth of its time on the puts
    # (docs/bench_learning_results.md, "Placement by default").
    return params
  if published and all(isinstance(x, jax.Array) and x.devices() == {cpu} for x in leaves):
    # Already there (an in-process store on a CPU learner): a device_put would copy nothing
    # but wait for the update in flight, and its dispatch costs ~0.1 ms per adoption.
    return params
  if not published and not all(isinstance(x, np.ndarray) for x in leaves):
    params = host_copy(params)
  return jax.device_put(params, cpu)


class ParamStore(Protocol):
  """Where the learner publishes ``ModelInfo`` and actors (or inference servers) read it."""

  host_params: bool
  """Whether publications must be host (numpy) copies: True for stores that leave the
  process (shared memory, Ray); False for in-process ones, given ``device_copy``s."""

  @property
  def version(self) -> int:
    """The latest publication's version, -1 before the first (a cheap read, every step)."""

  def publish(self, info: ModelInfo) -> None:
    """Makes ``info`` the latest publication (one publisher: the learner's loop)."""

  def get(self) -> ModelInfo | None:
    """The latest publication, None before the first."""


class ThreadParamStore:
  """Latest ``ModelInfo`` shared by threads of one process (device copies: ``host_params``
  False)."""

  host_params = False

  def __init__(self):
    self._lock = threading.Lock()
    self._info: ModelInfo | None = None

  @property
  def version(self) -> int:
    info = self._info
    return -1 if info is None else info.version

  def publish(self, info: ModelInfo) -> None:
    with self._lock:
      if self._info is None or info.version >= self._info.version:
        self._info = info

  def get(self) -> ModelInfo | None:
    with self._lock:
      return self._info


class SharedParamStore:
  """Latest ``ModelInfo`` in shared memory, readable from spawned processes.

  Args:
    template: a params pytree with the shapes and dtypes every publication has.
    ctx: the multiprocessing context (spawn) the actor processes use.
  """

  host_params = True

  def __init__(self, template: PyTree, ctx=None):
    ctx = ctx or mp.get_context("spawn")
    leaves, self._treedef = jax.tree_util.tree_flatten(template)
    leaves = [np.asarray(x) for x in leaves]
    self._specs = [(x.shape, x.dtype.str) for x in leaves]
    self._offsets = np.cumsum([0] + [x.nbytes for x in leaves]).tolist()
    self._buffer = ctx.RawArray("b", max(1, self._offsets[-1]))
    self._version = ctx.RawValue("q", -1)
    # Seqlock: odd while the (single) publisher writes; readers retry if it moved meanwhile.
    self._seq = ctx.RawValue("q", 0)
    self._views = None

  def __getstate__(self):
    state = self.__dict__.copy()
    state["_views"] = None  # numpy views are rebuilt on the other side
    return state

  def _leaf_views(self) -> list[np.ndarray]:
    if self._views is None:
      raw = np.frombuffer(self._buffer, dtype=np.uint8)
      self._views = [raw[a:b].view(np.dtype(dt)).reshape(shape)
                     for (shape, dt), a, b in zip(self._specs, self._offsets, self._offsets[1:])]
    return self._views

  @property
  def version(self) -> int:
    return self._version.value

  def publish(self, info: ModelInfo) -> None:
    """Writes ``info`` (one publisher: the learner's loop); never waits on readers."""
    leaves = jax.tree_util.tree_leaves(info.params)
    self._seq.value += 1
    try:
      for view, x in zip(self._leaf_views(), leaves):
        view[...] = x
      self._version.value = info.version
    finally:
      self._seq.value += 1

  def get(self) -> ModelInfo | None:
    """The latest publication, copied out whole (retried if a publication overlapped the copy)."""
    views = self._leaf_views()
    while True:
      seq = self._seq.value
      if seq & 1:
        time.sleep(0.0005)
        continue
      version = self._version.value
      if version < 0:
        return None
      leaves = [v.copy() for v in views]
      if self._seq.value == seq:
        return ModelInfo(version, jax.tree_util.tree_unflatten(self._treedef, leaves))
