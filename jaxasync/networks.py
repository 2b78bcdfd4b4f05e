"""Flax torsos for vector and image observations, shared by every agent (heads live with their
agents, e.g. ``agents/q_network.py``)."""

from __future__ import annotations

import math
from typing import Literal, Sequence, get_args

import flax.linen as nn
import jax.numpy as jnp

Activation = Literal["relu", "tanh"]
ACTIVATIONS = {"relu": nn.relu, "tanh": nn.tanh}


class MLPTorso(nn.Module):
  """MLP over flat vector observations ``[B, *obs_shape] -> [B, hidden[-1]]``.

  With ``layer_norm`` each layer is Dense -> LayerNorm -> activation: normalised features keep
  TD learning's bootstrapped targets from feeding back into ever larger activations (Gallici et
  al. 2024, "Simplifying Deep Temporal Difference Learning"; Ball et al. 2023). With
  ``orthogonal_init`` the kernels start orthogonal with gain sqrt(2) and the biases at 0 (the
  PPO implementations' choice, Huang et al. 2022, "The 37 Implementation Details of PPO");
  otherwise Flax's LeCun normal.
  """

  hidden_sizes: Sequence[int] = (64, 64)
  layer_norm: bool = False
  activation: Activation = "relu"
  orthogonal_init: bool = False

  @nn.compact
  def __call__(self, obs: jnp.ndarray) -> jnp.ndarray:
    x = obs.reshape(obs.shape[0], -1).astype(jnp.float32)
    init = ({"kernel_init": nn.initializers.orthogonal(math.sqrt(2.0))}
            if self.orthogonal_init else {})
    for size in self.hidden_sizes:
      x = nn.Dense(size, **init)(x)
      if self.layer_norm:
        x = nn.LayerNorm()(x)
      x = ACTIVATIONS[self.activation](x)
    return x


def _normalised_relu(x: jnp.ndarray, layer_norm: bool) -> jnp.ndarray:
  """ReLU, after a LayerNorm over the last axis (features, or a conv's channels) if asked."""
  return nn.relu(nn.LayerNorm()(x) if layer_norm else x)


class NatureCNN(nn.Module):
  """The DQN Nature torso: uint8 frames ``[B, H, W, C]`` (84x84x4) -> ``[B, 512]``; with
  ``layer_norm``, a LayerNorm over the channels of each conv and over the dense features
  before each ReLU (as PQN normalises its CNNs)."""

  layer_norm: bool = False

  @nn.compact
  def __call__(self, obs: jnp.ndarray) -> jnp.ndarray:
    x = obs.astype(jnp.float32) / 255.0
    ln = self.layer_norm
    x = _normalised_relu(nn.Conv(32, (8, 8), strides=(4, 4), padding="VALID")(x), ln)
    x = _normalised_relu(nn.Conv(64, (4, 4), strides=(2, 2), padding="VALID")(x), ln)
    x = _normalised_relu(nn.Conv(64, (3, 3), strides=(1, 1), padding="VALID")(x), ln)
    x = x.reshape(x.shape[0], -1)
    return _normalised_relu(nn.Dense(512)(x), ln)


class MinAtarCNN(nn.Module):
  """MinAtar's reference torso (Young & Tian 2019): ``[B, 10, 10, C]`` grids -> ``[B, hidden]``.

  One 3x3 convolution with 16 filters (stride 1, no padding: ``[B, 8, 8, 16]``), then one
  dense layer of ``hidden`` units. The observations are 0/1 channels (bool), so they are
  cast, not rescaled. With ``layer_norm``, a LayerNorm over the conv's channels and over the
  dense features before each ReLU.
  """

  hidden: int = 128
  layer_norm: bool = False

  @nn.compact
  def __call__(self, obs: jnp.ndarray) -> jnp.ndarray:
    x = obs.astype(jnp.float32)
    x = _normalised_relu(nn.Conv(16, (3, 3), strides=(1, 1), padding="VALID")(x), self.layer_norm)
    x = x.reshape(x.shape[0], -1)
    return _normalised_relu(nn.Dense(self.hidden)(x), self.layer_norm)


Torso = Literal["mlp", "nature_cnn", "minatar_cnn"]
TORSOS: tuple[str, ...] = get_args(Torso)  # the torsos make_torso builds


def make_torso(torso: Torso, hidden_sizes: Sequence[int], layer_norm: bool = False,
               activation: Activation = "relu", orthogonal_init: bool = False) -> nn.Module:
  """The torso module ``torso`` names: an MLP of ``hidden_sizes``, the Nature CNN, or the
  MinAtar CNN (its dense width: the last of ``hidden_sizes``); with ``layer_norm``, every
  layer's output is normalised before its activation. ``activation`` and ``orthogonal_init``
  shape the MLP only (the CNNs keep ReLU and their default init)."""
  if torso == "mlp":
    return MLPTorso(tuple(hidden_sizes), layer_norm, activation, orthogonal_init)
  if torso == "nature_cnn":
    return NatureCNN(layer_norm)
  if torso == "minatar_cnn":
    return MinAtarCNN(hidden_sizes[-1], layer_norm)
  raise ValueError(f"unknown torso {torso!r}; use one of {TORSOS}.")


def check_torso(torso: str, obs_shape: Sequence[int], env_id: str = "the env") -> None:
  """Raises ``ConfigError`` if a CNN torso is asked for observations that are not ``[H, W, C]``."""
  if torso in ("nature_cnn", "minatar_cnn") and len(obs_shape) != 3:
    from jaxasync.errors import ConfigError
    raise ConfigError(
        f"torso {torso!r} needs image observations [H, W, C], but {env_id} has observations of "
        f"shape {tuple(obs_shape)}; use torso 'mlp' or 'auto'.")


def check_torso_fields(torso: str, hidden_sizes: Sequence[int], example: str = "(64, 64)") -> None:
  """Raises ``ConfigError`` for a config's torso fields that ``make_torso`` cannot build: a
  torso other than ``'auto'`` or one of ``TORSOS``, or no MLP layer (``example`` is the fix
  shown)."""
  from jaxasync.errors import ConfigError
  if torso not in ("auto", *TORSOS):
    raise ConfigError(f"torso must be 'auto' or one of {TORSOS}, got {torso!r}.")
  if not hidden_sizes:
    raise ConfigError(f"hidden_sizes must name at least one layer width, e.g. {example}.")


def default_torso(obs_shape: Sequence[int], obs_dtype) -> str:
  """The torso for one observation of shape ``obs_shape``: ``"minatar_cnn"`` for small
  ``[H, W, C]`` grids (H, W <= 16, as MinAtar's 10x10), ``"nature_cnn"`` for uint8 frame
  stacks of at least 36x36 (its three VALID convolutions need that), ``"mlp"`` for anything
  else (set ``DQNConfig.torso`` to override)."""
  if len(obs_shape) == 3:
    h, w = obs_shape[:2]
    if 3 <= h <= 16 and 3 <= w <= 16:
      return "minatar_cnn"
    if obs_dtype == jnp.uint8 and min(h, w) >= 36:
      return "nature_cnn"
  return "mlp"
