"""Word-level tokenizers for synthetic vocabularies, built with `tokenizers` and wrapped as a
`PreTrainedTokenizerFast`, so that `save_pretrained` writes the files a published tokenizer has and
`AutoTokenizer.from_pretrained` loads it back like one.

Text is split on whitespace; every word of the vocabulary is one token, an unknown word is `unk`.
Padding is on the left (generation appends on the right; `sampling` and `sequence_logprobs` take
position ids from the attention mask, so left padding changes no logit).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

SPECIAL_ROLES = ("pad", "bos", "eos", "unk")
DEFAULT_SPECIALS = {"pad": "<pad>", "bos": "<bos>", "eos": "<eos>", "unk": "<unk>"}


def vocabulary(words: Iterable[str], specials: Mapping[str, str] = DEFAULT_SPECIALS) -> list[str]:
    """The token list: the special tokens first (pad, bos, eos, unk: ids 0-3), then `words` in first-seen order.
    Refuses a word that contains whitespace (it could never be produced by the whitespace split) or repeats
    a special token."""
    unknown = set(specials) - set(SPECIAL_ROLES)
    if unknown or set(specials) != set(SPECIAL_ROLES):
        raise ValueError(f"specials must name exactly the roles {SPECIAL_ROLES}; got {sorted(specials)}")
    tokens = [specials[role] for role in SPECIAL_ROLES]
    seen = set(tokens)
    for word in words:
        if not word or any(ch.isspace() for ch in word):
            raise ValueError(f"vocabulary word {word!r} is empty or holds whitespace")
        if word in seen:
            if word in specials.values():
                raise ValueError(f"vocabulary word {word!r} is a special token")
            continue
        seen.add(word)
        tokens.append(word)
    return tokens


def word_level_tokenizer(
    words: Iterable[str],
    specials: Mapping[str, str] = DEFAULT_SPECIALS,
    chat_template: str | None = None,
    model_max_length: int = 1024,
):
    """A `PreTrainedTokenizerFast` over `vocabulary(words, specials)`: whitespace split, one id per word,
    no automatic BOS/EOS (the tasks write them), left padding, and `chat_template` (Jinja) when given."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    tokens = vocabulary(words, specials)
    core = Tokenizer(WordLevel({tok: i for i, tok in enumerate(tokens)}, unk_token=specials["unk"]))
    core.pre_tokenizer = WhitespaceSplit()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=specials["pad"],
        bos_token=specials["bos"],
        eos_token=specials["eos"],
        unk_token=specials["unk"],
        padding_side="left",
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
    if chat_template is not None:
        tok.chat_template = chat_template
    return tok


# A chat template for word-level vocabularies: each message is "<role> content" and the generation
# prompt ends with the assistant role word. The role words must be in the vocabulary.
SIMPLE_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant{% endif %}"
)


def save_tokenizer(tokenizer, folder: str | Path) -> Path:
    """Write the tokenizer files (tokenizer.json, tokenizer_config.json, special tokens) to `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(folder)
    return folder


def load_tokenizer(folder: str | Path):
    """The tokenizer saved in `folder`, offline. A word-level tokenizer of this module is loaded as the fast
    tokenizer it was saved as: `AutoTokenizer` would not, beside a model config whose type transformers maps to
    its own tokenizer class regardless of tokenizer_config.json (qwen2, phi3, llava, ...: it then reads the
    WordLevel vocabulary through a byte-level BPE pre-tokenizer and silently drops words). Anything else goes
    through `AutoTokenizer.from_pretrained`, as a published tokenizer does."""
    import json

    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    spec = Path(folder) / "tokenizer.json"
    if spec.is_file() and json.loads(spec.read_text()).get("model", {}).get("type") == "WordLevel":
        return PreTrainedTokenizerFast.from_pretrained(str(folder), local_files_only=True)
    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def encode_words(tokenizer, sequences, add_bos: bool = True, add_eos: bool = False):
    """Word sequences -> left-padded `input_ids` and `attention_mask` (torch.long), one row per sequence;
    a word outside the vocabulary is refused (a word-level vocabulary has no fallback worth having)."""
    import torch

    vocab = tokenizer.get_vocab()
    rows = []
    for words in sequences:
        missing = [w for w in words if w not in vocab]
        if missing:
            raise ValueError(f"words outside the vocabulary: {sorted(set(missing))}")
        ids = [vocab[w] for w in words]
        rows.append(([tokenizer.bos_token_id] if add_bos else []) + ids + ([tokenizer.eos_token_id] if add_eos else []))
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        input_ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
        attention_mask[i, width - len(r) :] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def encode_pairs(tokenizer, prompts, completions, add_eos: bool = True):
    """(prompt, completion) word sequences -> one left-padded batch of BOS + prompt + completion [+ EOS]
    with `completion_mask` = 1 on the completion's tokens (EOS included): the tokens a supervised loss
    or a sequence log-prob counts (see `sampling.sequence_logprobs`)."""
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    batch = encode_words(tokenizer, [(*p, *c) for p, c in zip(prompts, completions)], add_eos=add_eos)
    n_completion = [len(c) + int(add_eos) for c in completions]
    width = batch["input_ids"].shape[1]
    mask = batch["attention_mask"].clone() * 0
    for i, n in enumerate(n_completion):
        mask[i, width - n :] = 1
    batch["completion_mask"] = mask
    return batch


def decode_words(tokenizer, ids, stop_at_eos: bool = True) -> list[str]:
    """Token ids -> words, dropping padding; with `stop_at_eos`, words after the first EOS are dropped
    (the EOS itself is kept, so a reward can check that the answer was closed)."""
    out = []
    for i in (int(x) for x in ids):
        if i == tokenizer.pad_token_id:
            continue
        out.append(tokenizer.convert_ids_to_tokens(i))
        if stop_at_eos and i == tokenizer.eos_token_id:
            break
    return out
