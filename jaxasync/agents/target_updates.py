"""How a target network follows the online network: one frozen dataclass per scheme, chosen by
one config field (``DQNConfig.target_update``), so a scheme shows only its own setting.

Each is called once per SGD step, ``update(params, target_params, steps)`` with ``steps`` the
SGD steps taken including this one (an int32 scalar, traced under ``jit``), and returns the
new target params (a pytree shaped like ``params``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
import optax

from jaxasync.errors import ConfigError

PyTree = Any


@dataclasses.dataclass(frozen=True)
class Polyak:
  """Polyak averaging (Lillicrap et al. 2016): every SGD step the target params move a
  fraction tau of the way to the online params.

  Attributes:
    tau: the fraction per SGD step (0.005: a ~200-step average; 1: a copy every step).
  """

  tau: float = 0.005

  def validate(self) -> None:
    if not 0.0 < self.tau <= 1.0:
      raise ConfigError(f"tau={self.tau}: tau must be in (0, 1] (0.005: a ~200-step average).")

  def __call__(self, params: PyTree, target_params: PyTree, steps: jnp.ndarray) -> PyTree:
    return optax.incremental_update(params, target_params, self.tau)


@dataclasses.dataclass(frozen=True)
class HardCopy:
  """Hard copies (Mnih et al. 2015): the target params are the online params of every
  period-th SGD step, and stay fixed in between.

  Attributes:
    period: SGD steps between copies.
  """

  period: int = 250

  def validate(self) -> None:
    if self.period < 1:
      raise ConfigError(f"period={self.period}: period must be >= 1 SGD step.")

  def __call__(self, params: PyTree, target_params: PyTree, steps: jnp.ndarray) -> PyTree:
    return optax.periodic_update(params, target_params, steps, self.period)


# The field's type: one of these, each a subcommand on the command line
# (agent.target-update:hard-copy).
TargetUpdate = Polyak | HardCopy
