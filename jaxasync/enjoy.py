"""Evaluate a saved run, and watch it: ``python -m jaxasync.enjoy RUN_DIR``.

  python -m jaxasync.enjoy runs/dqn                          # best/, 10 episodes
  python -m jaxasync.enjoy runs/dqn --checkpoint final --episodes 100
  python -m jaxasync.enjoy runs/ppo --video ppo.gif          # and record one episode
  python -m jaxasync.enjoy runs/dqn --env-id CartPole-v0     # on another env with the same spaces

The run's ``config.json`` (written by every ``jaxasync.experiment`` run) names the agent, its
resolved config and the evaluation env, so any agent the library ships is rebuilt as it was
trained, its checkpoint restored, and its evaluation policy (the agent's own: greedy for DQN
and the actor-critics, the mean action for SAC) run for ``--episodes`` episodes, one per
sub-env, reset with ``--seed``. Prints the mean, standard deviation, min and max return.
``--video`` records ``--video-episodes`` further episodes from a single env rendered as
``rgb_array`` (gymnasium ids): ``.gif`` needs Pillow (``pip install 'jaxasync[video]'``),
``.mp4`` imageio with ffmpeg (the same extra).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Annotated, Any

import jax
import tyro

import jaxasync as ja
from jaxasync import experiment
from jaxasync.video import record_episodes, write_video


@dataclasses.dataclass
class EnjoyArgs:
  """Evaluate (and record) a checkpoint of a saved run."""

  run_dir: Annotated[str, tyro.conf.Positional]
  """the run's --logdir (config.json and checkpoints), or a directory of runs (runs/dqn): its newest."""
  checkpoint: str = "best"
  """'best', 'final', a numbered checkpoint (its SGD step) or a checkpoint directory."""
  episodes: int = 10
  """evaluation episodes (run side by side, one per sub-env)."""
  seed: int = 0
  """seeds the evaluation env's resets (and the policy's sampling, if it samples)."""
  env_id: str | None = None
  """evaluate on this env id instead of the run's evaluation env (same spaces)."""
  video: str | None = None
  """record episodes to this .gif or .mp4 file."""
  video_episodes: int = 1
  """episodes the video holds."""
  fps: int = 30
  """frames per second of the video."""


def newest_run(run_dir: str | os.PathLike) -> Path:
  """``run_dir`` when it holds a run (its ``config.json``), else the run directly inside it
  whose ``config.json`` is newest (``runs/dqn`` -> the latest ``runs/dqn/<env>__seed..``);
  ``run_dir`` itself when it holds neither (``load_record`` then says what is missing)."""
  run_dir = Path(run_dir)
  if (run_dir / experiment.CONFIG_FILE).is_file() or not run_dir.is_dir():
    return run_dir
  runs = sorted(run_dir.glob(f"*/{experiment.CONFIG_FILE}"), key=lambda p: p.stat().st_mtime)
  return runs[-1].parent if runs else run_dir


def load_record(run_dir: str | os.PathLike) -> dict:
  """The run's ``config.json``; ``ConfigError`` when it is missing or does not say which agent
  trained."""
  path = Path(run_dir) / experiment.CONFIG_FILE
  if not path.is_file():
    raise ja.ConfigError(
        f"{run_dir} has no {experiment.CONFIG_FILE}: pass the --logdir of a run made by an "
        "experiment script (runs saved before config.json existed: restore them in Python, "
        "as the quickstart notebook does).")
  record = json.loads(path.read_text())
  if "agent" not in record:
    raise ja.ConfigError(f"{path} does not name the run's agent (written by an older "
                         "jaxasync); restore the checkpoint in Python instead.")
  return record


def checkpoint_dir(run_dir: str | os.PathLike, checkpoint: str) -> Path:
  """The directory ``--checkpoint`` names; ``ConfigError`` listing what there is otherwise."""
  run_dir = Path(run_dir)
  path = Path(checkpoint) if os.sep in checkpoint else run_dir / checkpoint
  if (path / "state.msgpack").is_file():
    return path
  have = sorted((p.name for p in run_dir.iterdir()
                 if p.is_dir() and (p / "state.msgpack").is_file()),
                key=lambda n: (n.isdigit(), int(n) if n.isdigit() else n))
  raise ja.ConfigError(f"no checkpoint {checkpoint!r} in {run_dir}; it has: "
                       f"{', '.join(have) or 'none'}. Pass --checkpoint with one of them.")


