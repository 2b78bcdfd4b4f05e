"""Atari 2600 envs with the standard DQN preprocessing, as NEXT_STEP vector envs.

``AtariEnvFactory`` is the Atari counterpart of ``EnvFactory`` (a ``VectorEnvFactory``
whose ``frame_skip`` field is the agent step's emulator frames): a frozen, picklable
dataclass (actor processes rebuild the env from it) whose ``__call__(num_envs, seed)``
returns a gymnasium vector env in ``NEXT_STEP`` autoreset mode. Every backend yields the
same observations: ``[num_envs, 84, 84, 4]`` uint8, the 4 most recent max-pooled
grayscale frames stacked on the LAST axis (HWC, what ``NatureCNN`` takes), newest last.

Preprocessing (Machado et al. 2018 / Dopamine): 4 emulator frames per agent step with
the max over the last two, 84x84 grayscale (``cv2.INTER_AREA``), a random number of no-op
emulator frames (at most ``noop_max``) after each reset, sticky actions
(``repeat_action_probability=0.25``, the ``-v5`` default), the game's full length capped at
108k emulator frames (a truncation). Rewards are NOT clipped here: the step processor clips
each one before the n-step sum (``ReplayConfig.reward_clip``), so episode returns stay the
game's score.

Backends. They share the observation contract and the preprocessing above, and differ in
these details (each measured; ``FrameReplayBuffer`` stores whatever a reset stack holds,
so its stacks match what the actor saw on every backend):

============================  ==================  ===================  ==================
detail                        ``gymnasium``       ``ale_vector``       ``envpool``
============================  ==================  ===================  ==================
reset stack's older frames    the reset frame     zero frames          the reset frame
no-op frames after a reset    1..noop_max         0..noop_max-1        1..noop_max (>= 1)
reset after a life loss       one no-op step,     refused (restarts    1..noop_max no-op
(``episodic_life``)           stack re-padded     the game)            frames, stack goes on
no-op frames count toward     yes                 no                   no
the 108k-frame cap
``reset(seed=s)``             reseeds             reseeds              rebuilds the pool
============================  ==================  ===================  ==================

  * ``"gymnasium"``: ``gymnasium.make(env_id, frameskip=1)`` + ``AtariPreprocessing`` +
    (``EpisodicLife``) + ``FrameStackObservation``, in a ``SyncVectorEnv`` (or
    ``AsyncVectorEnv`` with ``vectorization_mode="async"``). The reference pipeline.
  * ``"ale_vector"``: ale-py's native ``AtariVectorEnv`` (envpool's Atari engine, moved
    into ALE), in C++ threads. With ``noop_max=0`` and no sticky actions it returned the
    gymnasium backend's frames over 60 steps of Breakout, bar the zero padding.
    ``episodic_life`` is refused: ale-py 0.12.1's vector env restarts the whole game at
    every life loss (measured: lives go 5, 4, 5, 4, ...).
  * ``"envpool"``: envpool's ``AtariEnvPool`` (``pip install 'jaxasync[envpool]'``), in C++
    threads, with envpool's own ROM copies. ``noop_max=0`` becomes 1 (envpool crashes on
    0). With ``noop_max=1`` and no sticky actions it returns the gymnasium backend's
    frames and rewards exactly (tested). Seeds must fit envpool's int32.

``scripts/bench_atari.py`` measures the three side by side.
"""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from jaxasync.errors import ConfigError
from jaxasync.placement import usable_cores

BACKENDS = ("gymnasium", "ale_vector", "envpool")


def _import_ale():
  """ale_py, with its ``ALE/...`` ids registered with gymnasium."""
  try:
    import ale_py
  except ImportError as e:
    raise ConfigError(
        f"Atari envs need ale-py ({e}); install them with `pip install 'jaxasync[atari]'` "
        "(gymnasium[atari], ale-py and opencv-python-headless; ale-py ships the ROMs).") from None
  gym.register_envs(ale_py)
  return ale_py


def _game_title(env_id: str) -> str:
  """``"ALE/MsPacman-v5"`` or ``"MsPacmanNoFrameskip-v4"`` -> ``"MsPacman"``."""
  return env_id.split("/", 1)[-1].split("-", 1)[0].replace("NoFrameskip", "")


def _game_name(env_id: str) -> str:
  """``"ALE/MsPacman-v5"`` -> ``"ms_pacman"`` (ale-py's ROM name)."""
  name = _game_title(env_id)
  out = []
  for i, ch in enumerate(name):
    if ch.isupper() and i > 0 and not name[i - 1].isupper():
      out.append("_")
    out.append(ch.lower())
  return "".join(out)


