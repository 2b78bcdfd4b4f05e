"""MinAtar (Young & Tian 2019): five Atari games on 10x10 grids, as NEXT_STEP vector envs.

MinAtar keeps what makes Atari hard for value-based agents (sparse rewards, partial
observability through object trails, stochasticity) at a cost a CPU can afford: one step
is a few numpy operations on a ``[10, 10, C]`` bool grid, so Rainbow trains on it in hours
without an accelerator (Obando-Ceron & Castro 2021, "Revisiting Rainbow").

``MinAtarEnvFactory`` is a ``VectorEnvFactory``, a frozen, picklable dataclass like
``EnvFactory`` (actor processes rebuild the env from it): ``__call__(num_envs, seed)``
returns a gymnasium ``SyncVectorEnv`` in ``NEXT_STEP`` autoreset mode with observations
``[num_envs, 10, 10, C]`` bool (C: 4 Breakout and Asterix, 6 SpaceInvaders, 7 Freeway, 10
Seaquest). ``DQNConfig(torso="auto")`` picks ``MinAtarCNN`` (MinAtar's reference network)
for them.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import gymnasium as gym
from gymnasium.vector import AutoresetMode

from jaxasync.errors import ConfigError

GAMES = ("Asterix", "Breakout", "Freeway", "Seaquest", "SpaceInvaders")


def _register_minatar() -> None:
  """Registers ``MinAtar/<Game>-v0/v1`` with gymnasium (MinAtar's plugin entry point is not
  loaded by gymnasium >= 1.0, so ids are unknown until this runs)."""
  try:
    import minatar.gym
  except ImportError as e:
    raise ConfigError(f"MinAtar envs need the minatar package ({e}): "
                      "`pip install 'jaxasync[minatar]'`.") from None
  if "MinAtar/Breakout-v1" not in gym.registry:
    minatar.gym.register_envs()


class _ForgetLastAction(gym.Wrapper):
  """Clears MinAtar's sticky-action memory at reset.

  ``minatar.Environment`` keeps ``last_action`` across resets, so the first step of an
  episode may repeat the previous episode's last action, and ``reset(seed=s)`` would not
  reproduce a trajectory. A new episode starts as a fresh env does, from action 0.
  """

  def reset(self, *, seed=None, options=None):
    self.env.unwrapped.game.last_action = 0
    return self.env.reset(seed=seed, options=options)


def is_minatar_id(env_id: str) -> bool:
  """Whether ``env_id`` names a MinAtar game (``"MinAtar/Breakout-v1"``)."""
  return env_id.startswith("MinAtar/")


@dataclasses.dataclass(frozen=True)
class MinAtarEnvFactory:
  """Builds MinAtar vector envs. Picklable.

  Attributes:
    env_id: ``"MinAtar/<Game>-v1"`` (the game's minimal action set) or ``-v0`` (all 6
      actions); games: Asterix, Breakout, Freeway, Seaquest, SpaceInvaders.
    sticky_action_prob: probability of repeating the previous action at each step
      (MinAtar's default 0.1).
    difficulty_ramping: games speed up as the agent progresses (MinAtar's default).
    max_episode_steps: steps after which an episode is truncated (bootstrapped, not a
      terminal, so learning targets are unaffected); it bounds evaluation episodes, since
      MinAtar games other than Freeway can last forever for a good agent. Revisiting
      Rainbow used no cap; ``None``: no limit.
  """

  env_id: str = "MinAtar/Breakout-v1"
  sticky_action_prob: float = 0.1
  difficulty_ramping: bool = True
  max_episode_steps: int | None = 27_000

  def __post_init__(self):
    if not is_minatar_id(self.env_id):
      raise ConfigError(f"{self.env_id!r} is not a MinAtar id; pass 'MinAtar/<Game>-v1' with "
                        f"<Game> one of {GAMES}.")
    if not 0.0 <= self.sticky_action_prob <= 1.0:
      raise ConfigError(f"sticky_action_prob must be in [0, 1], got {self.sticky_action_prob}.")
    if self.max_episode_steps is not None and self.max_episode_steps < 1:
      raise ConfigError(f"max_episode_steps must be >= 1 or None, got {self.max_episode_steps}.")

  frame_skip: ClassVar[int] = 1  # a MinAtar step is one game frame (VectorEnvFactory's)

  def make_single(self) -> gym.Env:
    """One (non-vector) env: ``[10, 10, C]`` bool observations."""
    _register_minatar()
    if self.env_id not in gym.registry:
      raise ConfigError(f"unknown MinAtar id {self.env_id!r}: use 'MinAtar/<Game>-v1' with "
                        f"<Game> one of {GAMES}.")
    return _ForgetLastAction(gym.make(
        self.env_id, max_episode_steps=self.max_episode_steps,
        sticky_action_prob=self.sticky_action_prob, difficulty_ramping=self.difficulty_ramping))

  def __call__(self, num_envs: int, seed: int | None = None) -> gym.vector.VectorEnv:
    """A ``SyncVectorEnv`` of ``num_envs`` sub-envs (``NEXT_STEP``), sub-env ``i`` seeded
    ``seed + i`` (its sticky actions and the game's randomness)."""
    if num_envs < 1:
      raise ConfigError(f"num_envs must be >= 1, got {num_envs}.")
    env = gym.vector.SyncVectorEnv([self.make_single] * num_envs,
                                   autoreset_mode=AutoresetMode.NEXT_STEP)
    env.reset(seed=seed)
    return env
