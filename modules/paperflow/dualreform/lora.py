"""TRL training of the CQR model at every scale (issue 47: one implementation), and the paper-scale model's prompts.

`train_sft` (SFTTrainer, prompt-completion rows) and `train_dpo` (DPOTrainer, prompt/chosen/rejected rows) are the
only SFT and DPO of this paper: with `lora` settings they train LoRA adapters on the pretrained instruct LM of paper
scale (QLoRA when it was loaded in 4 bits: `pretrained.quantization`), with `lora=None` they fully fine-tune the tiny
word-level model of smoke and cpu (paperflow.dualreform.pipeline.fit_sft / fit_dpo; DPO against a frozen copy).

Prompts are plain strings: the conversation's questions and answers, then the text to rewrite (the current question,
or in the refine role the response, its question closing the history: the dual role of section 11), rendered with
the tokenizer's chat template when it has one. A completion is the rewrite followed by the tokenizer's EOS, as TRL's
SFTTrainer appends it; a candidate's score is its completion's summed log-prob divided by its token count (spec
section 7, inference (a)), tokenized as TRL tokenizes (prompt, then prompt + completion, the completion starting
where they diverge).

TODO(kit): train_sft, train_dpo, save_round, apply_round and completion_scores belong in paperflow.core.lm once a
second paper trains a pretrained model with TRL and LoRA (proposal in /work/notes/dualreform_paper_scale.md).

A round's weights are two LoRA adapters, SFT then DPO, each merged into the model before the next: saved as one
safetensors file (keys "sft." / "dpo." + PEFT's adapter keys, the LoRA settings in its metadata) and applied to
the pretrained model again by `apply_round`.

Long jobs resume (README, "Long jobs resume"): with `every_s` set, `train_sft` and `train_dpo` hand the trainer to
`paperflow.core.lm.resume.train`, which saves into `out_dir` (then the job's checkpoint folder) at least every
`every_s` seconds and resumes from the newest complete checkpoint there; None trains in one go, as before.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from paperflow.core.config import reject_unknown, require_keys
from paperflow.dualreform.settings import DPO_REQUIRED, LORA_KEYS, SFT_REQUIRED

INSTRUCTION = (
    "Rewrite the last utterance of this conversation into a self-contained search query that retrieves the "
    "passage answering it."
)
STAGES = ("sft", "dpo")


def _check(settings: Mapping[str, Any], keys, where: str) -> dict[str, Any]:
    require_keys(settings, keys, where)
    reject_unknown(settings, keys, where)
    return dict(settings)


def prompt_text(tokenizer, questions: Sequence[str], answers: Sequence[str], text: str) -> str:
    """The prompt for rewriting `text` after the conversation (questions[i], answers[i]); a question without its
    answer (the current one, in the refine role) is listed alone."""
    lines = [INSTRUCTION, "Conversation:"]
    for i, q in enumerate(questions):
        lines.append(f"Q: {q}")
        if i < len(answers):
            lines.append(f"A: {answers[i]}")
    lines.append(f"Utterance: {text}")
    content = "\n".join(lines)
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": content}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return text if text[-1:].isspace() else text + " "  # the completion is appended as a string
    return content + "\nRewrite: "


def rewrite_prompts(tokenizer, table: pd.DataFrame) -> list[str]:
    return [
        prompt_text(tokenizer, h, a, q)
        for h, a, q in zip(table["hist_queries"], table["hist_responses"], table["query"])
    ]


def refine_prompts(tokenizer, table: pd.DataFrame) -> list[str]:
    return [
        prompt_text(tokenizer, [*h, q], a, r)
        for h, a, q, r in zip(table["hist_queries"], table["hist_responses"], table["query"], table["response"])
    ]


def word_level(tokenizer) -> bool:
    """Whether `tokenizer` is a kit word-level tokenizer (words split on whitespace: EOS must stand apart)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return backend is not None and type(backend.model).__name__ == "WordLevel"


def completion(tokenizer, text: str) -> str:
    """The completion TRL trains on: the text and EOS (a separate word for a word-level tokenizer)."""
    return f"{text} {tokenizer.eos_token}" if word_level(tokenizer) else text + tokenizer.eos_token


