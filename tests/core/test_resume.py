"""Long jobs resume (paperflow.core.resume, core.training, core.lm.resume): a job killed mid-run and rerun ends
with exactly what an uninterrupted run gives, for a Lightning fit, a TRL SFTTrainer run and a generation job; its
checkpoint folder is keyed by rule, outputs, params and inputs (a changed param starts afresh) and removed when
the job succeeds.

Each run is a child process (the kill is `os._exit` from inside training, as a time limit or preemption would end
it: no cleanup runs); the uninterrupted run is a child too, so both start from the same process state.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
import torch
from snakemake.iocontainers import Namedlist

from paperflow.core import resume
from paperflow.core.job import snakemake_job

ROOT = Path(__file__).resolve().parents[2]
KILLED = 3

PRELUDE = f"""
import json, os, sys
sys.path.insert(0, {str(ROOT / "modules")!r})
import torch
torch.set_num_threads(1)
folder, out, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
"""

LIGHTNING = """
import pytorch_lightning as pl
from torch.utils.data import DataLoader, TensorDataset
from paperflow.core.training import ResumeCheckpoint, epoch_history, fit, make_trainer, seed_everything

class Net(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1))
    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = ((self.net(x) - y) ** 2).mean()
        self.log("train/loss", loss, on_step=False, on_epoch=True)
        return loss
    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=1e-2)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)]

class Clock(pl.Callback):  # every batch takes one second of this clock; the run dies at batch `kill_at`
    t, batches = 0.0, 0
    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if Clock.batches == kill_at:
            os._exit(3)
        Clock.batches += 1
        Clock.t += 1.0

seed_everything(0)
g = torch.Generator().manual_seed(1)
x = torch.randn(64, 4, generator=g)
data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=16, shuffle=True)
saver = ResumeCheckpoint(folder, every_s=10.0, clock=lambda: Clock.t)  # 4 batches an epoch: saves after epoch 2 and 4
trainer = make_trainer(max_epochs=5, run_dir=out + ".run", name="fit", callbacks=[Clock(), saver])
fit(trainer, Net(), train_dataloaders=data)
torch.save(trainer.lightning_module.state_dict(), out)
epoch_history(trainer).to_csv(out + ".csv", index=False)
"""

TRL = """
from datasets import Dataset
from transformers import TrainerCallback
from trl import SFTConfig, SFTTrainer
from paperflow.core.lm.models import build_model
from paperflow.core.lm.resume import train
from paperflow.core.lm.tokenizer import word_level_tokenizer

words = [str(i) for i in range(8)] + ["+", "="]
tok = word_level_tokenizer(words)
spec = {"arch": "llama", "vocab_size": len(tok), "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 32}
model = build_model(spec, seed=0)
rows = [{"prompt": f"<bos> {a} + {b} =", "completion": f" {(a + b) % 8} <eos>"} for a in range(4) for b in range(4)]

class Kill(TrainerCallback):
    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == kill_at:
            os._exit(3)

args = SFTConfig(output_dir=folder, save_strategy="no", max_steps=6, per_device_train_batch_size=4,
                 learning_rate=1e-2, lr_scheduler_type="linear", bf16=False, use_cpu=True, report_to=[], seed=0,
                 logging_steps=1, disable_tqdm=True, dataloader_num_workers=0, gradient_checkpointing=False,
                 max_length=32)
trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok,
                     callbacks=[Kill()])
train(trainer, every_s=0)  # a checkpoint after every step
torch.save(trainer.model.state_dict(), out)
json.dump([{k: v for k, v in r.items() if k == "loss"} for r in trainer.state.log_history if "loss" in r],
          open(out + ".json", "w"))
"""

LOOP = """
from paperflow.core.loop import LoopCheckpoint, run_loop
from paperflow.core.seeding import seed_all

seed_all(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)

def step(i):
    x = torch.randn(8, 4)  # the global generator: a resumed run must draw what the uninterrupted one drew
    return ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()

def on_step(record):
    if record["step"] == kill_at:
        os._exit(3)

saver = LoopCheckpoint(folder, {"model": model, "optimizer": opt, "scheduler": sched}, every_s=0)
records = run_loop(step, opt, 12, scheduler=sched, on_step=on_step, checkpoint=saver)
torch.save(model.state_dict(), out)
json.dump(records, open(out + ".json", "w"))
"""

GENERATE = """
from paperflow.core.lm.models import build_model
from paperflow.core.lm.sampling import sample
from paperflow.core.resume import RowJournal