class EpisodicLife(gym.Wrapper):
  """Ends the episode (``terminated=True``) when a life is lost, without resetting the game.

  ``reset`` after a life loss takes one no-op step instead of restarting the game, so the
  agent sees every life of a game (Mnih et al. 2015; SB3's ``EpisodicLifeEnv``).
  gymnasium's ``AtariPreprocessing(terminal_on_life_loss=True)`` is not used because its
  ``reset`` restarts the whole game at every life loss, which changes the game played.
  Goes directly around ``AtariPreprocessing`` (whose step is one agent step).
  """

  def __init__(self, env: gym.Env):
    super().__init__(env)
    self._lives = 0
    self._game_over = True

  def step(self, action):
    obs, reward, terminated, truncated, info = self.env.step(action)
    self._game_over = terminated or truncated
    lives = self.env.unwrapped.ale.lives()
    if 0 < lives < self._lives:
      terminated = True
    self._lives = lives
    return obs, reward, terminated, truncated, info

  def reset(self, *, seed=None, options=None):
    if self._game_over or seed is not None:
      obs, info = self.env.reset(seed=seed, options=options)
    else:  # a life was lost: continue the same game from where it stands
      obs, _, terminated, truncated, info = self.env.step(0)
      if terminated or truncated:  # (the no-op itself ended the game)
        obs, info = self.env.reset(options=options)
    self._game_over = False
    self._lives = self.env.unwrapped.ale.lives()
    return obs, info


class _StackLast(gym.ObservationWrapper):
  """``[K, H, W]`` frame stacks -> ``[H, W, K]`` (contiguous), as ``NatureCNN`` expects."""

  def __init__(self, env: gym.Env):
    super().__init__(env)
    k, h, w = env.observation_space.shape
    self.observation_space = gym.spaces.Box(0, 255, (h, w, k), np.uint8)

  def observation(self, obs):
    return np.ascontiguousarray(np.moveaxis(obs, 0, -1))


class _VectorStackLast(gym.vector.VectorObservationWrapper):
  """``[N, K, H, W]`` -> ``[N, H, W, K]`` for a native vector env."""

  def __init__(self, env: gym.vector.VectorEnv):
    super().__init__(env)
    k, h, w = env.single_observation_space.shape
    self.single_observation_space = gym.spaces.Box(0, 255, (h, w, k), np.uint8)
    self.observation_space = gym.vector.utils.batch_space(
        self.single_observation_space, env.num_envs)

  def observations(self, observations):
    return np.ascontiguousarray(np.moveaxis(observations, 1, -1))