def _pair_ids(tokenizer, prompt: str, done: str, max_prompt: int) -> tuple[list[int], int]:
    """Token ids of prompt + completion (the prompt cut to its last `max_prompt` tokens) and the completion's start."""
    p = tokenizer(prompt)["input_ids"]
    full = tokenizer(prompt + done)["input_ids"]
    start = next((i for i, (a, b) in enumerate(zip(p, full)) if a != b), min(len(p), len(full)))
    cut = max(0, start - max_prompt)
    return full[cut:], start - cut


@torch.no_grad()
def completion_scores(model, tokenizer, prompts, completions, batch_size: int, max_prompt: int) -> np.ndarray:
    """Length-normalised log-prob of each completion given its prompt (right-padded batches on the model's device)."""
    from paperflow.core.lm.sampling import sequence_logprobs

    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    out = []
    for s in range(0, len(prompts), batch_size):
        pairs = [
            _pair_ids(tokenizer, p, c, max_prompt)
            for p, c in zip(prompts[s : s + batch_size], completions[s : s + batch_size])
        ]
        width = max(len(ids) for ids, _ in pairs)
        ids = torch.full((len(pairs), width), pad, dtype=torch.long)
        mask = torch.zeros((len(pairs), width), dtype=torch.long)
        counted = torch.zeros((len(pairs), width))
        for i, (row, start) in enumerate(pairs):
            ids[i, : len(row)] = torch.tensor(row)
            mask[i, : len(row)] = 1
            counted[i, start : len(row)] = 1
        logp = sequence_logprobs(model, ids.to(device), mask.to(device)).float().cpu()
        out.append(((logp * counted).sum(-1) / counted.sum(-1).clamp(min=1)).numpy())
    return np.concatenate(out) if out else np.zeros(0)


def lora_config(lora: Mapping[str, Any]):
    from peft import LoraConfig

    lora = _check(lora, LORA_KEYS, "lora")
    return LoraConfig(
        r=int(lora["r"]),
        lora_alpha=int(lora["alpha"]),
        lora_dropout=float(lora["dropout"]),
        target_modules=list(lora["target_modules"]),
        task_type="CAUSAL_LM",
    )


def _args(settings: Mapping[str, Any], seed: int, out_dir: str | Path, device) -> dict[str, Any]:
    from paperflow.core.lm.trl_anchor import training_args

    return {**settings, **training_args(out_dir, use_cpu=torch.device(device).type == "cpu"), "seed": int(seed)}


def _adapter_state(peft_model) -> dict[str, torch.Tensor]:
    from peft import get_peft_model_state_dict

    return {k: v.detach().cpu().contiguous() for k, v in get_peft_model_state_dict(peft_model).items()}


def _fit(trainer, every_s: float | None) -> None:
    """`trainer.train()`, or with `every_s` a timed save into its output_dir and a resume from there."""
    if every_s is None:
        trainer.train()
        return
    from paperflow.core.lm import resume

    last = resume.last_checkpoint(trainer.args.output_dir)
    if last is not None and hasattr(trainer, "_total_train_tokens"):
        # TRL's logged num_tokens is a running count its checkpoints do not keep: go on from the last one logged
        state = json.loads((Path(last) / "trainer_state.json").read_text())
        logged = [r["num_tokens"] for r in state["log_history"] if "num_tokens" in r]
        if logged:
            trainer._total_train_tokens = logged[-1]
    resume.train(trainer, every_s)


def _trained(trainer, lora, own: set[str]):
    """(model, adapter) after training: with LoRA the merged model and its adapter state; without, the model itself
    (what accelerate's prepare left on the instance removed, so a deepcopy of it runs its own forward)."""
    if lora is not None:
        adapter = _adapter_state(trainer.model)
        return trainer.model.merge_and_unload(), adapter
    model = trainer.model
    for name in set(vars(model)) - own:
        delattr(model, name)
    model.eval()
    return model, None


def quantized(model) -> bool:
    """Whether `model` was loaded in 4 or 8 bits (bitsandbytes; paper scale's `pretrained.quantization`)."""
    return bool(getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False))


def _kbit_ready(model, lora):
    """QLoRA: a quantized model is made ready for adapter training (PEFT's prepare_model_for_kbit_training: the
    layer norms in float32, input gradients on), which TRL 1.16's trainers do not do themselves."""
    if lora is None or not quantized(model):
        return model
    from peft import prepare_model_for_kbit_training

    return prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)


def _quiet(trainer):
    from transformers import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # a printed dict per step; the history frame keeps them
    return trainer


