"""Environment factories and space validation.

``VectorEnvFactory`` is the contract every env factory keeps (``EnvFactory``,
``MinAtarEnvFactory``, ``AtariEnvFactory`` or one of your own). The library's are plain
picklable dataclasses so that actor processes (spawn start method) can rebuild the env on
their side.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, ClassVar, Protocol

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from jaxasync.errors import ConfigError


class VectorEnvFactory(Protocol):
  """What the trainer, its actors and the evaluator take to build envs.

  A picklable callable (process and Ray actors rebuild their envs from a copy of it) with the
  name of the env it builds. Its members are read-only, so a frozen dataclass field or a
  property keeps them.
  """

  @property
  def env_id(self) -> str:
    """The env it builds, as messages, run records and videos name it."""

  @property
  def frame_skip(self) -> int:
    """Emulator frames per env step (Atari's frame skip; 1 for the others): env frames per
    second, the figure other libraries report, are env steps per second times it."""

  def __call__(self, num_envs: int, seed: int | None = None) -> gym.vector.VectorEnv:
    """A vector env of ``num_envs`` sub-envs in ``NEXT_STEP`` autoreset mode (what the
    collectors take), already reset with ``seed``."""


@dataclasses.dataclass(frozen=True)
class EnvFactory:
  """Builds gymnasium vector envs for one env id.

  Attributes:
    env_id: any registered gymnasium id, or gymnasium's ``"module:EnvName-v0"``
      form, which imports ``module`` to register the env first.
    kwargs: keyword arguments for ``gymnasium.make``.
    vectorization_mode: ``None`` lets gymnasium pick (an env's native vector
      implementation when it has one, as CartPole does, else ``"sync"``).
  """

  env_id: str
  kwargs: tuple[tuple[str, Any], ...] = ()
  vectorization_mode: str | None = None

  # One frame per env step (VectorEnvFactory's frame_skip). Atari ids belong to
  # AtariEnvFactory, which knows its frame skip; an ALE id made here skips frames of its own
  # that this does not count.
  frame_skip: ClassVar[int] = 1

  def __call__(self, num_envs: int, seed: int | None = None) -> gym.vector.VectorEnv:
    """A vector env of ``num_envs`` sub-envs in ``NEXT_STEP`` autoreset mode, reset with ``seed``."""
    if num_envs < 1:
      raise ConfigError(f"num_envs must be >= 1, got {num_envs}.")
    check_env_id(self.env_id)
    _route_mujoco_warnings(self.env_id)
    kwargs = dict(self.kwargs)
    try:
      env = gym.make_vec(self.env_id, num_envs=num_envs,
                         vectorization_mode=self.vectorization_mode, **kwargs)
    except (gym.error.Error, TypeError):
      # Some ids have no vector entry point for these kwargs: fall back to sync.
      env = gym.make_vec(self.env_id, num_envs=num_envs, vectorization_mode="sync", **kwargs)
    mode = env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
    if mode != AutoresetMode.NEXT_STEP:
      env.close()
      raise ConfigError(
          f"{self.env_id} vector env uses autoreset mode {mode}; jaxasync's StepProcessor needs "
          "NEXT_STEP (gymnasium's default): build it without autoreset_mode.")
    env.reset(seed=seed)
    return env


_mujoco_warnings_routed = False


def _route_mujoco_warnings(env_id: str) -> None:
  """Before a MuJoCo env is built (once per process): MuJoCo's warnings go to Python's
  ``warnings`` (shown once per message) instead of to stderr and a MUJOCO_LOG.TXT that
  MuJoCo writes into the working directory (mujoco 4.0 warns on every load of the -v5
  models' XML, in every actor and the evaluator)."""
  global _mujoco_warnings_routed
  if _mujoco_warnings_routed:
    return
  try:
    entry_point = str(gym.spec(env_id).entry_point)
  except gym.error.Error:
    return  # (check_env_id passed: a 'module:Env' id registers on make; not a MuJoCo one here)
  if "mujoco" not in entry_point:
    return
  try:
    import mujoco
  except ImportError:
    return  # (gymnasium's own error names the install when the env is made)
  mujoco.set_mju_user_warning(
      lambda message: warnings.warn(f"MuJoCo: {message.strip()}", RuntimeWarning, stacklevel=2))
  _mujoco_warnings_routed = True


def check_env_id(env_id: str) -> None:
  """Raises ``ConfigError`` naming the fix if ``env_id`` cannot be made."""
  if ":" in env_id:
    module = env_id.split(":", 1)[0]
    try:
      __import__(module)
    except ImportError as e:
      raise ConfigError(
          f"unknown env id {env_id!r}: cannot import module {module!r} ({e}); install it or "
          "fix the 'module:EnvName-v0' id.") from None
    env_id = env_id.split(":", 1)[1]
  if env_id not in gym.registry:
    close = [k for k in gym.registry if k.lower().startswith(env_id.split("-")[0].lower())]
    hint = f" Did you mean one of {close[:5]}?" if close else ""
    if env_id.startswith("ALE/") or "NoFrameskip" in env_id:
      hint = " Atari ids need jaxasync.AtariEnvFactory (experiments/rainbow.py --preset atari)."
    elif env_id.startswith("MinAtar/"):
      hint = " MinAtar ids need jaxasync.MinAtarEnvFactory (experiments/rainbow.py --preset minatar)."
    raise ConfigError(
        f"unknown env id {env_id!r}: it is not registered with gymnasium.{hint} "
        "Pass a registered id, or 'module:EnvName-v0' to import the module that registers it.")


def check_box_observations(obs_space: gym.Space, env_id: str, agent: str) -> None:
  """Raises ``ConfigError`` unless ``obs_space`` is a ``Box`` (what every agent's networks take),
  naming ``agent`` and the fix."""
  if not isinstance(obs_space, gym.spaces.Box):
    raise ConfigError(
        f"{env_id} has observation space {obs_space}; {agent}'s networks need a Box. Wrap the "
        "env with gymnasium.wrappers.FlattenObservation (or similar) first.")


def check_action_box(action_space: gym.spaces.Box, env_id: str, agent: str,
                     bounds_use: str) -> None:
  """Raises ``ConfigError`` unless ``action_space`` is a one-axis Box with finite bounds (what
  the continuous-action agents take), naming ``agent``, what it does with the bounds
  (``bounds_use``) and a fix that works."""
  if len(action_space.shape) != 1:
    raise ConfigError(
        f"{env_id} has actions of shape {action_space.shape}; {agent} needs a one-axis Box [A]. "
        "Reshape them in a wrapper first (gymnasium.wrappers.TransformAction with a "
        "one-axis Box).")
  if not (np.all(np.isfinite(action_space.low)) and np.all(np.isfinite(action_space.high))):
    # (ClipAction declares [-inf, inf] and RescaleAction refuses unbounded Boxes: neither helps.)
    raise ConfigError(
        f"{env_id} has an unbounded action Box (low={action_space.low}, high="
        f"{action_space.high}); {agent} {bounds_use}. Declare the actions' true bounds: "
        "gymnasium.wrappers.TransformAction(env, lambda a: a, gymnasium.spaces.Box(low, high)).")


def single_spaces(env: gym.vector.VectorEnv) -> tuple[gym.Space, gym.Space]:
  return env.single_observation_space, env.single_action_space


def spaces_of(factory: VectorEnvFactory) -> tuple[gym.Space, gym.Space]:
  """Observation and action space of one sub-env of ``factory``."""
  env = factory(1)
  try:
    return single_spaces(env)
  finally:
    env.close()

