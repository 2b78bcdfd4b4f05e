"""Rainbow (Hessel et al. 2018), synchronous or asynchronous, with every component switchable.

Rainbow = double Q + prioritized replay + dueling head + n-step returns + C51
distributional head + noisy nets (jaxasync.rainbow_config). All six are on by default; each
one turns off with a flag, C51 by choosing another loss (a subcommand, after every other
flag), so ablations are one flag away:

  python -m jaxasync.train rainbow                           # --preset cartpole, CartPole-v1
  python -m jaxasync.train rainbow --mode sync --seed 3 --target-eval-reward 475
  python -m jaxasync.train rainbow --no-noisy                # epsilon-greedy instead of noisy nets
  python -m jaxasync.train rainbow --n-step 1 --no-dueling --no-prioritized loss:q-learning --loss.no-double-q
  python -m jaxasync.train rainbow loss:categorical --loss.no-double-q --loss.num-atoms 21
  python -m jaxasync.train rainbow --preset minatar          # MinAtar Breakout, CPU-sized
  python -m jaxasync.train rainbow --preset minatar --env-id MinAtar/SpaceInvaders-v1
  python -m jaxasync.train rainbow --preset atari            # Dopamine-style Atari (ALE/Pong-v5)
  python -m jaxasync.train rainbow --preset atari --env-id ALE/Breakout-v5 --atari-backend ale_vector
  python -m jaxasync.train rainbow --preset cartpole --help  # every flag, with that preset's defaults

A preset only sets defaults: any flag given after it overrides them. Logs, checkpoints and
<logdir>/summary.json go under --logdir, as with jaxasync.train.dqn.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, ClassVar, Literal

import jaxasync as ja
from jaxasync import experiment
from jaxasync.atari import AtariEnvFactory, is_atari_id
from jaxasync.minatar import is_minatar_id


Preset = Literal["cartpole", "minatar", "atari"]


@dataclasses.dataclass
class Args(experiment.AnnealedRunArgs):
  """The run's and the actors' flags (as jaxasync.train.dqn's) and the agent's, replay
  included, unprefixed."""

  algo: ClassVar[str] = "rainbow"
  flattened: ClassVar[tuple[str, ...]] = ("run", "actors", "data", "agent")

  anneal_lr: bool = False
  """anneal the LR to --learning-rate-end over --max-opts (off: the presets' constant LRs)."""
  # 'cartpole': a CPU-sized Rainbow that solves CartPole-v1; 'minatar': Revisiting Rainbow's
  # MinAtar settings, CPU-sized; 'atari': Dopamine-style Rainbow settings.
  preset: Preset = "cartpole"
  """sets every other flag's default: CartPole; Revisiting Rainbow's MinAtar; Dopamine's Atari."""
  # 'gymnasium': AtariPreprocessing + FrameStackObservation in a SyncVectorEnv; 'ale_vector':
  # ale-py's native threaded vector env; 'envpool': envpool's threaded AtariEnvPool (pip
  # install 'jaxasync[envpool]'). Their small differences are tabulated in jaxasync/atari.py.
  atari_backend: Literal["gymnasium", "ale_vector", "envpool"] = "gymnasium"
  """Atari ids only: gymnasium wrappers, ale-py's vector env (no --episodic-life) or envpool."""
  # Evaluation plays full games either way.
  episodic_life: bool = False
  """Atari ids only: a life loss ends the training episode (logged returns are per life)."""
  sticky_actions: bool = True
  """Atari/MinAtar: repeat the last action w.p. 0.25 (Atari -v5) or 0.1 (MinAtar); off: never."""
  agent: Annotated[ja.DQNConfig, experiment.Flat] = dataclasses.field(
      default_factory=ja.DQNConfig)
  """the agent (DQNConfig): jaxasync.train.dqn's --agent.* flags, without the prefix."""


def cartpole_preset() -> Args:
  """All six components on; sized to solve CartPole-v1 in a few thousand env steps on a CPU.

  The C51 support [0, 100] covers CartPole's discounted returns (at most 1 / (1 - 0.99)).
  Actors sample 64 items per inserted transition (the lock-step run: 128, one SGD step per
  env step).
  """
  agent = ja.rainbow_config(
      v_min=0.0, v_max=100.0, hidden_sizes=(64, 64), learning_rate=1e-3, adam_eps=1e-8,
      batch_size=128, target_update=ja.HardCopy(period=250),
      data=ja.rainbow_replay(replay_capacity=100_000, warmup_period=1_000, gamma=0.99,
                             opt_interval=1.0, samples_per_insert=64.0))
  return Args(preset="cartpole", env_id="CartPole-v1", agent=agent,
              run=ja.RunConfig(max_opts=50_000, updates_per_call=4, eval_interval=1_000,
                               save_interval=10_000))


def atari_preset() -> Args:
  """Dopamine's Rainbow settings (Hessel et al. 2018's, with Dopamine's learning rate).

  Env steps are agent steps (4 frames each with the usual frame skip): warmup 20k agent
  steps, one SGD step every 4 agent steps, target copy every 32k frames = 8k agent steps =
  2k SGD steps, 50M agent steps (200M frames) = 12.5M SGD steps. Async runs keep that
  replay ratio: 32 sampled per 4 inserted = 8 samples per insert. The replay stores each
  frame once (``frames``): ~7.2 kB per transition, 7.2 GB for 1M.
  """
  agent = ja.rainbow_config(
      v_min=-10.0, v_max=10.0, learning_rate=6.25e-5, adam_eps=1.5e-4, batch_size=32,
      target_update=ja.HardCopy(period=2_000),
      data=ja.rainbow_replay(replay_capacity=1_000_000, warmup_period=20_000, gamma=0.99,
                             reward_clip=1.0, opt_interval=4.0, samples_per_insert=8.0,
                             frames=True))
  return Args(preset="atari", env_id="ALE/Pong-v5", agent=agent,
              run=ja.RunConfig(max_opts=12_500_000, updates_per_call=1, eval_interval=62_500,
                               eval_episodes=10, record_interval=2_500, save_interval=250_000),
              actors=ja.ActorsConfig(mode="auto", num_envs=4, sync_interval=50))


def minatar_preset() -> Args:
  """Rainbow on MinAtar: Obando-Ceron & Castro 2021's ("Revisiting Rainbow") hyperparameters
  on MinAtar's reference network.

  From Revisiting Rainbow: Adam 1e-4 (eps 3.125e-4), batch 32, 3-step returns, replay
  100k, warmup 1k env steps, one SGD step per 4 env steps, target copy every 1000 env steps
  = 250 SGD steps, C51 with 51 atoms over [-100, 100], noisy dueling head; 10M env steps =
  2.5M SGD steps. Ours, not theirs: the torso is MinAtar's reference network (Young & Tian:
  conv 3x3x16 VALID + dense 128, ``MinAtarCNN``), which Revisiting Rainbow's own MinAtar
  network need not match, and episodes are truncated at 27k steps (``MinAtarEnvFactory``;
  they used no cap). MinAtar observations are 10x10 grids, so the replay is the plain
  (prioritized) one: ~800 bytes per transition with obs and next_obs.
  """
  agent = ja.rainbow_config(
      v_min=-100.0, v_max=100.0, hidden_sizes=(128,), learning_rate=1e-4, adam_eps=3.125e-4,
      batch_size=32, target_update=ja.HardCopy(period=250),
      data=ja.rainbow_replay(replay_capacity=100_000, warmup_period=1_000, gamma=0.99,
                             opt_interval=4.0, samples_per_insert=8.0))
  return Args(preset="minatar", env_id="MinAtar/Breakout-v1", agent=agent,
              run=ja.RunConfig(max_opts=2_500_000, updates_per_call=4, eval_interval=12_500,
                               eval_episodes=10, record_interval=1_000, save_interval=250_000),
              actors=ja.ActorsConfig(mode="auto", num_envs=4, sync_interval=50))


PRESETS = {"cartpole": cartpole_preset, "minatar": minatar_preset, "atari": atari_preset}


def parse(argv: list[str] | None = None) -> Args:
  """Reads ``--preset`` first, then parses every flag with that preset's values as defaults."""
  return experiment.parse_with_presets(PRESETS, argv, __doc__)


def components(args: Args) -> str:
  """The Rainbow components a run has on (and a Munchausen or Maxmin loss), for its title."""
  a, loss = args.agent, args.agent.loss
  on = {"double-q": loss.double_q, "prioritized": a.data.prioritized, "dueling": a.dueling,
        f"{a.data.n_step}-step": a.data.n_step > 1, f"C51({loss.num_atoms})": loss.num_atoms > 1,
        "noisy": a.noisy, "Munchausen": isinstance(loss, ja.Munchausen),
        f"Maxmin({loss.num_q_networks})": loss.num_q_networks > 1}
  return ", ".join(k for k, v in on.items() if v) or "none (plain DQN)"


def atari_factories(args: Args) -> tuple[AtariEnvFactory, AtariEnvFactory]:
  """Training and evaluation env factories for an Atari ``--env-id`` (evaluation: full games)."""
  train = AtariEnvFactory(args.env_id, episodic_life=args.episodic_life,
                          sticky_actions=args.sticky_actions, backend=args.atari_backend)
  return train, dataclasses.replace(train, env_id=args.eval_env_id or args.env_id,
                                    episodic_life=False)


def env_factories(args: Args) -> tuple[ja.VectorEnvFactory, ja.VectorEnvFactory]:
  """(training, evaluation) env factories: Atari's from the Atari flags, MinAtar's with
  --no-sticky-actions honoured, anything else ``experiment.default_envs``. Atari-only flags on a
  non-Atari id are errors rather than silently ignored."""
  if is_atari_id(args.env_id):
    return atari_factories(args)
  if is_atari_id(args.eval_env_id or ""):
    raise ja.ConfigError(f"--eval-env-id {args.eval_env_id!r} is an Atari id but --env-id "
                         f"{args.env_id!r} is not; evaluate on the kind of env you train on.")
  if args.episodic_life or args.atari_backend != "gymnasium":
    raise ja.ConfigError(f"--episodic-life and --atari-backend apply to Atari ids only, not "
                         f"{args.env_id!r}; drop them.")
  train, evaluate = experiment.default_envs(args)
  if not args.sticky_actions:
    if not is_minatar_id(args.env_id):
      raise ja.ConfigError(f"--no-sticky-actions applies to Atari and MinAtar ids only, not "
                           f"{args.env_id!r}; drop it.")
    train, evaluate = (dataclasses.replace(f, sticky_action_prob=0.0) for f in (train, evaluate))
  return train, evaluate


def main(args: Args) -> dict:
  return experiment.run(
      args, f"Rainbow ({components(args)}), preset {args.preset}", ja.DQN,
      experiment.annealed_agent(args), envs=env_factories(args))


def cli(argv: list[str] | None = None) -> None:
  """``python -m jaxasync.train rainbow [flags]``: parses ``argv`` (default: the command line)
  and runs, with one ``error:`` line for bad input or a failed run."""
  experiment.run_cli(lambda: main(parse(argv)))
