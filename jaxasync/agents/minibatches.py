"""Epochs of shuffled minibatches over one batch of transitions, one SGD step each: the inner
loop of the learners that take several SGD steps per batch of unrolls (PPO, PQN)."""

from __future__ import annotations

from typing import Any, Callable

import chex
import jax
import optax

from jaxasync.errors import ConfigError
from jaxasync.sharding import constrain_to_batch_shards

PyTree = Any


def minibatch_epochs(loss: Callable[[PyTree, PyTree], tuple[Any, dict]],
                     optimizer: optax.GradientTransformation, params: PyTree, opt_state: PyTree,
                     data: PyTree, key: chex.PRNGKey, num_epochs: int, num_minibatches: int,
                     name: str) -> tuple[tuple[PyTree, PyTree], dict]:
  """``num_epochs`` passes of one SGD step per minibatch over ``num_minibatches`` shuffled
  minibatches of ``data``, inside ``lax.scan``s.

  Args:
    loss: ``(params, minibatch) -> (loss, metrics)``, differentiated with respect to params.
    optimizer: the agent's optimizer; one update per minibatch.
    params, opt_state: where the passes start.
    data: the batch, leaves ``[M, ...]``; ``M`` must divide by ``num_minibatches``.
    key: the shuffles' PRNG key, split into one per epoch.
    num_epochs: passes over ``data``.
    num_minibatches: minibatches per pass, ``M / num_minibatches`` items each.
    name: the agent, named in the error when ``M`` does not divide.

  Returns:
    The final ``(params, opt_state)`` and the metrics (``loss``'s and ``grad_norm``, the
    gradient's global norm before the optimizer), leaves ``[num_epochs, num_minibatches]``.
  """
  n = jax.tree.leaves(data)[0].shape[0]
  if n % num_minibatches:
    raise ConfigError(
        f"a {name} batch holds {n} transitions (unroll_length x batch_size x envs per actor), "
        f"which num_minibatches={num_minibatches} does not divide; change one of them.")
  size = n // num_minibatches

  def step(carry, minibatch):
    params, opt_state = carry
    grads, metrics = jax.grad(loss, has_aux=True)(params, minibatch)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    metrics["grad_norm"] = optax.tree.norm(grads)
    return (optax.apply_updates(params, updates), opt_state), metrics

  def epoch(carry, epoch_key):
    perm = jax.random.permutation(epoch_key, n)
    minibatches = jax.tree.map(
        lambda x: x[perm].reshape((num_minibatches, size) + x.shape[1:]), data)
    # (The shuffle mixes items across a multi-device learner's shards: split them again.)
    minibatches = constrain_to_batch_shards(minibatches, axis=1)
    return jax.lax.scan(step, carry, minibatches)

  return jax.lax.scan(epoch, (params, opt_state), jax.random.split(key, num_epochs))
