"""SAC, synchronous or asynchronous, on any gymnasium env with Box observations and a bounded
one-axis Box of actions.

  python experiments/sac.py                          # Pendulum-v1, the default arrangement
  python experiments/sac.py --mode sync --seed 3
  python experiments/sac.py --env-id MountainCarContinuous-v0 --max-env-steps 50000
  python experiments/sac.py --preset mujoco --env-id Hopper-v5   # Tianshou's MuJoCo settings
  python experiments/sac.py --help                   # every flag

The tuned defaults, the reasons for them and the flags are in jaxasync/train/sac.py, which
``python -m jaxasync.train sac`` runs too (for an installed package).
"""

if __name__ == "__main__":  # JAX imports for seconds: a Ctrl-C then ends in one line
  import _quiet_start
  _quiet_start.while_importing()
from jaxasync.train.sac import *  # noqa: F401,F403  (Args, main and the presets, for importers)
from jaxasync.train.sac import cli

if __name__ == "__main__":
  _quiet_start.imported()  # (run_cli takes Ctrl-C from here)
  cli()
