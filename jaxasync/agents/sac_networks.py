"""SAC's networks: a tanh-squashed Gaussian policy and twin Q critics over a shared torso kind.

Actions inside the networks are normalized to ``[-1, 1]^A``; ``agents/sac.py`` scales them to
the action Box's bounds on the way to the env and back on the way into the critic.
"""

from __future__ import annotations

from typing import Sequence

import distrax
import flax.linen as nn
import jax.numpy as jnp

from jaxasync.networks import MLPTorso, make_torso


class GaussianPolicy(nn.Module):
  """``obs [B, *obs_shape] -> (mean [B, A], log_std [B, A])`` of the Gaussian before the tanh.

  ``log_std`` is squashed smoothly into ``[log_std_min, log_std_max]`` (a rescaled tanh, as
  CleanRL's SAC) rather than clipped, so its gradient never vanishes at the bounds.

  Attributes:
    action_dim: ``A``.
    torso: a ``jaxasync.networks`` torso name.
    hidden_sizes: the torso's layer widths.
    log_std_min, log_std_max: bounds of ``log_std``.
  """

  action_dim: int
  torso: str = "mlp"
  hidden_sizes: Sequence[int] = (256, 256)
  log_std_min: float = -5.0
  log_std_max: float = 2.0

  @nn.compact
  def __call__(self, obs: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    x = make_torso(self.torso, self.hidden_sizes)(obs)
    mean = nn.Dense(self.action_dim)(x)
    log_std = jnp.tanh(nn.Dense(self.action_dim)(x))
    log_std = self.log_std_min + 0.5 * (self.log_std_max - self.log_std_min) * (log_std + 1.0)
    return mean, log_std


class QCritic(nn.Module):
  """``(obs [B, *obs_shape], action [B, A]) -> Q [B]``.

  Vector observations: an MLP over ``concat(obs, action)``. Images: the CNN torso over ``obs``,
  then one dense layer over ``concat(features, action)``.
  """

  torso: str = "mlp"
  hidden_sizes: Sequence[int] = (256, 256)

  @nn.compact
  def __call__(self, obs: jnp.ndarray, action: jnp.ndarray) -> jnp.ndarray:
    action = action.astype(jnp.float32)
    if self.torso == "mlp":
      x = obs.reshape(obs.shape[0], -1).astype(jnp.float32)
      x = MLPTorso(tuple(self.hidden_sizes))(jnp.concatenate([x, action], axis=-1))
    else:
      x = make_torso(self.torso, self.hidden_sizes)(obs)
      x = nn.relu(nn.Dense(self.hidden_sizes[-1])(jnp.concatenate([x, action], axis=-1)))
    return nn.Dense(1)(x)[..., 0]


# Two independently initialised critics evaluated in one call: params get a leading axis of 2,
# outputs are ``[2, B]``.
TwinQCritic = nn.vmap(QCritic, variable_axes={"params": 0}, split_rngs={"params": True},
                      in_axes=None, out_axes=0, axis_size=2)


def squashed_gaussian(mean: jnp.ndarray, log_std: jnp.ndarray) -> distrax.Distribution:
  """``tanh(N(mean, exp(log_std)^2))`` with diagonal covariance, over ``[-1, 1]^A``.

  ``log_prob`` / ``sample_and_log_prob`` include the tanh's change of variables
  (``- sum_i log(1 - tanh(u_i)^2)``), computed stably by distrax from the pre-tanh sample.
  """
  base = distrax.MultivariateNormalDiag(mean, jnp.exp(log_std))
  return distrax.Transformed(base, distrax.Block(distrax.Tanh(), ndims=1))
