"""How the sync loop's lock-step actor gets the learner's params, three ways, side by side.

  python scripts/bench_sync_params.py                       # all three, one after another
  python scripts/bench_sync_params.py --variants copy as-published --json /tmp/sync.json

Each variant runs ``bench_throughput.measure_sync`` (DQN CartPole, the harness's sync
settings) and times, per vector step, the copy ``adopt_latest`` makes of a new publication (none
for ``as-published``), ``choose`` (adopting, then acting) and ``take`` (the env step and the
collector):

- ``copy``: a CPU copy of every publication (``to_cpu``; the lock-step actor before
  2026-11-28, and every actor on a learner split over several devices);
- ``device-get``: ``jax.device_get`` of the publication, then ``device_put`` to the CPU;
- ``as-published``: the publication where it lives (what the lock-step actor does now).

On a CPU learner ``copy`` and ``as-published`` take the same params (already on the CPU);
the comparison is for a GPU learner (docs/accelerator.md has the H200's figures).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Literal

import jax
import tyro

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_throughput  # noqa: E402  (the harness: its sync measurement and settings)

from jaxasync import actor as actor_module  # noqa: E402
from jaxasync.param_store import to_cpu  # noqa: E402

Variant = Literal["copy", "device-get", "as-published"]


@dataclasses.dataclass
class Args:
  variants: tuple[Variant, ...] = ("copy", "device-get", "as-published")
  duration: float = 6.0
  """measured seconds per variant (after --warmup)."""
  warmup: float = 2.0
  json: str | None = None
  """write every figure here."""


class Timed:
  """Patches ``jaxasync.actor`` for one variant and times the actor's three calls."""

  def __init__(self, variant: Variant):
    self.variant = variant
    self.seconds = {"adopt": 0.0, "choose": 0.0, "take": 0.0}
    self.steps = 0

  def __enter__(self) -> "Timed":
    self.saved = (actor_module.to_cpu, actor_module.on_one_device,
                  actor_module.Actor.choose, actor_module.Actor.take)
    cpu = jax.devices("cpu")[0]

    def adopt_copy(params, published=False):
      t0 = time.perf_counter()
      if self.variant == "device-get" and published:
        params = jax.device_put(jax.device_get(params), cpu)
      else:
        params = to_cpu(params, published)
      jax.block_until_ready(params)
      self.seconds["adopt"] += time.perf_counter() - t0
      return params

    on_one_device = self.saved[1]
    choose, take = self.saved[2], self.saved[3]

    def timed_choose(actor, stop=None):
      t0 = time.perf_counter()
      out = choose(actor, stop)
      self.seconds["choose"] += time.perf_counter() - t0
      return out

    def timed_take(actor, choice):
      t0 = time.perf_counter()
      out = take(actor, choice)
      self.seconds["take"] += time.perf_counter() - t0
      self.steps += 1
      return out

    actor_module.to_cpu = adopt_copy
    # (the copy variants take the copy path; 'as-published' keeps the library's own test)
    actor_module.on_one_device = (on_one_device if self.variant == "as-published"
                                  else lambda tree: False)
    actor_module.Actor.choose, actor_module.Actor.take = timed_choose, timed_take
    return self

  def __exit__(self, *exc) -> None:
    (actor_module.to_cpu, actor_module.on_one_device,
     actor_module.Actor.choose, actor_module.Actor.take) = self.saved

  def per_vector_step_us(self) -> dict[str, float]:
    return {k: 1e6 * v / max(1, self.steps) for k, v in self.seconds.items()}


def main(args: Args) -> dict:
  harness = bench_throughput.Args(variants=("sync",), duration=args.duration,
                                  warmup=args.warmup, repeats=1, solve_seeds=0)
  _, agent_factory, _, env = bench_throughput.build_agent(harness)
  print(f"sync loop params, DQN CartPole: jax {jax.default_backend()} {jax.devices()}",
        flush=True)
  results = {}
  for variant in args.variants:
    with Timed(variant) as timed:
      fig = bench_throughput.measure_sync(harness, agent_factory, env)
    results[variant] = {"env_steps_per_sec": fig["env_steps_per_sec"],
                        "stage_fractions": fig.get("stage_fractions"),
                        "us_per_vector_step": timed.per_vector_step_us()}
    us = results[variant]["us_per_vector_step"]
    print(f"  {variant:13s} {fig['env_steps_per_sec']:8,.0f} env steps/s | per vector step: "
          f"adopt {us['adopt']:,.0f} us, choose {us['choose']:,.0f} us, take "
          f"{us['take']:,.0f} us", flush=True)
  if args.json:
    Path(args.json).write_text(json.dumps({"machine": bench_throughput.machine_info(),
                                           "results": results}, indent=1))
  return results


if __name__ == "__main__":
  main(tyro.cli(Args))