spec = {"arch": "llama", "vocab_size": 12, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 32}
model = build_model(spec, seed=0).eval()
prompts = [{"id": f"p{i}", "ids": [1, 2 + i % 7, 3 + i % 5]} for i in range(12)]
with RowJournal(os.path.join(folder, "rows.jsonl")) as journal:
    for n, prompt in enumerate(journal.todo(prompts)):
        if len(journal) == kill_at:
            os._exit(3)
        ids = torch.tensor([prompt["ids"]])
        gen = torch.Generator().manual_seed(int(prompt["id"][1:]))  # seeded by the prompt, not by its position
        with torch.no_grad():
            roll = sample(model, ids, torch.ones_like(ids), max_new_tokens=6, temperature=1.0, generator=gen,
                          eos_token_id=None, pad_token_id=0)
        journal.append({"id": prompt["id"], "tokens": roll.completion_ids[0].tolist(),
                        "logprobs": roll.logprobs[0].tolist()})
    rows = journal.complete([p["id"] for p in prompts])
with open(out, "w") as fh:
    fh.writelines(json.dumps(r, sort_keys=True) + "\\n" for r in rows)
"""


def _run(script: str, folder: Path, out: Path, kill_at: int = -1) -> int:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "disabled"}
    proc = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(script), str(folder), str(out), str(kill_at)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    if proc.returncode not in (0, KILLED):
        raise AssertionError(f"child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.returncode


def _killed_then_rerun(script: str, tmp_path: Path, kill_at: int) -> tuple[Path, Path, Path]:
    """(uninterrupted result, resumed result, checkpoint folder after the kill's rerun)."""
    clean, resumed = tmp_path / "clean.out", tmp_path / "resumed.out"
    assert _run(script, tmp_path / "ck_clean", clean) == 0
    folder = tmp_path / "ck"
    assert _run(script, folder, resumed, kill_at) == KILLED and not resumed.exists()
    assert _run(script, folder, resumed) == 0
    return clean, resumed, folder


def _same_weights(a: Path, b: Path) -> None:
    left, right = torch.load(a), torch.load(b)
    assert left.keys() == right.keys()
    for name in left:
        assert torch.equal(left[name], right[name]), name


@pytest.mark.slow  # three child processes, each importing torch and its engine
def test_lightning_fit_killed_mid_epoch_resumes_to_the_uninterrupted_weights(tmp_path):
    clean, resumed, folder = _killed_then_rerun(LIGHTNING, tmp_path, kill_at=10)  # in epoch 3 of 5
    _same_weights(clean, resumed)
    history = Path(str(resumed) + ".csv").read_text()
    assert history == Path(str(clean) + ".csv").read_text()  # the CSV log's first epochs came with the checkpoint
    assert len(history.splitlines()) == 6
    assert (folder / "last.ckpt").exists() and not (folder / "last.ckpt.tmp").exists()


def test_lightning_saves_at_epoch_ends_when_epochs_are_short_and_mid_epoch_when_long(tmp_path):
    import pytorch_lightning as pl

    from paperflow.core.training import ResumeCheckpoint

    t = [0.0]
    saves: list[tuple[str, float]] = []

    class Recording(ResumeCheckpoint):
        def _save(self, trainer):
            saves.append((self.where, t[0]))
            self.timer.saved()

        def on_train_batch_end(self, trainer, *args):
            self.where = "batch"
            super().on_train_batch_end(trainer, *args)

        def on_train_epoch_end(self, trainer, module):
            self.where = "epoch"
            super().on_train_epoch_end(trainer, module)

    trainer = pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False)
    cb = Recording(tmp_path, every_s=10.0, clock=lambda: t[0])
    cb.on_train_start(trainer, None)
    for _ in range(4):  # epochs of 4 s: a save at an epoch's end where the next epoch's end would pass 10 s
        cb.on_train_epoch_start(trainer, None)
        for _ in range(4):
            t[0] += 1.0
            cb.on_train_batch_end(trainer)
        cb.on_train_epoch_end(trainer, None)
    assert saves == [("epoch", 8.0), ("epoch", 16.0)]
    saves.clear()
    cb.on_train_epoch_start(trainer, None)
    for _ in range(25):  # one epoch of 25 s: mid-epoch saves every 10 s
        t[0] += 1.0
        cb.on_train_batch_end(trainer)
    assert saves == [("batch", 26.0), ("batch", 36.0)]


