"""DQN, synchronous or asynchronous, on any gymnasium env with Box observations and Discrete actions.

  python -m jaxasync.train dqn                         # CartPole-v1, the default arrangement
  python -m jaxasync.train dqn --mode sync --seed 3
  python -m jaxasync.train dqn --mode thread --num-actors 2
  python -m jaxasync.train dqn --seed 3 agent.loss:q-learning --agent.loss.num-q-networks 2
  python -m jaxasync.train dqn agent.target-update:hard-copy --agent.target-update.period 500
  python -m jaxasync.train dqn --preset minatar --env-id MinAtar/Asterix-v1   # Revisiting Rainbow's DQN
  python -m jaxasync.train dqn --help                  # every flag but a subcommand's own
  python -m jaxasync.train dqn agent.loss:munchausen --help   # the loss's flags

Logs (TensorBoard), checkpoints (<logdir>/best, <logdir>/<opt_steps>, <logdir>/final),
<logdir>/config.json (these flags) and <logdir>/summary.json go under --logdir. The run's
and the actors' flags are jaxasync.RunConfig's and jaxasync.ActorsConfig's; the agent's,
its replay's included, are --agent.*. The loss (agent.loss:q-learning, agent.loss:munchausen,
agent.loss:categorical; default: Munchausen) and the target update
(agent.target-update:polyak, agent.target-update:hard-copy; default: Polyak) are subcommands,
given after every other flag, each followed by its own flags (--agent.loss.*). A preset only
sets defaults: any flag given after it overrides them.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, ClassVar, Literal

import jaxasync as ja
from jaxasync import experiment


def cartpole_agent() -> ja.DQNConfig:
  # Munchausen targets with double Q and LayerNorm: plain double DQN collapsed after solving
  # CartPole in about one run in eight, its Q-values above the largest possible return;
  # Munchausen's log-policy bonus keeps successive policies close, but alone still failed about
  # one run in five; its soft value weighted by the online network's policy (double Q),
  # normalised features (LayerNorm, which keeps bootstrapped targets from feeding back into
  # ever larger activations) and 5-step returns held more seeds (docs/bench_learning_results.md
  # has the tables): with them, values converge sooner, so fewer greedy evaluations come from
  # half-learnt Q-values. Still, the runs that swung after solving had q_max 104-109 against
  # the ~100.4 their data supports: targets clipped there (bound_targets) held them.
  # Actors: 64 sampled items per inserted transition (the lock-step run: one SGD step of 128
  # per env step). 64x64 layers: LayerNorm's reductions made a 128x128 SGD step ~1.4x the
  # old default's on a CPU, and the learner sets an async run's pace; at 64x64 the step costs
  # ~0.55x of 128x128's and the tuning seeds held as many runs.
  # Evaluations run the target network (Polyak: the online one averaged over ~200 SGD steps):
  # the same training, fewer evaluations caught in a passing flip of the greedy policy.
  return ja.DQNConfig(loss=ja.Munchausen(double_q=True, bound_targets=True), layer_norm=True,
                      hidden_sizes=(64, 64), evaluate="target",
                      data=ja.ReplayConfig(n_step=5, samples_per_insert=64.0))


Preset = Literal["cartpole", "minatar"]


@dataclasses.dataclass
class Args(experiment.AnnealedRunArgs):
  """DQN's flags: the run's, the actors', the learning-rate annealing and the agent's
  (--agent.*, its replay's included). The defaults are the cartpole preset's."""

  algo: ClassVar[str] = "dqn"

  preset: Preset = "cartpole"
  """sets every other flag's default: the tuned CartPole job; Revisiting Rainbow's MinAtar DQN."""

  run: Annotated[ja.RunConfig, experiment.Flat] = dataclasses.field(
      default_factory=lambda: ja.RunConfig(save_interval=10_000))
  agent: ja.DQNConfig = dataclasses.field(default_factory=cartpole_agent)
  """the agent (DQNConfig): Munchausen double DQN with LayerNorm (agent.loss:q-learning etc.)."""


def minatar_preset() -> Args:
  """DQN on the MinAtar games with Obando-Ceron & Castro 2021's ("Revisiting Rainbow")
  settings for it (their Configs/dqn_<game>.gin, Dopamine's JaxDQNAgent): one-step
  Q-learning targets from a target network copied every 1,000 env steps (250 SGD steps),
  Huber loss, Adam 2.5e-4 (eps 3.125e-4), batch 32, a 100k uniform replay, warmup 1k env
  steps, one SGD step per 4 env steps, epsilon 1 -> 0.01 over 250k env steps (Dopamine's
  default), evaluation epsilon 0.001, 10M env steps = 2.5M SGD steps, on MinAtar's reference
  network (conv 3x3x16 + dense 128). Ours, not theirs: episodes truncated at 27k steps and
  sticky actions 0.1 (``MinAtarEnvFactory``).
  """
  agent = ja.DQNConfig(
      loss=ja.QLearning(double_q=False), target_update=ja.HardCopy(period=250),
      hidden_sizes=(128,), learning_rate=2.5e-4, adam_eps=3.125e-4, max_grad_norm=0.0,
      batch_size=32, eps_start=1.0, eps_end=0.01, eps_decay_steps=250_000, eval_epsilon=0.001,
      data=ja.ReplayConfig(replay_capacity=100_000, warmup_period=1_000, n_step=1, gamma=0.99,
                           opt_interval=4.0, samples_per_insert=8.0))
  return Args(preset="minatar", env_id="MinAtar/Breakout-v1", anneal_lr=False, agent=agent,
              run=ja.RunConfig(max_opts=2_500_000, updates_per_call=4, eval_interval=12_500,
                               eval_episodes=10, record_interval=1_000, save_interval=250_000),
              actors=ja.ActorsConfig(mode="auto", num_envs=4, sync_interval=50))


PRESETS = {"cartpole": Args, "minatar": minatar_preset}


def parse(argv: list[str] | None = None) -> Args:
  """Reads ``--preset`` first, then parses every flag with that preset's values as defaults."""
  return experiment.parse_with_presets(PRESETS, argv, __doc__)


def main(args: Args) -> dict:
  title = "DQN" if args.preset == "cartpole" else f"DQN, preset {args.preset}"
  return experiment.run(args, title, ja.DQN, experiment.annealed_agent(args))


def cli(argv: list[str] | None = None) -> None:
  """``python -m jaxasync.train dqn [flags]``: parses ``argv`` (default: the command line)
  and runs, with one ``error:`` line for bad input or a failed run."""
  experiment.run_cli(lambda: main(parse(argv)))