def train_sft(model, tokenizer, prompts, targets, lora, settings, seed: int, out_dir, device, every_s=None):
    """TRL's SFTTrainer on (prompt, target) strings, the one SFT of every scale: with `lora` (LoRA settings) an
    adapter is trained and merged, with None the model is fully fine-tuned (the tiny model of smoke and cpu).
    Returns (model, adapter or None, history). `every_s`: checkpoint into `out_dir` that often and resume from it
    (None: no checkpoints)."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from paperflow.core.lm.trl_anchor import history_frame

    if not prompts:
        raise ValueError("train_sft: no training rows")
    args = _args(_check(settings, SFT_REQUIRED, "trl_sft"), seed, out_dir, device)
    rows = [{"prompt": p, "completion": completion(tokenizer, t)} for p, t in zip(prompts, targets, strict=True)]
    model = _kbit_ready(model, lora)
    own = set(vars(model))
    trainer = SFTTrainer(
        model=model,
        args=SFTConfig(**args),
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        peft_config=None if lora is None else lora_config(lora),
    )
    _fit(_quiet(trainer), every_s)
    history = history_frame(trainer.state.log_history)
    return (*_trained(trainer, lora, own), history)


def train_dpo(model, tokenizer, prompts, chosen, rejected, lora, settings, seed: int, out_dir, device, every_s=None):
    """TRL's DPOTrainer on (prompt, chosen, rejected) strings against `model` as it is now (the SFT model), the one
    DPO of every scale: with `lora` an adapter (the reference: the adapter switched off), with None full
    fine-tuning against a frozen copy. Returns (model, adapter or None, history). `every_s`: as train_sft's."""
    import copy

    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    from paperflow.core.lm.trl_anchor import history_frame

    if not prompts:
        raise ValueError("train_dpo: no preference pairs")
    args = _args(_check(settings, DPO_REQUIRED, "trl_dpo"), seed, out_dir, device)
    if isinstance(args["loss_type"], str):
        args["loss_type"] = [args["loss_type"]]
    rows = [
        {"prompt": p, "chosen": completion(tokenizer, c), "rejected": completion(tokenizer, r)}
        for p, c, r in zip(prompts, chosen, rejected, strict=True)
    ]
    model = _kbit_ready(model, lora)
    own = set(vars(model))
    trainer = DPOTrainer(
        model=model,
        ref_model=None if lora is not None else copy.deepcopy(model).eval(),
        args=DPOConfig(**args),
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        peft_config=None if lora is None else lora_config(lora),
    )
    _fit(_quiet(trainer), every_s)
    history = history_frame(trainer.state.log_history)
    return (*_trained(trainer, lora, own), history)


def save_round(adapters: Mapping[str, Mapping[str, torch.Tensor]], lora: Mapping[str, Any], path: str | Path) -> Path:
    """A round's adapters ({"sft": state, "dpo": state}, either may be absent) as one safetensors file."""
    from safetensors.torch import save_file

    unknown = sorted(set(adapters) - set(STAGES))
    if unknown:
        raise ValueError(f"adapters {unknown}: a round has only {STAGES}")
    tensors = {f"{stage}.{k}": v for stage, state in adapters.items() for k, v in state.items()}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    meta = {"lora": json.dumps(dict(lora)), "stages": json.dumps([s for s in STAGES if s in adapters])}
    save_file(tensors, str(path), metadata=meta)
    return Path(path)


def read_round(path: str | Path) -> tuple[dict[str, dict[str, torch.Tensor]], dict[str, Any]]:
    """A saved round's adapters ({stage: state}, in stage order) and its LoRA settings."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    adapters = {
        stage: {k[len(stage) + 1 :]: v for k, v in tensors.items() if k.startswith(f"{stage}.")}
        for stage in json.loads(meta["stages"])
    }
    return adapters, json.loads(meta["lora"])


def apply_round(model, path: str | Path):
    """`model` (the pretrained model) with a saved round's adapters merged in, SFT first."""
    from peft import get_peft_model, set_peft_model_state_dict

    adapters, lora = read_round(path)
    for state in adapters.values():
        peft_model = get_peft_model(model, lora_config(lora))
        result = set_peft_model_state_dict(peft_model, state)
        if result.unexpected_keys:
            raise ValueError(f"{path}: adapter keys the model has no place for: {result.unexpected_keys[:5]}")
        model = peft_model.merge_and_unload()
    return model
