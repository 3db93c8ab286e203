"""One paper-scale draft training run (vanilla, EAGLE-3, the EAGLE-3 control or ConFu) on a pretrained target,
started by `python -m paperflow.confu.paper_train spec.json`: one process, or one per GPU of the node under torchrun
(`launch`). Every process holds the frozen target and the head, draws its own batches of the regenerated data, and
the gradients are averaged across processes (all-reduce) before each AdamW step, so the head stays identical on
every rank; rank 0 writes the head and the history. The loss is the package's (`training.ttt_loss`: EAGLE-3's
training-time test, ConFu's contemplate pass and anchors), the same code the smoke trains with.
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

from paperflow.core.loop import LoopCheckpoint, run_loop
from paperflow.core.ranks import agree
from paperflow.core.resume import EVERY_S

log = logging.getLogger(__name__)


def train_spec(method: str, name: str, target: Mapping[str, Any], cfg: Mapping[str, Any], model_json: str,
               data: Sequence[str], init: str | None, out: str, history: str, seed: int,
               checkpoints: str | None = None) -> dict[str, Any]:  # fmt: skip
    """Everything `run` needs, JSON-serialisable (it crosses the torchrun boundary as a file). `checkpoints`: the
    job's checkpoint folder (job.checkpoint_dir()), where each rank saves its loop state and resumes from."""
    return {
        "method": method, "target_name": name, "target": dict(target), "model_json": model_json,
        "data": list(data), "init": init, "out": out, "history": history, "seed": int(seed), "checkpoints": checkpoints,
        "draft": dict(cfg["draft"]), "confu": dict(cfg["confu"]), "max_length": int(cfg["regenerate"]["max_length"]),
    }  # fmt: skip


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


def batch(data: Sequence[tuple[torch.Tensor, int]], idx: Sequence[int], pad: int, max_length: int):
    """Left-padded ids, mask and response mask of the sequences `idx` (each cut to `max_length`)."""
    from paperflow.confu.training import response_mask

    seqs = [data[i][0][:max_length] for i in idx]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, s in enumerate(seqs):
        ids[r, width - len(s) :] = s
        mask[r, width - len(s) :] = 1
    plen = torch.tensor([min(data[i][1], max_length) for i in idx])
    return ids, mask, response_mask(mask, plen)


def _dist():
    """(rank, world size); initialises torch.distributed under torchrun (nccl on GPUs, gloo on CPUs)."""
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return int(os.environ.get("RANK", "0")), world


class Seeded:
    """A torch.Generator as an object with state_dict/load_state_dict, for LoopCheckpoint."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"state": self.generator.get_state()}

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        self.generator.set_state(state["state"])


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
    import torch.distributed as dist

    from paperflow.confu import paper
    from paperflow.confu.model import DraftHead, load_head, save_head
    from paperflow.confu.settings import method_of
    from paperflow.confu.stages import _one_expert, draft_config
    from paperflow.confu.training import sample_anchors, ttt_loss
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
    for p in model.parameters():
        p.requires_grad_(False)
    paper.check_target_shape(name, target, model.config)
    pad = int(paper.load_tokenizer(folder).pad_token_id)
    cfg = paper.head_config(name, target, spec, model.config)
    m = method_of(spec["method"], cfg)
    seed, d = int(spec["seed"]), cfg["draft"]
    if m.start == "eagle3":
        if not spec["init"]:
            raise ValueError(f"{spec['method']} starts from the EAGLE-3 head; none given")
        head = load_head(spec["init"], kind=m.kind)
    else:
        embedding = model.get_input_embeddings().weight.float()
        head = DraftHead(draft_config(m.kind, cfg, model.config.vocab_size), embedding, seed=seed)
    if m.kind == "confu" and m.n_expert is not None:
        head = _one_expert(head)
    head = head.to(device).train()
    params = head.trainable()
    opt = torch.optim.AdamW(params, lr=float(m.lr), weight_decay=0.0)
    data = load_data(spec["data"])
    g = torch.Generator().manual_seed(seed * 1009 + rank)
    layers = tuple(int(i) for i in target["feature_layers"])

    def step(i: int):
        idx = torch.randint(0, len(data), (int(d["batch_size"]),), generator=g).tolist()
        ids, mask, resp = batch(data, idx, pad, int(spec["max_length"]))
        anchors = None
        if m.kind == "confu":
            valid = torch.zeros(ids.shape[0], ids.shape[1] - 1, dtype=torch.bool)
            valid[:, : ids.shape[1] - 2] = resp[:, 2:].bool()
            anchors = sample_anchors(valid, int(m.anchors), g).to(device)
        with torch.device(device), paper.autocast(device, target["dtype"]):
            loss, logs = ttt_loss(head, model, ids.to(device), mask.to(device), resp.to(device),
                                  steps=int(d["ttt_steps"]), decay=float(d["ttt_decay"]), layers=layers,
                                  anchors=anchors, window=int(m.window))  # fmt: skip
        opt.zero_grad(set_to_none=False)
        loss.backward()
        if world > 1:
            for p in params:
                if p.grad is None:  # a part this kind leaves unused (vanilla's feature projection)
                    p.grad = torch.zeros_like(p)
                dist.all_reduce(p.grad)
                p.grad /= world
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return loss.detach(), logs

    checkpoint = None
    if spec.get("checkpoints"):
        checkpoint = RankCheckpoint(
            spec["checkpoints"], rank, world, {"head": head, "optimizer": opt, "batches": Seeded(g)}, every_s=every_s
        )
    rows = run_loop(step, None, int(m.steps), desc=spec["method"], checkpoint=checkpoint)
    if rank == 0:
        save_head(head.cpu(), spec["out"], {"seed": seed, "method": spec["method"], "target": name})
        Path(spec["history"]).parent.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(rows).assign(method=spec["method"], target=name, seed=seed).to_csv(spec["history"], index=False)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return rows


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    run(json.loads(Path(sys.argv[1]).read_text()))