def eval_factory(record: dict, env_id: str | None) -> ja.VectorEnvFactory:
  """The run's evaluation env factory, or one for ``env_id`` when given."""
  if env_id is not None:
    if ja.minatar.is_minatar_id(env_id):
      return ja.MinAtarEnvFactory(env_id)
    ja.check_env_id(env_id)
    return ja.EnvFactory(env_id)
  if "eval_env" in record:
    return experiment.rebuilt(record["eval_env"])
  return ja.EnvFactory(record["settings"]["env_id"])


def restore_agent(record: dict, directory: Path,
                  env: ja.VectorEnvFactory) -> tuple[ja.Agent, Any, dict]:
  """The run's agent on ``env``'s spaces and the evaluation params of the checkpoint in
  ``directory``; returns ``(agent, params, meta)``."""
  agent_cls = experiment.imported(record["agent"]["class"])
  config = experiment.rebuilt(record["agent"]["config"])
  obs_space, action_space = ja.envs.spaces_of(env)
  agent = agent_cls(config, obs_space, action_space, record["settings"].get("env_id", "the env"))
  try:
    state, meta = ja.restore_checkpoint(directory, agent.init(jax.random.PRNGKey(0)))
  except (ValueError, OSError) as e:
    raise ja.ConfigError(f"{directory} cannot be restored into the run's agent ({e}); is it "
                         "a checkpoint of this run?") from None
  return agent, agent.evaluation_params(state), meta


def enjoy(args: EnjoyArgs) -> dict:
  """Evaluates (and records) the checkpoint ``args`` names; prints and returns the figures."""
  if args.episodes < 1 or args.video_episodes < 1 or args.fps < 1:
    raise ja.ConfigError("--episodes, --video-episodes and --fps must be >= 1.")
  run_dir = newest_run(args.run_dir)
  if run_dir != Path(args.run_dir):
    print(f"enjoy: the newest run in {args.run_dir}: {run_dir}", flush=True)
  record = load_record(run_dir)
  directory = checkpoint_dir(run_dir, args.checkpoint)
  factory = eval_factory(record, args.env_id)
  agent, params, meta = restore_agent(record, directory, factory)
  evaluator = ja.Evaluator(agent, factory, num_episodes=args.episodes, seed=args.seed)
  try:
    returns = evaluator.episode_returns(params)
  finally:
    evaluator.close()
  env_id = factory.env_id  # (--env-id when given: eval_factory built it)
  figures = {"checkpoint": str(directory), "opt_steps": meta.get("opt_steps"),
             "env_id": env_id, "episodes": args.episodes, "mean": float(returns.mean()),
             "std": float(returns.std()), "min": float(returns.min()),
             "max": float(returns.max())}
  print(f"{record['algorithm']} {directory} (SGD step {meta.get('opt_steps')}) on {env_id}: "
        f"return {figures['mean']:.1f} +- {figures['std']:.1f} over {args.episodes} episodes "
        f"(min {figures['min']:.1f}, max {figures['max']:.1f})")
  if args.video:
    if not isinstance(factory, ja.EnvFactory):
      raise ja.ConfigError(f"--video records gymnasium ids made by EnvFactory; {env_id} is "
                           f"made by {type(factory).__name__}.")
    frames, video_returns = record_episodes(agent, params, env_id, args.video_episodes,
                                            args.seed + 1_000)
    path = write_video(args.video, frames, args.fps)
    figures.update(video=str(path), video_returns=video_returns)
    print(f"video: {path} ({len(frames)} frames, returns {', '.join(f'{r:.1f}' for r in video_returns)})")
  return figures


def main(argv: list[str] | None = None) -> None:
  experiment.run_cli(lambda: enjoy(tyro.cli(EnjoyArgs, args=argv, description=__doc__)))


if __name__ == "__main__":
  main()