@dataclasses.dataclass(frozen=True)
class AtariEnvFactory:
  """Builds preprocessed Atari vector envs (see the module docstring). Picklable.

  Attributes:
    env_id: an ale-py gymnasium id, e.g. ``"ALE/Pong-v5"``.
    episodic_life: end an episode at every life loss (the game itself continues; see
      ``EpisodicLife``). Use it for training only; evaluate on full games.
    sticky_actions: repeat the previous action with probability 0.25 at every emulator
      frame (Machado et al. 2018's stochasticity, the ``-v5`` default); ``False``: 0.
    noop_max: at most this many no-op emulator frames after each reset (0: none; see the
      module docstring for each backend's exact draw).
    frame_skip: emulator frames per agent step (the last two are max-pooled).
    frame_stack: frames per observation, ``K``.
    screen_size: side of the square resized frame.
    max_episode_frames: emulator frames after which an episode is truncated.
    full_action_space: all 18 actions instead of the game's minimal set.
    backend: ``"gymnasium"``, ``"ale_vector"`` or ``"envpool"`` (see the module docstring).
      The C++ backends run the same pipeline; ``ale_vector`` ships with ale-py, while the
      envpool wheel also pulls in MuJoCo assets, matplotlib and glfw (~600 MB).
    vectorization_mode: ``"sync"`` or ``"async"`` (one process per sub-env) for the
      gymnasium backend.
    num_threads: ``ale_vector`` / ``envpool`` worker threads; 0 uses
      ``min(num_envs, cpu_count)``.
  """

  env_id: str = "ALE/Pong-v5"
  episodic_life: bool = False
  sticky_actions: bool = True
  noop_max: int = 30
  frame_skip: int = 4
  frame_stack: int = 4
  screen_size: int = 84
  max_episode_frames: int = 108_000
  full_action_space: bool = False
  backend: str = "gymnasium"
  vectorization_mode: str = "sync"
  num_threads: int = 0

  def __post_init__(self):
    if self.backend not in BACKENDS:
      raise ConfigError(f"backend must be one of {BACKENDS}, got {self.backend!r}.")
    if self.episodic_life and self.backend == "ale_vector":
      # Measured with ale-py 0.12.1: after a life loss its AtariVectorEnv resets the whole
      # game (lives back to 5), so an agent would only ever play the first life.
      raise ConfigError("episodic_life=True is not supported with backend='ale_vector': "
                        "ale-py's AtariVectorEnv restarts the game at every life loss. Use "
                        "backend='envpool' (same engine, continues the game) or 'gymnasium'.")
    if self.vectorization_mode not in ("sync", "async"):
      raise ConfigError(
          f"vectorization_mode must be 'sync' or 'async', got {self.vectorization_mode!r}.")
    if min(self.frame_skip, self.frame_stack, self.screen_size, self.max_episode_frames) < 1:
      raise ConfigError("frame_skip, frame_stack, screen_size and max_episode_frames must be >= 1.")
    if self.noop_max < 0:
      raise ConfigError(f"noop_max must be >= 0, got {self.noop_max}.")

  @property
  def repeat_action_probability(self) -> float:
    return 0.25 if self.sticky_actions else 0.0

  def make_single(self) -> gym.Env:
    """One preprocessed (non-vector) env of the gymnasium backend: ``[84, 84, K]`` uint8."""
    _import_ale()
    try:
      import cv2  # noqa: F401  (AtariPreprocessing resizes with it)
    except ImportError:
      raise ConfigError("Atari preprocessing needs OpenCV: `pip install opencv-python-headless` "
                        "(or `pip install 'jaxasync[atari]'`).") from None
    # obs_type="grayscale": AtariPreprocessing reads the screen from the ALE itself, so
    # the inner env's own (per-frame) observation is discarded; grayscale is its cheapest.
    env = gym.make(self.env_id, frameskip=1, obs_type="grayscale",
                   repeat_action_probability=self.repeat_action_probability,
                   full_action_space=self.full_action_space,
                   max_num_frames_per_episode=self.max_episode_frames)
    env = gym.wrappers.AtariPreprocessing(
        env, noop_max=self.noop_max, frame_skip=self.frame_skip, screen_size=self.screen_size,
        terminal_on_life_loss=False, grayscale_obs=True, scale_obs=False)
    if self.episodic_life:
      env = EpisodicLife(env)
    env = gym.wrappers.FrameStackObservation(env, self.frame_stack)  # pads with the reset frame
    return _StackLast(env)

  def __call__(self, num_envs: int, seed: int | None = None) -> gym.vector.VectorEnv:
    """A vector env of ``num_envs`` sub-envs in ``NEXT_STEP`` autoreset mode, reset with ``seed``.

    Observations ``[num_envs, screen_size, screen_size, frame_stack]`` uint8; sub-env ``i``
    is seeded with ``seed + i``.
    """
    if num_envs < 1:
      raise ConfigError(f"num_envs must be >= 1, got {num_envs}.")
    if self.backend == "envpool":
      env = self._envpool(num_envs, seed)
      env.reset()  # seeded at construction
      return env
    if self.backend == "ale_vector":
      env = self._ale_vector(num_envs)
    else:
      _import_ale()
      if self.env_id not in gym.registry:
        raise ConfigError(f"unknown Atari id {self.env_id!r}: ale-py registers ids like "
                          "'ALE/Pong-v5' or 'ALE/Breakout-v5'.")
      fns = [self.make_single] * num_envs
      if self.vectorization_mode == "async":
        env = gym.vector.AsyncVectorEnv(fns, autoreset_mode=AutoresetMode.NEXT_STEP)
      else:
        env = gym.vector.SyncVectorEnv(fns, autoreset_mode=AutoresetMode.NEXT_STEP)
    env.reset(seed=seed)
    return env

  def _ale_vector(self, num_envs: int) -> gym.vector.VectorEnv:
    ale_py = _import_ale()
    version = tuple(int(x) for x in ale_py.__version__.split(".")[:2] if x.isdigit())
    if version < (0, 12):  # AtariVectorEnv's autoreset_mode (NEXT_STEP) came in ale-py 0.12
      raise ConfigError(f"backend='ale_vector' needs ale-py >= 0.12, found {ale_py.__version__}; "
                        "`pip install -U ale-py` or use backend='gymnasium'.")
    from ale_py.vector_env import AtariVectorEnv
    game = _game_name(self.env_id)
    if ale_py.roms.get_rom_path(game) is None:
      raise ConfigError(f"no ale-py ROM {game!r} for env id {self.env_id!r}; pass an id like "
                        "'ALE/Pong-v5'.")
    env = AtariVectorEnv(
        game, num_envs, num_threads=self._threads(num_envs),
        max_num_frames_per_episode=self.max_episode_frames,
        repeat_action_probability=self.repeat_action_probability,
        full_action_space=self.full_action_space, autoreset_mode=AutoresetMode.NEXT_STEP,
        img_height=self.screen_size, img_width=self.screen_size, grayscale=True,
        stack_num=self.frame_stack, frameskip=self.frame_skip, maxpool=True,
        noop_max=self.noop_max, episodic_life=False,  # refused in __post_init__
        reward_clipping=False,  # clipped by the step processor (ReplayConfig.reward_clip)
        use_fire_reset=False)  # as the gymnasium backend
    return _VectorStackLast(env)

  def _threads(self, num_envs: int) -> int:
    # The cores this process may run on (an actor pinned to one core gets one thread).
    return self.num_threads or min(num_envs, len(usable_cores()))

  def _envpool(self, num_envs: int, seed: int | None) -> gym.vector.VectorEnv:
    try:
      import envpool
    except ImportError as e:
      raise ConfigError(f"backend='envpool' needs envpool ({e}): `pip install "
                        "'jaxasync[envpool]'`, or use backend='ale_vector' (same engine, "
                        "ships with ale-py).") from None
    task_id = _game_title(self.env_id) + "-v5"
    if task_id not in envpool.list_all_envs():
      raise ConfigError(f"envpool has no Atari task {task_id!r} (from env id {self.env_id!r}); "
                        "pass an id like 'ALE/Pong-v5'.")

    def make(seed: int | None):
      max_seed = 2**31 - num_envs  # sub-env i gets seed + i, an int32 in envpool
      if seed is None:  # envpool needs an int seed: draw one from OS entropy
        seed = int(np.random.SeedSequence().generate_state(1)[0]) % max_seed
      if not 0 <= seed < max_seed:
        raise ConfigError(f"backend='envpool' takes seeds in [0, 2**31 - num_envs), got {seed}; "
                          "pass a smaller seed.")
      return envpool.make(
          task_id, env_type="gymnasium", num_envs=num_envs, seed=seed,
          num_threads=self._threads(num_envs),
          # envpool counts agent steps; the cap is in emulator frames (rounded up, as an
          # agent step that crosses the cap ends the episode in the other backends).
          max_episode_steps=-(-self.max_episode_frames // self.frame_skip),
          img_height=self.screen_size, img_width=self.screen_size, gray_scale=True,
          stack_num=self.frame_stack, frame_skip=self.frame_skip,
          noop_max=max(1, self.noop_max),  # envpool's minimum (it crashes on 0)
          episodic_life=self.episodic_life,
          repeat_action_probability=self.repeat_action_probability,
          full_action_space=self.full_action_space,
          reward_clip=False,  # clipped by the step processor (ReplayConfig.reward_clip)
          use_fire_reset=False)  # as the other backends

    return _EnvPoolStackLast(make, seed)


class _EnvPoolStackLast(_VectorStackLast):
  """``_VectorStackLast`` for envpool, whose seed is fixed at construction.

  ``reset(seed=s)`` rebuilds the pool with ``s`` (envpool itself ignores a reset seed), so
  a seeded reset reproduces a trajectory as on the other backends; ``reset()`` continues.
  """

  def __init__(self, make, seed: int | None):
    super().__init__(make(seed))
    self._make = make

  def reset(self, *, seed=None, options=None):
    if seed is not None:
      self.env.close()
      self.env = self._make(seed)
    return super().reset(options=options)


def is_atari_id(env_id: str) -> bool:
  """Whether ``env_id`` names an ale-py game (``ALE/...``, ``...NoFrameskip...``, ``...-v4``)."""
  env_id = env_id.split(":", 1)[-1]
  return (env_id.startswith("ALE/") or "NoFrameskip" in env_id
          or env_id.endswith("Deterministic-v4"))

