"""IMPALA (V-trace), synchronous or asynchronous, on any gymnasium env with Box observations
and Discrete actions (a categorical policy) or a bounded one-axis Box of actions (a diagonal
Gaussian, its samples clipped to the Box; the cartpole preset is tuned for CartPole: pass
--env-id).

  python -m jaxasync.train impala                        # CartPole-v1, one actor process
  python -m jaxasync.train impala --mode sync --seed 3   # lock-step: every unroll from the newest params
  python -m jaxasync.train impala --num-actors 2 --agent.max-policy-lag 8
  python -m jaxasync.train impala --preset minatar --env-id MinAtar/Freeway-v1  # the MinAtar games
  python -m jaxasync.train impala --preset minatar --help  # every flag, with that preset's defaults
  python -m jaxasync.train impala --help                 # every flag

A preset only sets defaults: any flag given after it overrides them.

Actors push unrolls of --agent.unroll-length steps of their --num-envs sub-envs with the
behaviour policy; the learner takes --agent.batch-size unrolls per SGD step, oldest first,
each once, and drops those older than --agent.max-policy-lag SGD steps. The run's and the
actors' flags are jaxasync.train.dqn's; the agent's are --agent.*. The MinAtar preset needs
`pip install "jaxasync[minatar]"`.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, ClassVar, Literal

import jaxasync as ja
from jaxasync import experiment


def cartpole_agent() -> ja.IMPALAConfig:
  # Many small updates, as A2C's tuned CartPole (RL Zoo: 8 envs x 5 steps, ~7e-4, no entropy
  # bonus, tanh torsos with orthogonal init, a gradient clip that binds): one unroll of 5 steps
  # x 8 envs per SGD step, Adam 7e-4 annealed to 0, global-norm clip 1. The earlier preset (2
  # unrolls of 16 steps, 5e-4, ReLU, clip 40) took 1,172 SGD steps in 300k env steps and its
  # policy never sharpened (entropy ~0.58; 1 of 10 fresh seeds held). With ReLU torsos these
  # small updates collapsed. Clip 40 held 8 of fresh seeds 100-109 (two fell after gradient-norm
  # spikes of 20-40); clip 1 held every tuning seed and 17 of 100-119, its three failures a
  # value stuck at the return bound (the clip shrinks the rare batches holding an episode's
  # end). docs/bench_learning_results.md, issue 28.
  # The policy is also held near a slow (tau 0.005) Polyak average of itself: once every
  # training episode reaches the time limit its advantages are ~0, Adam rescales what is left
  # to full-sized steps, and without the anchor the policy drifts until it falls (2 of fresh
  # seeds 100-109 in sync). docs/bench_learning_results.md, issue 28.
  return ja.IMPALAConfig(batch_size=1, learning_rate=7e-4, entropy_cost=0.0, activation="tanh",
                         orthogonal_init=True, max_grad_norm=1.0, target_kl_cost=1.0,
                         data=ja.UnrollConfig(unroll_length=5, max_policy_lag=50))


def cartpole_run() -> ja.RunConfig:
  # One SGD step per unroll batch: evaluations, records and saves count those.
  return ja.RunConfig(max_opts=1_000_000, max_env_steps=300_000, updates_per_call=1,
                      eval_interval=100, record_interval=50, save_interval=1_000)


Preset = Literal["cartpole", "minatar"]


@dataclasses.dataclass
class Args(experiment.AnnealedRunArgs):
  """IMPALA's flags: the run's and the actors' (as jaxasync.train.dqn's) and the agent's
  (--agent.*, its unrolls' included). The defaults are the cartpole preset's."""

  algo: ClassVar[str] = "impala"

  preset: Preset = "cartpole"
  """sets every other flag's default: the tuned CartPole job; the MinAtar games."""

  run: Annotated[ja.RunConfig, experiment.Flat] = dataclasses.field(
      default_factory=cartpole_run)
  actors: Annotated[ja.ActorsConfig, experiment.Flat] = dataclasses.field(
      default_factory=experiment.on_policy_actors)
  agent: ja.IMPALAConfig = dataclasses.field(default_factory=cartpole_agent)


def minatar_preset() -> Args:
  """The MinAtar games, with the IMPALA paper's Atari learner on the PPO preset's network (we
  found no published IMPALA settings for MinAtar to follow): unrolls of 20 steps (the
  paper's) from 32 envs, one unroll (640 transitions, the paper's 32 x 20) per SGD step, each
  used once; Adam 3e-4 (half the paper's RMSProp 6e-4: at 6e-4 Breakout's policy lost all
  its entropy by 470k env steps and scored 0 from there; docs/) annealed linearly to 0 over
  the run, entropy cost 0.01, baseline cost 0.5, gamma 0.99,
  V-trace with rho-bar = c-bar = 1; separate 256x256 ReLU torsos on the flattened 10x10xC grid
  with orthogonal init (the PPO preset's). Not the paper's: a global-norm gradient clip of 0.5
  rather than 40 (the losses here are means over the unroll, so 40 never binds; 0.5 is
  gymnax-blines' PPO clip), and the ``minatar`` package's envs (sticky actions 0.1, episodes
  truncated at 27k steps: ``MinAtarEnvFactory``). 5M env steps (7,812 SGD steps), issue 32's
  2-core budget for the on-policy agents; evaluations of 10 episodes that sample the policy,
  as training does, every 250 SGD steps (160k env steps).
  """
  agent = ja.IMPALAConfig(batch_size=1, gamma=0.99, learning_rate=3e-4, entropy_cost=0.01,
                          baseline_cost=0.5, max_grad_norm=0.5, torso="mlp",
                          hidden_sizes=(256, 256), activation="relu", orthogonal_init=True,
                          eval_greedy=False,
                          data=ja.UnrollConfig(unroll_length=20, max_policy_lag=8))
  run = ja.RunConfig(max_opts=1_000_000, max_env_steps=5_000_000, updates_per_call=1,
                     eval_interval=250, eval_episodes=10, record_interval=25,
                     save_interval=1_000)
  actors = dataclasses.replace(experiment.on_policy_actors(), num_envs=32)
  return Args(preset="minatar", env_id="MinAtar/Breakout-v1", agent=agent, run=run,
              actors=actors)


PRESETS = {"cartpole": Args, "minatar": minatar_preset}


def parse(argv: list[str] | None = None) -> Args:
  """Reads ``--preset`` first, then parses every flag with that preset's values as defaults."""
  return experiment.parse_with_presets(PRESETS, argv, __doc__)


def main(args: Args) -> dict:
  return experiment.run(args, f"IMPALA, preset {args.preset}", ja.IMPALA,
                        experiment.annealed_agent(args))


def cli(argv: list[str] | None = None) -> None:
  """``python -m jaxasync.train impala [flags]``: parses ``argv`` (default: the command line)
  and runs, with one ``error:`` line for bad input or a failed run."""
  experiment.run_cli(lambda: main(parse(argv)))
