"""DQN's networks: noisy linear layers (NoisyNet) and the Q-value head over a shared torso."""

from __future__ import annotations

import math
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxasync.networks import make_torso

def factorized_noise_scale(x: jnp.ndarray) -> jnp.ndarray:
  """``f(x) = sign(x) * sqrt(|x|)``, the factorized-noise transform of Fortunato et al. (2018)."""
  return jnp.sign(x) * jnp.sqrt(jnp.abs(x))


def factorized_noise(key: jax.Array, in_features: int, out_features: int
                     ) -> tuple[jnp.ndarray, jnp.ndarray]:
  """Factorized Gaussian noise ``(f(eps_in) [in], f(eps_out) [out])``.

  The weight noise is their outer product ``eps_w[i, j] = f(eps_in)[i] * f(eps_out)[j]``
  and the bias noise is ``f(eps_out)``: ``in + out`` Gaussian draws instead of ``in * out``.
  """
  k_in, k_out = jax.random.split(key)
  eps_in = factorized_noise_scale(jax.random.normal(k_in, (in_features,), jnp.float32))
  eps_out = factorized_noise_scale(jax.random.normal(k_out, (out_features,), jnp.float32))
  return eps_in, eps_out


class NoisyDense(nn.Module):
  """A linear layer with factorized Gaussian parameter noise (NoisyNet, Fortunato et al. 2018).

  ``y = x @ (mu_w + sigma_w * eps_w) + mu_b + sigma_b * eps_b`` with
  ``eps_w = outer(f(eps_in), f(eps_out))``, ``eps_b = f(eps_out)`` and
  ``f(x) = sign(x) sqrt(|x|)``. One noise sample is shared by the whole batch of a
  call. Parameters: ``kernel`` / ``bias`` (the means ``mu``, initialised
  ``U[-1/sqrt(p), 1/sqrt(p)]``) and ``sigma_kernel`` / ``sigma_bias`` (initialised
  ``sigma0 / sqrt(p)``), ``p`` the input size.

  The noise comes only from the ``"noise"`` PRNG stream passed at apply time
  (``module.apply(params, x, rngs={"noise": key})``); ``deterministic=True`` uses
  the mean weights and needs no key.

  Attributes:
    features: output size.
    sigma0: initial noise scale (0.5 in NoisyNet and Rainbow).
  """

  features: int
  sigma0: float = 0.5

  @nn.compact
  def __call__(self, x: jnp.ndarray, deterministic: bool = False) -> jnp.ndarray:
    x = x.astype(jnp.float32)
    p = x.shape[-1]
    bound = 1.0 / math.sqrt(p)
    mu_init = lambda key, shape: jax.random.uniform(key, shape, jnp.float32, -bound, bound)
    sigma_init = nn.initializers.constant(self.sigma0 / math.sqrt(p))
    mu_w = self.param("kernel", mu_init, (p, self.features))
    mu_b = self.param("bias", mu_init, (self.features,))
    sigma_w = self.param("sigma_kernel", sigma_init, (p, self.features), jnp.float32)
    sigma_b = self.param("sigma_bias", sigma_init, (self.features,), jnp.float32)
    y = x @ mu_w + mu_b
    if deterministic:
      return y
    eps_in, eps_out = factorized_noise(self.make_rng("noise"), p, self.features)
    # x @ (sigma_w * outer(eps_in, eps_out)) == ((x * eps_in) @ sigma_w) * eps_out
    return y + ((x * eps_in) @ sigma_w) * eps_out + sigma_b * eps_out


class QNetwork(nn.Module):
  """Q-values ``[B, A]``, or per-action atom logits ``[B, A, num_atoms]`` when ``num_atoms > 1``.

  Attributes:
    num_actions: ``A``.
    torso: ``"mlp"`` for vector observations, ``"nature_cnn"`` for stacked frames,
      ``"minatar_cnn"`` for small grids (see ``default_torso``).
    hidden_sizes: MLP torso sizes; ``"minatar_cnn"`` uses the last as its dense width.
    layer_norm: LayerNorm before each of the torso's ReLUs.
    dueling: value + mean-centred advantage streams (Wang et al. 2016).
    num_atoms: 1 for expected Q-values; > 1 for a categorical (C51) distribution.
    noisy: the head layers (value and advantage streams when dueling) are
      ``NoisyDense``; applying then needs ``rngs={"noise": key}`` unless
      ``deterministic=True`` (mean weights).
    sigma0: ``NoisyDense``'s initial noise scale.
  """

  num_actions: int
  torso: str = "mlp"
  hidden_sizes: Sequence[int] = (64, 64)
  layer_norm: bool = False
  dueling: bool = False
  num_atoms: int = 1
  noisy: bool = False
  sigma0: float = 0.5

  def _head(self, features: int, h: jnp.ndarray, deterministic: bool) -> jnp.ndarray:
    if self.noisy:
      return NoisyDense(features, self.sigma0)(h, deterministic)
    return nn.Dense(features)(h)

  @nn.compact
  def __call__(self, obs: jnp.ndarray, deterministic: bool = False) -> jnp.ndarray:
    """``deterministic`` only matters with ``noisy``: the mean network, no noise key needed."""
    h = make_torso(self.torso, self.hidden_sizes, self.layer_norm)(obs)
    a, z = self.num_actions, self.num_atoms
    if self.dueling:
      value = self._head(z, h, deterministic).reshape(-1, 1, z)
      adv = self._head(a * z, h, deterministic).reshape(-1, a, z)
      out = value + adv - adv.mean(axis=1, keepdims=True)
    else:
      out = self._head(a * z, h, deterministic).reshape(-1, a, z)
    return out[..., 0] if z == 1 else out
