"""One paper-scale draft training run (vanilla, EAGLE-3, the EAGLE-3 control or ConFu) on a pretrained target,
started by `python -m paperflow.confu.paper_train spec.json`: one process, or one per GPU of the node under torchrun
(`launch`). Every process holds the frozen target and the head, draws its own batches of the regenerated data, and
the gradients are averaged across processes (all-reduce) before each AdamW step, so the head stays identical on
every rank; rank 0 writes the head and the history. The loop is `training.train_draft`, the one every scale trains
with (the smoke's rank-0 batches, `training.ttt_loss`: EAGLE-3's training-time test, ConFu's contemplate pass and
anchors); this module adds the process setup, the pretrained target, the sharded data and the per-rank checkpoints.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from paperflow.core.loop import LoopCheckpoint
from paperflow.core.ranks import agree
from paperflow.core.resume import EVERY_S

log = logging.getLogger(__name__)


def train_spec(
    method: str,
    name: str,
    target: Mapping[str, Any],
    cfg: Mapping[str, Any],
    model_json: str,
    data: Sequence[str],
    init: str | None,
    out: str,
    history: str,
    seed: int,
    checkpoints: str | None = None,
) -> dict[str, Any]:
    """Everything `run` needs, JSON-serialisable (it crosses the torchrun boundary as a file). `checkpoints`: the
    job's checkpoint folder (job.checkpoint_dir()), where each rank saves its loop state and resumes from."""
    return {
        "method": method,
        "target_name": name,
        "target": dict(target),
        "model_json": model_json,
        "data": list(data),
        "init": init,
        "out": out,
        "history": history,
        "seed": int(seed),
        "checkpoints": checkpoints,
        "draft": dict(cfg["draft"]),
        "confu": dict(cfg["confu"]),
        "max_length": int(cfg["regenerate"]["max_length"]),
    }


def launch(spec: Mapping[str, Any], spec_path: str, processes: int, python: str = sys.executable) -> list[str]:
    """Write `spec` and run `run` on `processes` processes of this node (torchrun for more than one)."""
    from paperflow.core.launch import launch_command

    Path(spec_path).parent.mkdir(parents=True, exist_ok=True)
    Path(spec_path).write_text(json.dumps(spec, indent=1) + "\n")
    command = [*shlex.split(launch_command(max(1, int(processes)), python)), "-m", __name__, spec_path]
    modules = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [modules, os.environ.get("PYTHONPATH")]))}
    log.info("launching %s", shlex.join(command))
    subprocess.run(command, check=True, env=env)
    return command


def load_data(paths: Sequence[str]) -> list[tuple[torch.Tensor, int]]:
    """The regenerated sequences of every shard: (ids, prompt length) per sequence."""
    from safetensors.torch import load_file

    out = []
    for path in paths:
        d = load_file(path)
        off = d["offsets"].tolist()
        out += [(d["ids"][a:b], int(p)) for a, b, p in zip(off[:-1], off[1:], d["prompt_lengths"].tolist())]
    if not out:
        raise ValueError(f"no regenerated sequences in {list(paths)}")
    return out


def _dist():
    """(rank, world size); initialises torch.distributed under torchrun (nccl on GPUs, gloo on CPUs)."""
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return int(os.environ.get("RANK", "0")), world


class RankCheckpoint(LoopCheckpoint):
    """LoopCheckpoint for a torchrun job: each rank keeps its own state (the same head and optimizer, its own batch
    generator) in `<folder>/rank<r>/`, and every rank saves at the step rank 0's clock picks (`ranks.agree`), so the
    ranks resume at one step. Ranks whose saved steps differ (a kill between two ranks' saves) start afresh."""

    def __init__(self, folder: str | Path, rank: int, world: int, objects: Mapping[str, Any], **kwargs: Any) -> None:
        super().__init__(Path(folder) / f"rank{rank}", objects, **kwargs)
        self.world = world

    def restore(self) -> tuple[int, list[dict[str, float]]]:
        import torch.distributed as dist

        saved = -1
        if self.path.exists():
            saved = int(torch.load(self.path, map_location="cpu", weights_only=True)["next_step"])
        if self.world > 1:
            steps = [None] * self.world
            dist.all_gather_object(steps, saved)
            if len(set(steps)) > 1:
                log.warning("the ranks' checkpoints are at steps %s: starting afresh", steps)
                self.path.unlink(missing_ok=True)
        return super().restore()

    def step_done(self, step: int, records: list[dict[str, float]]) -> None:
        if agree(self.timer.due()):
            self.save(step + 1, records)


def run(spec: Mapping[str, Any], every_s: float = EVERY_S) -> list[dict[str, float]]:
    """Train `spec.method`'s head; returns the history rows (rank 0 also writes the head and the history). With
    `spec["checkpoints"]` the loop saves there every `every_s` seconds and resumes from it (RankCheckpoint)."""
    from paperflow.confu import paper
    from paperflow.confu.model import save_head
    from paperflow.confu.training import train_draft
    from paperflow.core.device import pick

    rank, world = _dist()
    name, target = spec["target_name"], spec["target"]
    device = pick(target["device"], key=f"targets.{name}.device")
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    folder = paper.model_folder(spec["model_json"])
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=getattr(torch, target["dtype"]))
    model = model.to(device).eval()
    paper.check_target_shape(name, target, model.config)
    pad = int(paper.load_tokenizer(folder).pad_token_id)
    cfg = paper.head_config(name, target, spec, model.config)
    seed = int(spec["seed"])

    def checkpoint(objects: Mapping[str, Any]) -> RankCheckpoint:  # the loop's head, optimizer and batch generator
        return RankCheckpoint(spec["checkpoints"], rank, world, objects, every_s=every_s)

    head, rows = train_draft(
        spec["method"],
        model,
        load_data(spec["data"]),
        cfg,
        seed,
        init=spec["init"],
        pad=pad,
        max_length=int(spec["max_length"]),
        device=device,
        dtype=target["dtype"],
        rank=rank,
        world=world,
        checkpoint=checkpoint if "checkpoints" in spec and spec["checkpoints"] else None,
    )
    if rank == 0:
        save_head(head.cpu(), spec["out"], {"seed": seed, "method": spec["method"], "target": name})
        Path(spec["history"]).parent.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(rows).assign(method=spec["method"], target=name, seed=seed).to_csv(spec["history"], index=False)
    if world > 1:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
    return rows


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    run(json.loads(Path(sys.argv[1]).read_text()))
