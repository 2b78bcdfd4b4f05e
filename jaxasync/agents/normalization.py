"""Running observation statistics kept by the learner, and the normalisation they define.

gymnasium's ``NormalizeObservation`` keeps its statistics inside each env: with several
actors (and an evaluator) every copy would drift apart, and none would match what the
learner trains on. Here the statistics are one ``RunningMeanStd`` in the learner's state,
updated from the observations of each batch it trains on and published with the params, so
an actor or the evaluator normalises with exactly the version it adopted. The functions are
pure and jittable (optax/rlax style); an agent decides where they are called
(``agents/actor_critic.py``: ``ActorCriticConfig.normalize_observations``).
"""

from __future__ import annotations

from typing import Sequence

import chex
import flax
import jax.numpy as jnp


@flax.struct.dataclass
class RunningMeanStd:
  """Per-feature mean and (population) variance of every observation counted so far.

  Attributes:
    mean: ``[*obs_shape]`` float32.
    var: ``[*obs_shape]`` float32 (ddof 0, numpy's default); 1 before any observation, so
      ``normalize`` is then the identity.
    count: float32 scalar, the observations counted (exact up to 2^24 = 16.8M; beyond, the
      merge weights are off by float32 rounding, ~1e-7 relative).
  """

  mean: jnp.ndarray
  var: jnp.ndarray
  count: jnp.ndarray


def init_running_stats(shape: Sequence[int]) -> RunningMeanStd:
  """No observation yet: mean 0, var 1, count 0 (``[*shape]``, ``[*shape]``, ``[]``)."""
  shape = tuple(shape)
  return RunningMeanStd(mean=jnp.zeros(shape, jnp.float32), var=jnp.ones(shape, jnp.float32),
                        count=jnp.zeros((), jnp.float32))


def update_running_stats(stats: RunningMeanStd, x: jnp.ndarray,
                         mask: jnp.ndarray | None = None) -> RunningMeanStd:
  """``stats`` merged with a batch ``x [B, *obs_shape]`` by the parallel formula (Chan et al.
  1979): with ``delta = mean_b - mean``, ``n = count + n_b``,
  ``mean' = mean + delta n_b / n`` and ``var' = (var count + var_b n_b + delta^2 count n_b / n)
  / n``. Rows where ``mask [B]`` is False are left out; a batch with no row counted leaves
  ``stats`` as they were. The batch's own mean and variance are two-pass (float32)."""
  chex.assert_shape(x, (None, *stats.mean.shape))
  x = x.astype(jnp.float32)
  weight = (jnp.ones(x.shape[:1], jnp.float32) if mask is None
            else mask.astype(jnp.float32))
  chex.assert_shape(weight, x.shape[:1])
  weight = weight.reshape(weight.shape + (1,) * (x.ndim - 1))
  batch_count = jnp.sum(weight[(...,) + (0,) * (x.ndim - 1)])
  safe_batch = jnp.maximum(batch_count, 1.0)
  batch_mean = jnp.sum(x * weight, axis=0) / safe_batch
  batch_var = jnp.sum(jnp.square(x - batch_mean) * weight, axis=0) / safe_batch
  total = stats.count + batch_count
  safe_total = jnp.maximum(total, 1.0)
  delta = batch_mean - stats.mean
  mean = stats.mean + delta * (batch_count / safe_total)
  m2 = (stats.var * stats.count + batch_var * batch_count
        + jnp.square(delta) * (stats.count * batch_count / safe_total))
  # An empty batch would turn var (1 before any observation) into 0: keep the old stats.
  counted = batch_count > 0
  return RunningMeanStd(mean=jnp.where(counted, mean, stats.mean),
                        var=jnp.where(counted, m2 / safe_total, stats.var),
                        count=total)


def normalize(stats: RunningMeanStd, x: jnp.ndarray, clip: float = 10.0,
              eps: float = 1e-8) -> jnp.ndarray:
  """``clip((x - mean) / sqrt(var + eps), -clip, clip)`` (gymnasium's NormalizeObservation
  and CleanRL's clip): ``x [..., *obs_shape]`` -> float32 ``[..., *obs_shape]``."""
  chex.assert_equal_shape_suffix((x, stats.mean), stats.mean.ndim)
  z = (x.astype(jnp.float32) - stats.mean) / jnp.sqrt(stats.var + eps)
  return jnp.clip(z, -clip, clip)
