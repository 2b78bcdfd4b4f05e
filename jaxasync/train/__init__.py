"""Every algorithm's experiment, runnable from an installed package:

  python -m jaxasync.train dqn [flags]        # DQN (Munchausen double Q, LayerNorm), CartPole-v1
  python -m jaxasync.train rainbow [flags]    # Rainbow: --preset cartpole | minatar | atari
  python -m jaxasync.train sac [flags]        # SAC, Pendulum-v1
  python -m jaxasync.train td3 [flags]        # TD3, Pendulum-v1; --preset mujoco
  python -m jaxasync.train impala [flags]     # IMPALA (V-trace), CartPole-v1; --preset minatar
  python -m jaxasync.train ppo [flags]        # PPO, CartPole-v1
  python -m jaxasync.train pqn [flags]        # PQN (Q(lambda), no replay, no target net), CartPole-v1
  python -m jaxasync.train ALGO --help        # every flag of one
  jaxasync-train ALGO [flags]                 # the same, as an installed command

Each module holds one algorithm's tuned defaults (its presets, with the reasons and the
measurements that chose them) and its flags: an ``Args`` dataclass over
``jaxasync.experiment.RunArgs`` nesting the library's configs, ``main(args)``, one call to
``jaxasync.experiment.run``, and ``cli(argv)`` (``TrainModule``). Every module of this package
is an algorithm, runnable by its name as soon as it exists. The repository's
``experiments/<algo>.py`` scripts run the same.
"""

from __future__ import annotations

import pkgutil
from typing import Any, Protocol, runtime_checkable

ALGORITHMS = tuple(sorted(m.name for m in pkgutil.iter_modules(__path__)
                          if not m.name.startswith("_")))
"""``python -m jaxasync.train ALGO [flags]``: runs ``jaxasync.train.<ALGO>``, one per module of
this package (``__main__`` and any other underscored module excepted)."""


@runtime_checkable
class TrainModule(Protocol):
  """What each ``jaxasync.train.<ALGO>`` module is (a module satisfies it structurally)."""

  Args: type  # its flags: a dataclass over jaxasync.experiment.RunArgs

  def main(self, args: Any) -> dict:
    """Runs one ``Args``; returns the run's summary."""

  def cli(self, argv: list[str] | None = None) -> None:
    """Parses ``argv`` (default: the command line) and runs, one ``error:`` line on failure."""
