"""TD3 (Fujimoto et al. 2018), synchronous or asynchronous, on any gymnasium env with Box
observations and a bounded one-axis Box of actions.

  python -m jaxasync.train td3                          # --preset pendulum: Pendulum-v1
  python -m jaxasync.train td3 --mode sync --seed 3
  python -m jaxasync.train td3 --preset mujoco          # the authors' repository's settings, HalfCheetah-v5
  python -m jaxasync.train td3 --preset mujoco --env-id Hopper-v5
  python -m jaxasync.train td3 --preset mujoco --help   # every flag, with that preset's defaults

A preset only sets defaults: any flag given after it overrides them. The run's and the actors'
flags are jaxasync.train.dqn's (the same loop, checkpoints and summary); the agent's, its
replay's included, are --agent.* (TD3Config). Logs, checkpoints and <logdir>/summary.json go
under --logdir. The MuJoCo envs need `pip install "gymnasium[mujoco]"`.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, ClassVar, Literal

import jaxasync as ja
from jaxasync import experiment

Preset = Literal["pendulum", "mujoco"]


def pendulum_agent() -> ja.TD3Config:
  # jaxasync.train.sac's Pendulum network (128x128: a quarter of 256x256's FLOPs per SGD step
  # on a CPU learner), batch, warmup and replay ratio (one SGD step of 128 per env step; actors
  # keep that ratio), so that the two compare. Step sizes 1e-3 (SAC's preset and RL Zoo's TD3
  # Pendulum setting); the rest is the paper's: policy delay 2, exploration noise 0.1,
  # smoothing noise 0.2 clipped at 0.5, tau 0.005, uniform random actions during the warmup.
  return ja.TD3Config(hidden_sizes=(128, 128), actor_learning_rate=1e-3,
                      critic_learning_rate=1e-3, batch_size=128,
                      data=ja.ReplayConfig(n_step=1, warmup_period=500,
                                           samples_per_insert=128.0))


def pendulum_run() -> ja.RunConfig:
  # SAC's Pendulum budget: 20k env steps, 50-episode evaluations (a 10-episode mean of one
  # policy moves by +-30 with Pendulum's start states).
  return ja.RunConfig(max_opts=20_000, max_env_steps=20_000, eval_episodes=50,
                      save_interval=5_000)


@dataclasses.dataclass
class Args(experiment.RunArgs):
  """TD3's flags: the run's and the actors' (as jaxasync.train.dqn's) and the agent's
  (--agent.*, its replay's included). The defaults are the pendulum preset's."""

  algo: ClassVar[str] = "td3"

  preset: Preset = "pendulum"
  """sets every other flag's default: Pendulum-v1 on SAC's budget; the TD3 authors' MuJoCo ones."""
  env_id: str = "Pendulum-v1"
  """gymnasium id, or 'module:EnvName-v0' (imports module)."""
  run: Annotated[ja.RunConfig, experiment.Flat] = dataclasses.field(
      default_factory=pendulum_run)
  agent: ja.TD3Config = dataclasses.field(default_factory=pendulum_agent)


def mujoco_preset() -> Args:
  """The MuJoCo -v5 envs (HalfCheetah, Hopper, Walker2d, Ant) with TD3's published settings:
  those of CleanRL's td3_continuous_action.py, which are the authors' repository's
  (github.com/sfujim/TD3, updated after the paper's 400x300 networks, step size 1e-3 and batch
  100): 256x256 ReLU networks, Adam 3e-4 for actor and critics, batch 256, gamma 0.99, tau
  0.005, policy delay 2, exploration noise 0.1, smoothing noise 0.2 clipped at 0.5, a 1M
  replay, 25k env steps of uniform random actions before the first SGD step, then one SGD step
  per env step (actors: 256 sampled per inserted), 1M env steps. Evaluations (ours): 10
  episodes every 10k SGD steps.
  """
  data, run = experiment.mujoco_off_policy(warmup_period=25_000)
  agent = ja.TD3Config(data=data)
  return Args(preset="mujoco", env_id="HalfCheetah-v5", agent=agent, run=run)


PRESETS = {"pendulum": Args, "mujoco": mujoco_preset}


def parse(argv: list[str] | None = None) -> Args:
  """Reads ``--preset`` first, then parses every flag with that preset's values as defaults."""
  return experiment.parse_with_presets(PRESETS, argv, __doc__)


def main(args: Args) -> dict:
  return experiment.run(args, f"TD3, preset {args.preset}", ja.TD3, args.agent)


def cli(argv: list[str] | None = None) -> None:
  """``python -m jaxasync.train td3 [flags]``: parses ``argv`` (default: the command line)
  and runs, with one ``error:`` line for bad input or a failed run."""
  experiment.run_cli(lambda: main(parse(argv)))
