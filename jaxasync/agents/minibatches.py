"""Epochs of shuffled minibatches over one batch of transitions: the inner loop of the
learners that take several SGD steps per batch of unrolls (PPO, PQN)."""

from __future__ import annotations

from typing import Any, Callable

import chex
import jax

from jaxasync.errors import ConfigError
from jaxasync.sharding import constrain_to_batch_shards

PyTree = Any


def minibatch_epochs(step: Callable[[Any, PyTree], tuple[Any, dict]], carry: Any,
                     data: PyTree, key: chex.PRNGKey, num_epochs: int, num_minibatches: int,
                     name: str) -> tuple[Any, dict]:
  """``num_epochs`` passes of ``step`` over ``num_minibatches`` shuffled minibatches of
  ``data``, inside ``lax.scan``s.

  Args:
    step: ``(carry, minibatch) -> (carry, metrics)``, one SGD step.
    carry: what ``step`` updates (params and optimizer state).
    data: the batch, leaves ``[M, ...]``; ``M`` must divide by ``num_minibatches``.
    key: the shuffles' PRNG key, split into one per epoch.
    num_epochs: passes over ``data``.
    num_minibatches: minibatches per pass, ``M / num_minibatches`` items each.
    name: the agent, named in the error when ``M`` does not divide.

  Returns:
    The final carry and the metrics, leaves ``[num_epochs, num_minibatches, ...]``.
  """
  n = jax.tree.leaves(data)[0].shape[0]
  if n % num_minibatches:
    raise ConfigError(
        f"a {name} batch holds {n} transitions (unroll_length x batch_size x envs per actor), "
        f"which num_minibatches={num_minibatches} does not divide; change one of them.")
  size = n // num_minibatches

  def epoch(carry, epoch_key):
    perm = jax.random.permutation(epoch_key, n)
    minibatches = jax.tree.map(
        lambda x: x[perm].reshape((num_minibatches, size) + x.shape[1:]), data)
    # (The shuffle mixes items across a multi-device learner's shards: split them again.)
    minibatches = constrain_to_batch_shards(minibatches, axis=1)
    return jax.lax.scan(step, carry, minibatches)

  return jax.lax.scan(epoch, carry, jax.random.split(key, num_epochs))
