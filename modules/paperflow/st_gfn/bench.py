"""Time the training library call of every (env, method) run of a scale, one seed each, on one thread:

    python -m paperflow.st_gfn.bench smoke [--seed 0]

prints CPU and wall seconds per run and their total, and each run's final loss (equal losses before and
after a speed change show that the change kept the numbers). The README's runtime figures come from it."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from paperflow.core.config import load_paper_config
from paperflow.st_gfn.envs import make_env
from paperflow.st_gfn.games import GAME_KINDS
from paperflow.st_gfn.training import train_one

ROOT = Path(__file__).resolve().parents[3]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scale", choices=["tiny", "smoke"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # as the pipeline's jobs (threads: 1)
    cfg = load_paper_config("st_gfn", args.scale, ROOT)
    total = 0.0
    for env_name in cfg["run_envs"]:
        spec = cfg["envs"][env_name]
        game = spec["kind"] in GAME_KINDS
        if game:  # self-play against the reference positions preprocess would write (not timed)
            from paperflow.st_gfn.game_training import train_game
            from paperflow.st_gfn.games import reference_positions

            positions, _ = reference_positions(spec)
        else:
            env = make_env(spec)
        for method in cfg["env_methods"][env_name]:
            cpu, wall = time.process_time(), time.perf_counter()
            if game:
                _, history, _ = train_game(
                    spec, positions, cfg["methods"][method], cfg["model"], cfg["train"], args.seed, progress=False
                )
            else:
                _, history, _ = train_one(
                    env, spec, cfg["methods"][method], cfg["model"], cfg["train"], args.seed, progress=False
                )
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            total += cpu
            print(
                f"{env_name:8s} {method:12s} cpu {cpu:6.2f} s  wall {wall:6.2f} s  final loss {history.loss.iloc[-1]:.6f}",
                flush=True,
            )
    print(
        f"total cpu {total:.1f} s ({cfg['train']['iterations']} iterations of {cfg['train']['batch_size']} per run, games their own "
        f"budget, seed {args.seed})"
    )


if __name__ == "__main__":
    main()
