"""Flax networks: torsos for vector and image observations, and a Q-value head."""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax.numpy as jnp


class MLPTorso(nn.Module):
  """ReLU MLP over flat vector observations ``[B, *obs_shape] -> [B, hidden[-1]]``."""

  hidden_sizes: Sequence[int] = (64, 64)

  @nn.compact
  def __call__(self, obs: jnp.ndarray) -> jnp.ndarray:
    x = obs.reshape(obs.shape[0], -1).astype(jnp.float32)
    for size in self.hidden_sizes:
      x = nn.relu(nn.Dense(size)(x))
    return x


class NatureCNN(nn.Module):
  """The DQN Nature torso: uint8 frames ``[B, H, W, C]`` (84x84x4) -> ``[B, 512]``."""

  @nn.compact
  def __call__(self, obs: jnp.ndarray) -> jnp.ndarray:
    x = obs.astype(jnp.float32) / 255.0
    x = nn.relu(nn.Conv(32, (8, 8), strides=(4, 4), padding="VALID")(x))
    x = nn.relu(nn.Conv(64, (4, 4), strides=(2, 2), padding="VALID")(x))
    x = nn.relu(nn.Conv(64, (3, 3), strides=(1, 1), padding="VALID")(x))
    x = x.reshape(x.shape[0], -1)
    return nn.relu(nn.Dense(512)(x))


class QNetwork(nn.Module):
  """Q-values ``[B, A]``, or per-action atom logits ``[B, A, num_atoms]`` when ``num_atoms > 1``.

  Attributes:
    num_actions: ``A``.
    torso: ``"mlp"`` for vector observations, ``"nature_cnn"`` for stacked frames.
    hidden_sizes: MLP torso sizes.
    dueling: value + mean-centred advantage streams (Wang et al. 2016).
    num_atoms: 1 for expected Q-values; > 1 for a categorical (C51) distribution.
  """

  num_actions: int
  torso: str = "mlp"
  hidden_sizes: Sequence[int] = (64, 64)
  dueling: bool = False
  num_atoms: int = 1

  @nn.compact
  def __call__(self, obs: jnp.ndarray) -> jnp.ndarray:
    if self.torso == "mlp":
      h = MLPTorso(self.hidden_sizes)(obs)
    elif self.torso == "nature_cnn":
      h = NatureCNN()(obs)
    else:
      raise ValueError(f"unknown torso {self.torso!r}; use 'mlp' or 'nature_cnn'.")
    a, z = self.num_actions, self.num_atoms
    if self.dueling:
      value = nn.Dense(z)(h).reshape(-1, 1, z)
      adv = nn.Dense(a * z)(h).reshape(-1, a, z)
      out = value + adv - adv.mean(axis=1, keepdims=True)
    else:
      out = nn.Dense(a * z)(h).reshape(-1, a, z)
    return out[..., 0] if z == 1 else out
