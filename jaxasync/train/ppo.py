"""PPO, synchronous or asynchronous (Sebulba-style), on any gymnasium env with Box observations
and Discrete actions (a categorical policy) or a bounded one-axis Box of actions (a diagonal
Gaussian, its samples clipped to the Box).

  python -m jaxasync.train ppo                         # --preset cartpole: CartPole-v1, async
  python -m jaxasync.train ppo --mode sync --seed 3    # lock-step: unrolls from the newest params
  python -m jaxasync.train ppo --agent.num-epochs 4 --agent.num-minibatches 4
  python -m jaxasync.train ppo --preset pendulum       # RL Zoo's Pendulum-v1 settings
  python -m jaxasync.train ppo --preset mujoco         # CleanRL's MuJoCo settings, HalfCheetah-v5
  python -m jaxasync.train ppo --preset mujoco --env-id Hopper-v5
  python -m jaxasync.train ppo --preset mujoco --help  # every flag, with that preset's defaults
  python -m jaxasync.train ppo --preset minatar --env-id MinAtar/SpaceInvaders-v1  # gymnax-blines'

One SGD step of the loop is one PPO iteration: --agent.num-epochs passes of
--agent.num-minibatches minibatches over --agent.batch-size unrolls. The ratio is taken
against the policy the actor acted with, so unrolls from older params (async) are clipped
like any other; those older than --agent.max-policy-lag iterations are dropped. The run's
and the actors' flags are jaxasync.train.impala's. A preset only sets defaults: any flag given
after it overrides them. The MuJoCo envs need `pip install "gymnasium[mujoco]"`, MinAtar
`pip install "jaxasync[minatar]"`.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, ClassVar, Literal

import jaxasync as ja
from jaxasync import experiment


def cartpole_agent() -> ja.PPOConfig:
  # RL Zoo's tuned CartPole-v1 PPO (8 envs x 32 steps, 20 epochs of one 256 minibatch,
  # gamma 0.98, GAE 0.8, no entropy bonus, lr annealed linearly; the clip stays 0.2) on tanh
  # torsos with orthogonal init (CleanRL's, the "37 details"): with ReLU and Flax's init 9 of
  # 10 tuning seeds held and 7 stayed at 500 once there; with tanh 10 and 10
  # (docs/bench_learning_results.md, issue 28).
  return ja.PPOConfig(batch_size=1, gamma=0.98, gae_lambda=0.8, learning_rate=1e-3,
                      num_epochs=20, num_minibatches=1, entropy_cost=0.0, activation="tanh",
                      orthogonal_init=True,
                      data=ja.UnrollConfig(unroll_length=32, max_policy_lag=8))


def cartpole_run() -> ja.RunConfig:
  # One SGD step of the loop is one PPO iteration: evaluations, records and saves count those.
  return ja.RunConfig(max_opts=1_000_000, max_env_steps=150_000, updates_per_call=1,
                      eval_interval=20, record_interval=10, save_interval=200)


Preset = Literal["cartpole", "pendulum", "mujoco", "minatar"]


@dataclasses.dataclass
class Args(experiment.AnnealedRunArgs):
  """PPO's flags: the run's and the actors' (as jaxasync.train.impala's) and the agent's
  (--agent.*). The defaults are the cartpole preset's."""

  algo: ClassVar[str] = "ppo"

  preset: Preset = "cartpole"
  """sets every other flag's default: RL Zoo's CartPole and Pendulum; CleanRL's MuJoCo;
  gymnax-blines' MinAtar."""

  run: Annotated[ja.RunConfig, experiment.Flat] = dataclasses.field(
      default_factory=cartpole_run)
  actors: Annotated[ja.ActorsConfig, experiment.Flat] = dataclasses.field(
      default_factory=experiment.on_policy_actors)
  agent: ja.PPOConfig = dataclasses.field(default_factory=cartpole_agent)


def pendulum_preset() -> Args:
  """Pendulum-v1 with RL Zoo's tuned PPO settings (hyperparams/ppo.yml): 4 envs x 1024 steps
  per iteration, 10 epochs, gamma 0.9, GAE 0.95, Adam 1e-3, clip 0.2, no entropy bonus, on
  stable-baselines3's defaults for the rest (64 minibatches of 64, gradient clip 0.5, value
  cost 0.5, Adam eps 1e-5, separate 64x64 tanh torsos with orthogonal init, log-std
  initialised to 0), 100k env steps. RL Zoo explores with gSDE (state-dependent noise drawn
  every 4 steps); here the Gaussian's noise is drawn every step, and the step size anneals
  to 0 over the run (--anneal-lr, on by default: --no-anneal-lr for RL Zoo's constant one).
  Evaluations (ours): 50 greedy episodes (a 10-episode mean of one policy moves by +-30 with
  Pendulum's start states) every 2 iterations. In sync on seeds 0-2 the greedy mean passed
  -250 after 41-57k env steps (-163 at 100k on seed 0; about 100 s on a 2-core CPU).
  """
  agent = ja.PPOConfig(batch_size=1, gamma=0.9, gae_lambda=0.95, learning_rate=1e-3,
                       num_epochs=10, num_minibatches=64, clip_epsilon=0.2, entropy_cost=0.0,
                       max_grad_norm=0.5, activation="tanh", orthogonal_init=True,
                       data=ja.UnrollConfig(unroll_length=1024, max_policy_lag=2))
  run = ja.RunConfig(max_opts=1_000_000, max_env_steps=100_000, updates_per_call=1,
                     eval_interval=2, eval_episodes=50, record_interval=1, save_interval=10)
  actors = dataclasses.replace(experiment.on_policy_actors(), num_envs=4)
  return Args(preset="pendulum", env_id="Pendulum-v1", agent=agent, run=run, actors=actors)


