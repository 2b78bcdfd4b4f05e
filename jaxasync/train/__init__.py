"""Every algorithm's experiment, runnable from an installed package:

  python -m jaxasync.train dqn [flags]        # DQN (Munchausen double Q, LayerNorm), CartPole-v1
  python -m jaxasync.train rainbow [flags]    # Rainbow: --preset cartpole | minatar | atari
  python -m jaxasync.train sac [flags]        # SAC, Pendulum-v1
  python -m jaxasync.train td3 [flags]        # TD3, Pendulum-v1; --preset mujoco
  python -m jaxasync.train impala [flags]     # IMPALA (V-trace), CartPole-v1
  python -m jaxasync.train ppo [flags]        # PPO, CartPole-v1
  python -m jaxasync.train pqn [flags]        # PQN (Q(lambda), no replay, no target net), CartPole-v1
  python -m jaxasync.train ALGO --help        # every flag of one
  jaxasync-train ALGO [flags]                 # the same, as an installed command

Each module holds one algorithm's tuned defaults (its presets, with the reasons and the
measurements that chose them) and its flags: an ``Args`` dataclass over
``jaxasync.experiment.RunArgs`` nesting the library's configs, and ``main(args)``, one call to
``jaxasync.experiment.run``. The repository's ``experiments/<algo>.py`` scripts run the same.
"""

ALGORITHMS = ("dqn", "rainbow", "sac", "td3", "impala", "ppo", "pqn")
