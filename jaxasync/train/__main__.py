"""``python -m jaxasync.train ALGO [flags]``: runs ``jaxasync.train.<ALGO>`` (see the package
docstring)."""

from __future__ import annotations

import importlib
import sys

from jaxasync.train import ALGORITHMS, __doc__ as USAGE


def main(argv: list[str]) -> None:
  if not argv or argv[0] in ("-h", "--help"):
    print(f"{USAGE.rstrip()}\n\nALGO is one of: {', '.join(ALGORITHMS)}.")
    sys.exit(0 if argv else 2)
  algo, rest = argv[0], argv[1:]
  if algo not in ALGORITHMS:
    print(f"error: unknown algorithm {algo!r}; pick one of {', '.join(ALGORITHMS)} "
          "(python -m jaxasync.train ALGO --help).", file=sys.stderr)
    sys.exit(2)
  sys.argv = [f"python -m jaxasync.train {algo}", *rest]  # (what --help and errors print)
  try:
    module = importlib.import_module(f"jaxasync.train.{algo}")
  except KeyboardInterrupt:  # (its cli's run_cli takes Ctrl-C from there on)
    print("interrupted before training started", file=sys.stderr)
    sys.exit(130)
  module.cli(rest)


def entry() -> None:
  """The ``jaxasync-train`` console script: ``jaxasync-train ALGO [flags]``."""
  main(sys.argv[1:])


if __name__ == "__main__":
  entry()
