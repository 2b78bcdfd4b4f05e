"""jaxasync: asynchronous actor-learner reinforcement learning in JAX."""

from jaxasync.actor import ActorConfig, apex_epsilons
from jaxasync.actor_manager import ActorFailed, ActorManager, ActorStats
from jaxasync.agents.dqn import DQN, DQNConfig, DQNState, linear_epsilon
from jaxasync.async_trainer import AsyncConfig, AsyncTrainer, RateLimiter, train_async
from jaxasync.atari import AtariEnvFactory
from jaxasync.checkpoint import claim_run_dir, restore_checkpoint, save_checkpoint
from jaxasync.envs import ConfigError, EnvFactory, check_env_id
from jaxasync.evaluator import Evaluator
from jaxasync.faults import NonFiniteError, StallError
from jaxasync.inference import InferenceClient, InferenceServer
from jaxasync.learner import IntervalTrigger, Learner
from jaxasync.minatar import MinAtarEnvFactory
from jaxasync.param_store import SharedParamStore, ThreadParamStore
from jaxasync.recorder import (ConsoleRecorder, MemoryRecorder, MultiRecorder, NullRecorder,
                               Recorder, TensorboardRecorder)
from jaxasync.replay import PrioritizedReplayBuffer, ReplayBuffer, SumTree, linear_beta
from jaxasync.replay.frames import FrameReplayBuffer, FrameStepProcessor, PrioritizedFrameReplayBuffer
from jaxasync.step_processor import StepProcessor
from jaxasync.trainer import Trainer, TrainerConfig
from jaxasync.transport import Chunk, ChunkQueue
from jaxasync.types import ModelInfo, Transition

__version__ = "0.1.0"

__all__ = [
    "ActorConfig",
    "ActorFailed",
    "ActorManager",
    "ActorStats",
    "AsyncConfig",
    "AsyncTrainer",
    "AtariEnvFactory",
    "Chunk",
    "ChunkQueue",
    "ConfigError",
    "ConsoleRecorder",
    "DQN",
    "DQNConfig",
    "DQNState",
    "EnvFactory",
    "Evaluator",
    "FrameReplayBuffer",
    "FrameStepProcessor",
    "InferenceClient",
    "InferenceServer",
    "IntervalTrigger",
    "Learner",
    "MemoryRecorder",
    "MinAtarEnvFactory",
    "ModelInfo",
    "MultiRecorder",
    "NonFiniteError",
    "NullRecorder",
    "PrioritizedFrameReplayBuffer",
    "PrioritizedReplayBuffer",
    "RateLimiter",
    "Recorder",
    "ReplayBuffer",
    "SharedParamStore",
    "StallError",
    "StepProcessor",
    "SumTree",
    "TensorboardRecorder",
    "ThreadParamStore",
    "Trainer",
    "TrainerConfig",
    "Transition",
    "apex_epsilons",
    "check_env_id",
    "claim_run_dir",
    "linear_beta",
    "linear_epsilon",
    "restore_checkpoint",
    "save_checkpoint",
    "train_async",
]
