"""jaxasync: asynchronous actor-learner reinforcement learning in JAX."""

import os as _os
import signal as _signal
import sys as _sys

# `python -m jaxasync.train ...`: a Ctrl-C while this package imports JAX (seconds) would end in
# a KeyboardInterrupt traceback from runpy's import machinery, before any of the command's code
# runs; it ends in one line and exit status 130 instead. (argv[0] is "-m" only while `python
# -m` locates its module: a program importing jaxasync keeps its own Ctrl-C.)
_QUIET_IMPORT = (_sys.argv[:1] == ["-m"]
                 and _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler)


def _interrupted_while_importing(signum, frame):
  # (not an exception: raised inside an import's weakref callback it would only be printed)
  print("interrupted before training started", file=_sys.stderr, flush=True)
  _os._exit(130)


if _QUIET_IMPORT:
  _signal.signal(_signal.SIGINT, _interrupted_while_importing)

from jaxasync.actor import ActorConfig
from jaxasync.agent import ActorContext, Agent
from jaxasync.actor_manager import ActorManager, ActorStats
from jaxasync.agents.dqn import DQN, DQNConfig, DQNState, rainbow_config, rainbow_replay
from jaxasync.agents.dqn_losses import Categorical, Munchausen, QLearning
from jaxasync.agents.target_updates import HardCopy, Polyak
from jaxasync.agents.sac import SAC, SACConfig, SACState
from jaxasync.agents.td3 import TD3, TD3Config, TD3State
from jaxasync.agents.actor_critic import ActorCriticConfig, ActorCriticState
from jaxasync.agents.impala import IMPALA, IMPALAConfig
from jaxasync.agents.ppo import PPO, PPOConfig
from jaxasync.agents.pqn import PQN, PQNConfig
from jaxasync.agents.exploration import EpsilonState, apex_epsilons, epsilon_greedy, linear_epsilon
from jaxasync.atari import AtariEnvFactory
from jaxasync.checkpoint import claim_run_dir, restore_checkpoint, save_checkpoint
from jaxasync.errors import ActorFailed, CheckpointError, ConfigError, NonFiniteError, StallError
from jaxasync.envs import EnvFactory, VectorEnvFactory, check_env_id
from jaxasync.evaluator import Evaluator
from jaxasync.inference import InferenceClient, InferenceServer
from jaxasync.config import ActorsConfig, RunConfig
from jaxasync.pipeline import DataPipeline, ReplayConfig, UnrollConfig
from jaxasync.hooks import Hook, IntervalTrigger
from jaxasync.learner import Learner
from jaxasync.ledger import RunLedger
from jaxasync.loop import ActorFeed, LearnerLoop, LockstepFeed
from jaxasync.sources import QueueSource, ReplaySource, Sample, RateLimiter, UpdateCredit
from jaxasync.collectors import FrameStepProcessor, StepProcessor, UnrollCollector, Unroll
from jaxasync.minatar import MinAtarEnvFactory
from jaxasync.param_store import SharedParamStore, ThreadParamStore
from jaxasync.recorder import (ConsoleRecorder, MemoryRecorder, MultiRecorder, NullRecorder,
                               Recorder, TensorboardRecorder)
from jaxasync.replay import PrioritizedReplayBuffer, ReplayBuffer, SumTree, linear_beta
from jaxasync.replay.frames import FrameReplayBuffer, PrioritizedFrameReplayBuffer
from jaxasync.sharding import DataParallel, constrain_to_batch_shards, learner_devices
from jaxasync.trainer import Trainer
from jaxasync.transport import Chunk, ChunkQueue
from jaxasync.types import ModelInfo, Transition

if _QUIET_IMPORT:  # (the command's own code takes Ctrl-C from here: run_cli)
  _signal.signal(_signal.SIGINT, _signal.default_int_handler)

__version__ = "0.1.0"

__all__ = [
    "ActorConfig",
    "ActorCriticConfig",
    "ActorCriticState",
    "ActorContext",
    "ActorFailed",
    "ActorFeed",
    "ActorManager",
    "ActorStats",
    "ActorsConfig",
    "Agent",
    "AtariEnvFactory",
    "Categorical",
    "Chunk",
    "ChunkQueue",
    "ConfigError",
    "ConsoleRecorder",
    "DQN",
    "DQNConfig",
    "DQNState",
    "DataParallel",
    "DataPipeline",
    "EnvFactory",
    "EpsilonState",
    "Evaluator",
    "FrameReplayBuffer",
    "FrameStepProcessor",
    "HardCopy",
    "InferenceClient",
    "InferenceServer",
    "Hook",
    "IMPALA",
    "IMPALAConfig",
    "IntervalTrigger",
    "Learner",
    "LearnerLoop",
    "LockstepFeed",
    "MemoryRecorder",
    "MinAtarEnvFactory",
    "ModelInfo",
    "MultiRecorder",
    "Munchausen",
    "NonFiniteError",
    "CheckpointError",
    "NullRecorder",
    "PPO",
    "PPOConfig",
    "Polyak",
    "PQN",
    "PQNConfig",
    "PrioritizedFrameReplayBuffer",
    "PrioritizedReplayBuffer",
    "QLearning",
    "QueueSource",
    "RateLimiter",
    "Recorder",
    "ReplayBuffer",
    "ReplayConfig",
    "ReplaySource",
    "RunConfig",
    "RunLedger",
    "SAC",
    "SACConfig",
    "SACState",
    "Sample",
    "SharedParamStore",
    "StallError",
    "StepProcessor",
    "SumTree",
    "TD3",
    "TD3Config",
    "TD3State",
    "TensorboardRecorder",
    "ThreadParamStore",
    "Trainer",
    "Transition",
    "Unroll",
    "UnrollCollector",
    "UnrollConfig",
    "UpdateCredit",
    "VectorEnvFactory",
    "apex_epsilons",
    "check_env_id",
    "claim_run_dir",
    "constrain_to_batch_shards",
    "epsilon_greedy",
    "learner_devices",
    "linear_beta",
    "linear_epsilon",
    "rainbow_config",
    "rainbow_replay",
    "restore_checkpoint",
    "save_checkpoint",
]