def mujoco_preset() -> Args:
  """The MuJoCo -v5 envs (HalfCheetah, Hopper, Walker2d, Ant...) with CleanRL's
  ppo_continuous_action.py settings: 1 env x 2048 steps per iteration, 10 epochs of 32
  minibatches (64 transitions each), Adam 3e-4 (eps 1e-5) annealed linearly to 0, gamma 0.99,
  GAE 0.95, clip 0.2, the value's change clipped at 0.2 too (CleanRL's clip_vloss), value
  cost 0.5, no entropy bonus, gradient clip 0.5, separate 64x64 tanh torsos with
  orthogonal init, a state-independent log-std initialised to 0, observations normalised
  by running statistics and clipped at 10, rewards divided by the running standard
  deviation of the discounted return and clipped at 10, 1M env steps. Evaluations (ours):
  10 greedy episodes every 10 iterations.
  """
  # CleanRL normalises observations and scales rewards with gymnasium's NormalizeObservation
  # and NormalizeReward inside each env; here both statistics are the learner's
  # (normalize_observations, normalize_rewards: updated from the batches it trains on), so
  # actors and the evaluator cannot drift apart. The discounted return that scales the
  # rewards is continued per sub-env by the actor's collector and restarts with each episode
  # (SB3's VecNormalize, gym's NormalizeReward up to 0.25; gymnasium's since 0.26 carries it
  # across truncations, HalfCheetah's only episode ends); the statistics move once per
  # batch, before its epochs, where CleanRL's move every env step.
  agent = ja.PPOConfig(batch_size=1, gamma=0.99, gae_lambda=0.95, learning_rate=3e-4,
                       adam_eps=1e-5, num_epochs=10, num_minibatches=32, clip_epsilon=0.2,
                       value_clip_epsilon=0.2, value_cost=0.5, entropy_cost=0.0,
                       max_grad_norm=0.5, hidden_sizes=(64, 64), activation="tanh",
                       orthogonal_init=True, normalize_observations=True,
                       observation_clip=10.0, normalize_rewards=True, reward_clip=10.0,
                       data=ja.UnrollConfig(unroll_length=2048, max_policy_lag=2))
  run = ja.RunConfig(max_opts=1_000_000, max_env_steps=1_000_000, updates_per_call=1,
                     eval_interval=10, eval_episodes=10, record_interval=1, save_interval=50)
  actors = dataclasses.replace(experiment.on_policy_actors(), num_envs=1)
  return Args(preset="mujoco", env_id="HalfCheetah-v5", agent=agent, run=run, actors=actors)


def minatar_preset() -> Args:
  """The MinAtar games with gymnax-blines' PPO settings (``agents/<Game>-MinAtar/ppo.yaml``,
  the same for every game): 64 envs x 128 steps per iteration, 4 epochs of 8 minibatches
  (1,024 transitions each), Adam 5e-4 held constant, gamma 0.999, GAE 0.95, clip 0.2,
  entropy 0.01, value cost 0.5, gradient clip 0.5, separate 256x256 ReLU torsos on the
  flattened 10x10xC grid (their "Categorical-MLP" with flatten_3d), 10M env steps (1,220
  iterations). Theirs, not here: a 5 % warmup of the step size, and gymnax's JAX port of
  MinAtar without sticky actions (here the ``minatar`` package's, sticky actions 0.1,
  episodes truncated at 27k steps: ``MinAtarEnvFactory``). Ours: orthogonal init, and
  evaluations of 10 episodes that sample the policy as training does, every 25 iterations.
  """
  agent = ja.PPOConfig(batch_size=1, gamma=0.999, gae_lambda=0.95, learning_rate=5e-4,
                       num_epochs=4, num_minibatches=8, clip_epsilon=0.2, entropy_cost=0.01,
                       value_cost=0.5, max_grad_norm=0.5, torso="mlp", hidden_sizes=(256, 256),
                       activation="relu", orthogonal_init=True, eval_greedy=False,
                       data=ja.UnrollConfig(unroll_length=128, max_policy_lag=2))
  run = ja.RunConfig(max_opts=1_000_000, max_env_steps=10_000_000, updates_per_call=1,
                     eval_interval=25, eval_episodes=10, record_interval=5, save_interval=100)
  actors = dataclasses.replace(experiment.on_policy_actors(), num_envs=64)
  return Args(preset="minatar", env_id="MinAtar/Breakout-v1", anneal_lr=False, agent=agent,
              run=run, actors=actors)


PRESETS = {"cartpole": Args, "pendulum": pendulum_preset, "mujoco": mujoco_preset,
           "minatar": minatar_preset}


def parse(argv: list[str] | None = None) -> Args:
  """Reads ``--preset`` first, then parses every flag with that preset's values as defaults."""
  return experiment.parse_with_presets(PRESETS, argv, __doc__)


def main(args: Args) -> dict:
  return experiment.run(args, f"PPO, preset {args.preset}", ja.PPO,
                        experiment.annealed_agent(args))


def cli(argv: list[str] | None = None) -> None:
  """``python -m jaxasync.train ppo [flags]``: parses ``argv`` (default: the command line)
  and runs, with one ``error:`` line for bad input or a failed run."""
  experiment.run_cli(lambda: main(parse(argv)))
