"""PromptScale's SFT arm at paper scale (spec 2.5): Qwen2.5-7B-Instruct fine-tuned with TRL's SFTTrainer on the
released PromptCoT 2.0 SFT set (xl-zhao/PromptCoT-2.0-SFT-4.8M: synthetic prompts with complete GPT-OSS-120B traces),
instead of distilling the traces again.

download_traces  the set's files streamed (JSON lines or parquet batches; the set is GBs) into {"prompt",
                 "completion"} JSONL rows, the first `max_rows` in file order (null: all). The rows are taken as
                 the set gives them: PromptCoT 2.0's prepare_sft_data_*.py write `prompt` as the chat-formatted
                 user turn and `completion` as the trace; a set whose rows lack string `prompt` and `completion`
                 columns is refused, naming the columns it has (the layout is not confirmed offline).
sft_job          the sft rule: TRL SFT (paperflow.promptscale.sft, torchrun + FSDP on the node's GPUs) of the
                 prompt model's pretrained weights on those rows, the loss on the completion only.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any


def _stream(folder: Path, patterns) -> Iterator[dict[str, Any]]:
    files = sorted(
        p
        for p in folder.rglob("*")
        if p.is_file()
        and ".cache" not in p.parts
        and p.suffix in (".jsonl", ".parquet")
        and any(fnmatch.fnmatch(p.relative_to(folder).as_posix(), pat) for pat in patterns)
    )
    if not files:
        raise FileNotFoundError(f"{folder}: no jsonl/parquet file matches {list(patterns)}")
    for path in files:
        if path.suffix == ".jsonl":
            with open(path, encoding="utf-8") as handle:
                for line in handle:
                    if line.strip():
                        yield json.loads(line)
        else:
            import pyarrow.parquet as pq

            for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
                yield from batch.to_pylist()


def download_traces(name: str, spec: Mapping[str, Any], folder: str | Path, out: str) -> dict[str, Any]:
    """The SFT rows of the downloaded snapshot `folder` into `out`; the counts."""
    limit = spec.get("max_rows")
    written = seen = 0
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as handle:
        for record in _stream(Path(folder), spec["files"]):
            seen += 1
            prompt, completion = record.get("prompt"), record.get("completion")
            if not isinstance(prompt, str) or not isinstance(completion, str):
                kinds = {k: type(v).__name__ for k, v in record.items()}
                raise ValueError(
                    f"corpora.{name}: row {seen - 1} of {spec['hub']} has no string prompt and completion "
                    f"(format prompt_completion); its columns: {kinds}"
                )
            if not prompt.strip() or not completion.strip():
                continue
            handle.write(json.dumps({"prompt": prompt, "completion": completion}, ensure_ascii=False) + "\n")
            written += 1
            if limit is not None and written >= int(limit):
                break
    if not written:
        raise ValueError(f"corpora.{name}: no non-empty prompt/completion row in {spec['hub']}")
    return {"records": seen, "rows": written}


def sft_job(
    start_json: str,
    traces: str,
    settings: Mapping[str, Any],
    device: str,
    n_procs: int,
    out_json: str,
    history: str,
    checkpoint_dir: str | None = None,
) -> dict[str, Any]:
    """The sft rule: TRL SFT from the model the `start_json` names on `traces`, into the folder beside `out_json`
    (models/sft/ for models/sft.json), and `out_json` naming that folder and its files. `checkpoint_dir`: the job's
    checkpoint folder (TRL's checkpoints, resumed from on a rerun: paperflow.promptscale.sft)."""
    from paperflow.promptscale.llm_text import loss_summary, model_folder, write_model_json
    from paperflow.promptscale.sft import run_sft

    folder = Path(out_json).with_suffix("")
    folder.parent.mkdir(parents=True, exist_ok=True)
    logged = run_sft(model_folder(start_json), traces, str(folder), settings, device, n_procs, history, checkpoint_dir)
    write_model_json(out_json, "sft", folder)
    return loss_summary("sft", logged)
