"""IMPALA (V-trace), synchronous or asynchronous, on any gymnasium env with Box observations
and Discrete actions (a categorical policy) or a bounded one-axis Box of actions (a diagonal
Gaussian, its samples clipped to the Box; the cartpole preset is tuned for CartPole: pass
--env-id).

  python experiments/impala.py                        # CartPole-v1, one actor process
  python experiments/impala.py --mode sync --seed 3   # lock-step: every unroll from the newest params
  python experiments/impala.py --num-actors 2 --agent.max-policy-lag 8
  python experiments/impala.py --preset minatar --env-id MinAtar/Freeway-v1  # the MinAtar games
  python experiments/impala.py --help                 # every flag

The tuned defaults, the reasons for them and the flags are in jaxasync/train/impala.py, which
``python -m jaxasync.train impala`` runs too (for an installed package).
"""

if __name__ == "__main__":  # JAX imports for seconds: a Ctrl-C then ends in one line
  import _quiet_start
  _quiet_start.while_importing()
from jaxasync.train.impala import *  # noqa: F401,F403  (Args, main and the presets, for importers)
from jaxasync.train.impala import cli

if __name__ == "__main__":
  _quiet_start.imported()  # (run_cli takes Ctrl-C from here)
  cli()
