"""The learner's devices: one, or data-parallel over several local devices (``jax.sharding``).

Data parallelism here needs no per-agent code. The learner state (params, optimizer state,
targets) is placed *replicated* on a one-axis ``Mesh`` of the learner's devices, and each
update call's batch is placed *sharded* on its batch axis (``[k, N, ...]``: axis 1;
unrolls ``[k, T + 1, N, ...]``: axis 2), so every device holds ``N / D`` items of each of the
``k`` batches. The agent's own ``jax.jit``-ed ``update`` then compiles once for those input
shardings: XLA's SPMD partitioner runs the forward and backward passes on each device's
shard and inserts the all-reduce that a loss averaged over the batch needs, so the gradients
(and the new state) are those of the whole batch, as on one device. The global batch is
unchanged by ``D``: per-device batch = ``N / D``, the replay ratio and learning figures stay.

(This is what ``pmap`` plus ``lax.pmean`` did by hand; ``jax.pmap``,
``jax.device_put_sharded`` and ``jax.device_put_replicated`` are deprecated and not used.)
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxasync.errors import ConfigError

PyTree = Any

AXIS = "batch"


def learner_devices(count: int | None = None) -> list[jax.Device]:
  """The devices the learner runs on.

  Args:
    count: how many of the local devices, the first ones of ``jax.devices()``; ``None``:
      every accelerator when there is one, else the one CPU device.

  Raises:
    ConfigError: ``count`` is below 1 or more than there are devices (naming how to get more
      CPU devices for a test).
  """
  devices = jax.local_devices()
  if count is None:
    return devices if jax.default_backend() != "cpu" else devices[:1]
  if count < 1:
    raise ConfigError(f"learner_devices must be >= 1 (or None: all accelerators), got {count}.")
  if count > len(devices):
    hint = (" On the CPU, XLA_FLAGS=--xla_force_host_platform_device_count=N set before JAX "
            "starts splits it into N devices (for tests)." if jax.default_backend() == "cpu"
            else "")
    raise ConfigError(f"learner_devices={count} but this process sees {len(devices)} "
                      f"{jax.default_backend()} device(s): {devices}. Lower learner_devices."
                      + hint)
  return devices[:count]


def check_batch_divides(batch_items: int, num_devices: int, what: str) -> None:
  """Raises ``ConfigError`` unless a batch of ``batch_items`` splits evenly over the devices."""
  if batch_items % num_devices:
    raise ConfigError(
        f"the learner's batch of {batch_items} items ({what}) does not split over "
        f"{num_devices} learner devices: each device takes batch / devices items. Make it a "
        f"multiple of {num_devices}, or set learner_devices to a divisor of {batch_items}.")


class DataParallel:
  """Places the learner's state (replicated) and batches (sharded) on ``devices``.

  Args:
    devices: the learner's devices (``learner_devices``).
    batch_axis: the batch axis of the update's batch leaves (``DataPipeline.batch_axis``: 1 for
      ``[k, N, ...]`` transitions, 2 for ``[k, T + 1, N, ...]`` unrolls).
  """

  def __init__(self, devices: Sequence[jax.Device], batch_axis: int):
    self.devices = list(devices)
    self.mesh = Mesh(np.array(self.devices), (AXIS,))
    self.replicated = NamedSharding(self.mesh, PartitionSpec())
    self.batch_sharding = NamedSharding(self.mesh, PartitionSpec(*[None] * batch_axis, AXIS))
    self.weights_sharding = NamedSharding(self.mesh, PartitionSpec(None, AXIS))
    self.batch_axis = batch_axis
    self._checked: set = set()

  @property
  def num_devices(self) -> int:
    return len(self.devices)

  def place_state(self, state: PyTree) -> PyTree:
    """``state`` replicated on every learner device (one transfer per leaf and device)."""
    return jax.device_put(state, self.replicated)

  def place_batch(self, batch: PyTree, weights: np.ndarray | None) -> tuple[PyTree, Any]:
    """``batch`` (and ``weights`` ``[k, N]``) split on the batch axis over the devices."""
    leaves = jax.tree.leaves(batch)
    sizes = {np.shape(x)[self.batch_axis] for x in leaves}
    if not sizes <= self._checked:
      for n in sizes:
        check_batch_divides(n, self.num_devices, f"axis {self.batch_axis} of the batch leaves")
      self._checked |= sizes
    batch = jax.device_put(batch, self.batch_sharding)
    if weights is not None:
      weights = jax.device_put(weights, self.weights_sharding)
    return batch, weights


def constrain_to_batch_shards(tree: PyTree, axis: int = 0) -> PyTree:
  """Inside a jitted update: asks that ``tree``'s leaves stay split over the learner's devices
  on ``axis``; a no-op on one device.

  Data parallelism follows from the input shardings by itself wherever the batch axis flows
  through elementwise maths, reductions and reshapes that keep it outermost. A gather with
  indices that mix items across devices (a shuffle into minibatches) loses it: XLA then
  replicates the result and every device computes every minibatch. This puts the split back.
  It works under the mesh the ``Learner`` sets while it calls ``update`` (``jax.set_mesh``).
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or AXIS not in mesh.axis_names:
    return tree
  size = mesh.shape[AXIS]

  def constrain(x):
    if x.ndim <= axis or x.shape[axis] % size:
      return x
    return jax.lax.with_sharding_constraint(x, PartitionSpec(*[None] * axis, AXIS))

  return jax.tree.map(constrain, tree)