@pytest.mark.slow  # three child processes, each importing torch and its engine
def test_trl_sft_killed_mid_run_resumes_to_the_uninterrupted_weights(tmp_path):
    clean, resumed, folder = _killed_then_rerun(TRL, tmp_path, kill_at=3)
    _same_weights(clean, resumed)
    from paperflow.core.lm.resume import checkpoints

    assert [step for step, _ in checkpoints(folder)] == [6]  # older checkpoints removed once a newer is complete
    losses = json.loads(Path(str(resumed) + ".json").read_text())  # steps 1-3 from the checkpoint's state
    assert len(losses) == 6 and losses == json.loads(Path(str(clean) + ".json").read_text())


@pytest.mark.slow  # three child processes, each importing torch
def test_plain_loop_killed_mid_run_resumes_to_the_uninterrupted_weights(tmp_path):
    clean, resumed, folder = _killed_then_rerun(LOOP, tmp_path, kill_at=6)
    _same_weights(clean, resumed)
    records = json.loads(Path(str(resumed) + ".json").read_text())
    assert records == json.loads(Path(str(clean) + ".json").read_text()) and len(records) == 12
    assert (folder / "loop.pt").exists() and not (folder / "loop.tmp").exists()


def test_trl_resume_skips_an_incomplete_checkpoint(tmp_path):
    from paperflow.core.lm.resume import COMPLETE, last_checkpoint

    for step in (2, 4):
        (tmp_path / f"checkpoint-{step}").mkdir()
    assert last_checkpoint(tmp_path) is None
    (tmp_path / "checkpoint-2" / COMPLETE).write_text("")
    assert last_checkpoint(tmp_path) == str(tmp_path / "checkpoint-2")  # checkpoint-4: killed mid-save


@pytest.mark.slow  # three child processes, each importing torch and its engine
def test_generation_killed_after_some_rows_resumes_to_the_same_file(tmp_path):
    clean, resumed, folder = _killed_then_rerun(GENERATE, tmp_path, kill_at=5)
    assert resumed.read_bytes() == clean.read_bytes()
    assert len((folder / "rows.jsonl").read_text().splitlines()) == 12


def test_row_journal_drops_a_cut_off_last_line_and_refuses_an_incomplete_result(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"id": 1, "x": "a"}\n{"id": 2, "x": "b"}\n{"id": 3, "x"')
    with resume.RowJournal(path) as journal:
        assert len(journal) == 2 and 3 not in journal
        assert journal.todo([{"id": i} for i in (1, 2, 3, 4)]) == [{"id": 3}, {"id": 4}]
        with pytest.raises(ValueError, match="1 of 3 rows missing"):
            journal.complete([1, 2, 3])
        journal.append({"id": 3, "x": "c"})
        with pytest.raises(ValueError, match="already there"):
            journal.append({"id": 3, "x": "again"})
        assert [r["x"] for r in journal.complete([3, 1, 2])] == ["c", "a", "b"]
    assert [json.loads(line)["id"] for line in path.read_text().splitlines()] == [1, 2, 3]


def test_row_journal_keeps_rows_at_a_path_and_only_for_the_call_without_one(tmp_path, monkeypatch):
    path = tmp_path / "ckpt" / "rows.jsonl"
    with resume.row_journal(path) as journal:
        journal.append({"id": "a", "x": 1})
    with resume.row_journal(path) as journal:  # a rerun finds the row and skips it
        assert "a" in journal and journal.todo([{"id": "a"}, {"id": "b"}]) == [{"id": "b"}]
    monkeypatch.setenv("TMPDIR", str(tmp_path / "scratch"))
    (tmp_path / "scratch").mkdir()
    tempfile.tempdir = None  # re-read TMPDIR
    try:
        with resume.row_journal(None, key="qid") as journal:
            journal.append({"qid": 7})
            scratch_file = journal.path
            assert scratch_file.is_file() and scratch_file.is_relative_to(tmp_path / "scratch")
        assert not scratch_file.parent.exists()  # nothing left behind, nothing to resume from
    finally:
        tempfile.tempdir = None


def _smk(tmp_path: Path, lr: float, fail: bool = False):
    code = {
        "hash": "abc",
        "script": "workflows/x/scripts/train.py",
        "scale": "tiny",
        "generated_roots": [str(tmp_path / "results"), str(tmp_path / "resources")],
    }
    data = tmp_path / "data.txt"
    (tmp_path / "results").mkdir(exist_ok=True)
    if not data.exists():
        data.write_text("rows")
    return type(
        "Smk",
        (),
        {
            "rule": "x_train",
            "input": Namedlist([str(data)]),
            "output": Namedlist([str(tmp_path / "results" / "model.pt")]),
            "params": Namedlist(fromdict={"lr": lr, "code": code}),
            "wildcards": Namedlist(fromdict={"seed": "0"}),
            "threads": 1,
            "log": Namedlist([str(tmp_path / "train.log")]),
        },
    )()


def test_checkpoint_folder_is_keyed_by_params_and_inputs_and_removed_on_success(tmp_path):
    before = torch.get_num_threads()
    try:
        with pytest.raises(RuntimeError, match="killed"), snakemake_job(_smk(tmp_path, lr=0.1)) as job:
            first = job.checkpoint_dir()
            (first / "last.ckpt").write_text("state")
            raise RuntimeError("killed")
        assert first.parent == tmp_path / "resources" / "checkpoints" / "x_train"
        owner = json.loads((first / "owner.json").read_text())
        assert owner["params"]["lr"] == 0.1 and owner["outputs"] == [str(tmp_path / "results" / "model.pt")]
        assert (first / "last.ckpt").exists()  # a failed job keeps its checkpoint for the rerun

        with snakemake_job(_smk(tmp_path, lr=0.2)) as job:  # a changed param: another folder, nothing to resume
            other = job.checkpoint_dir()
            assert other != first and not (other / "last.ckpt").exists()
            Path(job.output[0]).write_text("model")
        assert not other.exists() and first.exists()

        stat = (tmp_path / "data.txt").stat()
        os.utime(tmp_path / "data.txt", ns=(1, 1))  # an input rewritten upstream: another folder too
        with snakemake_job(_smk(tmp_path, lr=0.1)) as job:
            assert job.checkpoint_dir() != first
            Path(job.output[0]).write_text("model")
        os.utime(tmp_path / "data.txt", ns=(stat.st_atime_ns, stat.st_mtime_ns))

        with snakemake_job(_smk(tmp_path, lr=0.1)) as job:  # the rerun of the killed job finds its checkpoint
            assert job.checkpoint_dir() == first and (first / "last.ckpt").read_text() == "state"
            Path(job.output[0]).write_text("model")
        assert not first.exists() and not first.parent.exists()  # removed with the job's success
    finally:
        torch.set_num_threads(before)


def test_ranks_agree_is_the_flag_itself_in_one_process():
    from paperflow.core.ranks import agree

    assert agree(True) is True and agree(False) is False


def test_timer_is_due_after_its_interval():
    t = [0.0]
    timer = resume.Timer(30.0, clock=lambda: t[0])
    t[0] = 20.0
    assert not timer.due() and timer.due(ahead_s=10.0)
    t[0] = 30.0
    assert timer.due()
    timer.saved()
    assert not timer.due()
    with pytest.raises(ValueError):
        resume.Timer(-1)


def test_array_checkpoint_round_trips_arrays_and_a_generator_without_pickle(tmp_path):
    """ArrayCheckpoint (numpy loops whose env has no torch): nothing saved gives step 0; a save gives back the next
    step, the arrays bit for bit and the JSON metadata (a PCG64 state's 128-bit integers included), and a generator
    set from it draws what the saved one would have; the file loads with allow_pickle=False; '__meta__' is refused."""
    import numpy as np

    from paperflow.core.array_checkpoint import ArrayCheckpoint

    checkpoint = ArrayCheckpoint(tmp_path / "seed0", every_s=0.0)
    assert checkpoint.restore() == (0, {}, {}) and checkpoint.due()
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 3))
    checkpoint.save(7, {"x": x, "it0": x[:1]}, {"rng": rng.bit_generator.state, "note": "seven"})
    ahead = rng.standard_normal(3)
    step, arrays, meta = ArrayCheckpoint(tmp_path / "seed0").restore()
    assert step == 7 and meta["note"] == "seven" and sorted(arrays) == ["it0", "x"]
    np.testing.assert_array_equal(arrays["x"], x)
    other = np.random.default_rng(0)
    other.bit_generator.state = meta["rng"]
    np.testing.assert_array_equal(other.standard_normal(3), ahead)
    np.load(tmp_path / "seed0" / "state.npz", allow_pickle=False).close()
    with pytest.raises(ValueError, match="reserved"):
        checkpoint.save(8, {"__meta__": x}, {})
