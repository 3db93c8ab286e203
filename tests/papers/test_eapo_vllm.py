"""eapo's vLLM rollout backend (paperflow.eapo.vllm_rollout), offline: fake OpenAI-compatible servers backed by tiny
transformers models answer /v1/completions with token-id prompts and top-k log-probs (vLLM's
`return_tokens_as_token_ids` spelling), and record the dev-mode weight-reload calls. Greedy segment-wise rollouts
through them equal the in-process sampler with EAPO's hook on the same models and tau_H; the learner's recomputed
log mu equals the hook's recorded one; the weight sync writes the learner's weights and posts the reload."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch
from fake_openai import FakeOpenAI
from test_eapo_paper import _recording, _spec, fake_math_verify, hub, prepared  # noqa: F401 (fixtures)

from paperflow.core.config import ConfigError, load_paper_config
from paperflow.core.lm import serve
from paperflow.core.lm.sampling import sample, sequence_logprobs
from paperflow.eapo import paper, paper_train, rl, vllm_rollout

V = 12  # vocabulary (top_logprobs = V gives the exact entropy)
EOS, PAD = 1, 0


def tiny_llama(seed: int, head_scale: float = 1.0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=V,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32,
        bos_token_id=2,
        eos_token_id=EOS,
        pad_token_id=PAD,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(head_scale)
    return model


class FakeVLLM(FakeOpenAI):
    """The shared fake OpenAI server (tests/fake_openai.py) answering as vLLM: /v1/completions (token-id prompt;
    greedy at temperature 0, else a draw seeded by `seed`; stops at EOS and stop_token_ids, the stop token kept;
    top-k log-probs of the temperature-scaled law, T = 0 read as 1), /collective_rpc (reload_weights: the served
    folder's weights loaded into the model) and /reset_prefix_cache. Every POST is recorded as (path, body)."""

    def __init__(self, model, name: str, folder=None, eos=EOS):
        self.model, self.folder, self.eos = model, folder, eos
        super().__init__(
            self._completions,
            name,
            routes={"/collective_rpc": self._rpc, "/reset_prefix_cache": lambda body: {}},
        )

    @property
    def posts(self) -> list[tuple[str, dict]]:
        return list(zip(self.paths, self.bodies))

    def _completions(self, path, body):
        assert path == "/v1/completions", f"no route {path}"
        return [self.complete(body)]

    def _rpc(self, body):
        assert body == vllm_rollout.RELOAD, f"unknown rpc {body}"
        self.reload()
        return {"results": [None]}

    @torch.no_grad()
    def complete(self, body):
        assert body["return_tokens_as_token_ids"] and isinstance(body["prompt"], list)
        ids, T, k = list(body["prompt"]), float(body["temperature"]), int(body["logprobs"])
        stops = {self.eos, *body["stop_token_ids"]} - {None}
        g = torch.Generator().manual_seed(int(body["seed"]))
        tokens, tops, finish = [], [], "length"
        for _ in range(int(body["max_tokens"])):
            logits = self.model(input_ids=torch.tensor([ids])).logits[0, -1].float()
            logp = torch.log_softmax(logits if T in (0, 1) else logits / T, -1)
            tok = int(logits.argmax()) if T == 0 else int(torch.multinomial(logp.exp(), 1, generator=g))
            top = torch.topk(logp, k)
            entry = {f"token_id:{int(i)}": float(v) for v, i in zip(top.values, top.indices)}
            entry[f"token_id:{tok}"] = float(logp[tok])
            tokens.append(f"token_id:{tok}")
            tops.append(entry)
            ids.append(tok)
            if tok in stops:
                finish = "stop"
                break
        return {"index": 0, "text": "", "logprobs": {"tokens": tokens, "top_logprobs": tops}, "finish_reason": finish}

    def reload(self):
        from safetensors.torch import load_file

        state = {}
        for f in sorted(self.folder.glob("*.safetensors")):
            state.update(load_file(f))
        self.model.load_state_dict(state, strict=False)


@pytest.fixture
def servers():
    made = []

    def start(model, name, folder=None, eos=EOS):
        made.append(FakeVLLM(model, name, folder, eos))
        return made[-1]

    yield start
    for s in made:
        s.close()


PROMPTS = [[2, 5, 6], [2, 7, 3, 4]]
G, G_AUG, MAX_NEW = 4, 2, 6


def settings(alpha=1.0):
    return rl.Settings(group_size=G, g_aug=G_AUG, alpha=alpha)


def in_process(policy, prior, tau, alpha=1.0):
    """The kit's sampler with rl.Injector, greedy, on G copies of each prompt (the first G_AUG augmented)."""
    rows = [p for p in PROMPTS for _ in range(G)]
    width = max(map(len, rows))
    ids = torch.tensor([[PAD] * (width - len(r)) + r for r in rows])
    mask = (torch.arange(width)[None, :] >= torch.tensor([width - len(r) for r in rows])[:, None]).long()
    augmented = (torch.arange(len(rows)) % G) < G_AUG
    hook = rl.Injector(prior, settings(alpha), "critical", tau, torch.Generator().manual_seed(3), augmented)
    roll = sample(
        policy,
        ids,
        mask,
        max_new_tokens=MAX_NEW,
        temperature=0.0,
        generator=torch.Generator().manual_seed(0),
        eos_token_id=EOS,
        pad_token_id=PAD,
        hook=hook,
    )
    return rows, augmented, roll, hook.flags()


def between(entropies, mask, q=0.6):
    """A tau_H halfway between two neighbouring entropies (no step sits on the threshold)."""
    values = torch.sort(entropies[mask.bool()].unique()).values
    i = int(q * (len(values) - 1))
    return float((values[i] + values[i + 1]) / 2)


def vllm_side(policy_fake, prior_fake, rows, augmented, tau, max_rounds=MAX_NEW + 1, k=V, rule="critical"):
    sampler = vllm_rollout.VLLMSampler(
        serve.Client(policy_fake.url, "policy", timeout_s=30, concurrency=4),
        serve.Client(prior_fake.url, "prior", timeout_s=30, concurrency=4),
        top_logprobs=k,
        max_rounds=max_rounds,
    )
    return sampler.rollout(
        rows,
        augmented.tolist(),
        rule=rule,
        tau=tau,
        alpha=1.0,
        random_rate=0.2,
        temperature=0.0,
        max_new_tokens=MAX_NEW,
        stop_ids=[EOS],
        generator=torch.Generator().manual_seed(0),
    )


@pytest.fixture(scope="module")
def models():
    policy = tiny_llama(0, head_scale=8.0)  # spread entropies
    prior = tiny_llama(1, head_scale=1000.0)  # peaked: the injector's pi_E draw is its argmax (= vLLM's greedy)
    return policy, prior


def test_greedy_segment_rollout_equals_the_in_process_sampler_with_the_hook(models, servers):
    policy, prior = models
    _, _, pure_roll, _ = in_process(policy, prior, tau=math.inf)  # no injection: entropies of the greedy paths
    tau = between(pure_roll.entropies, pure_roll.completion_mask)
    rows, augmented, roll, flags = in_process(policy, prior, tau)
    assert flags["inject"][roll.completion_mask.bool()].any()  # the comparison covers injections
    got = vllm_side(servers(policy, "policy"), servers(prior, "prior"), [list(r) for r in rows], augmented, tau)
    for i, r in enumerate(got):
        n = int(roll.completion_mask[i].sum())
        assert r.tokens == roll.completion_ids[i, :n].tolist(), i
        assert r.critical == flags["critical"][i, :n].tolist(), i
        assert r.injected == flags["inject"][i, :n].tolist(), i
        assert torch.allclose(torch.tensor(r.entropies), roll.entropies[i, :n], atol=1e-5)
        assert not augmented[i] or len(r.tokens) == n
        assert augmented[i] or not any(r.critical)  # pure rows: nothing critical


def test_the_learners_recomputed_log_mu_equals_the_hooks_recorded_one(models):
    policy, prior = models
    _, _, pure_roll, _ = in_process(policy, prior, tau=math.inf)
    tau = between(pure_roll.entropies, pure_roll.completion_mask)
    rows, _, roll, flags = in_process(policy, prior, tau, alpha=0.6)
    critical = flags["critical"] & roll.completion_mask.bool()
    assert critical.any()
    attn = roll.attention_mask
    width = roll.completion_ids.shape[1]
    old = sequence_logprobs(policy, roll.sequences, attn, 1.0)[:, -width:]
    pe = sequence_logprobs(prior, roll.sequences, attn, 1.0)[:, -width:]
    mu = vllm_rollout.mixture_logprobs(old, pe, 0.6)
    assert torch.allclose(mu[critical], roll.logprobs[critical], atol=1e-5)
    assert torch.equal(vllm_rollout.mixture_logprobs(old, pe, 0.0), old)
    assert torch.equal(vllm_rollout.mixture_logprobs(old, pe, 1.0), pe)


def test_rounds_bound_the_injections_and_the_last_round_marks_nothing_critical(models, servers):
    policy, prior = models
    rows = [p for p in PROMPTS for _ in range(G)]
    augmented = (torch.arange(len(rows)) % G) < G_AUG
    got = vllm_side(servers(policy, "policy"), servers(prior, "prior"), rows, augmented, tau=0.0, max_rounds=2)
    for r, a in zip(got, augmented.tolist()):
        assert len(r.tokens) == len(r.critical) == len(r.injected) == len(r.entropies)
        assert sum(r.injected) == (1 if a else 0)  # tau 0: every step critical, one injection per round but the last
        assert r.critical == r.injected  # after the cut, the last round's steps are the policy's own


def test_truncated_entropy_is_a_lower_bound_and_exact_with_the_whole_vocabulary(models, servers):
    policy, _ = models
    fake = servers(policy, "policy")
    client = serve.Client(fake.url, "policy", timeout_s=30)
    sampler = vllm_rollout.VLLMSampler(client, None, top_logprobs=3, max_rounds=1)
    body = sampler.body([2, 5, 6], 4, 0.0, 3, 0, [EOS])
    seg = sampler._request(client, body)
    full = sampler._request(client, {**body, "logprobs": V})
    assert seg.tokens == full.tokens
    for small, whole in zip(seg.top, full.top):
        assert vllm_rollout.topk_entropy(small) <= vllm_rollout.topk_entropy(whole) + 1e-9
    with torch.no_grad():
        logits = policy(input_ids=torch.tensor([[2, 5, 6]])).logits[0, -1]
    logp = torch.log_softmax(logits.float(), -1)
    assert math.isclose(vllm_rollout.topk_entropy(full.top[0]), float(-(logp.exp() * logp).sum()), rel_tol=1e-5)
    with pytest.raises(serve.ServerError, match="token_id"):
        vllm_rollout.token_id("hello")


def test_the_weight_sync_writes_the_learners_weights_and_posts_the_reload(servers, tmp_path):
    start = tiny_llama(0)
    folder = tmp_path / "run.vllm_policy"
    start.save_pretrained(tmp_path / "start")
    vllm_rollout.copy_model(str(tmp_path / "start"), str(folder))
    fake = servers(tiny_llama(0), "policy", folder)
    learner = tiny_llama(5)  # "trained" weights
    admin = serve.Client(vllm_rollout.root_url(fake.url), "policy", timeout_s=30)
    vllm_rollout.sync_weights(learner, str(folder), admin)
    assert fake.posts == [("/collective_rpc", {"method": "reload_weights"}), ("/reset_prefix_cache", {})]
    for name, value in learner.state_dict().items():
        assert torch.equal(fake.model.state_dict()[name], value), name
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in (tmp_path / "start").iterdir())


def test_the_rollout_syncs_every_sync_every_steps_on_the_main_process(servers, tmp_path):
    start = tiny_llama(0)
    start.save_pretrained(tmp_path / "policy")
    fake = servers(tiny_llama(0), "policy", tmp_path / "policy")
    v = {
        "policy_url": fake.url,
        "policy_name": "policy",
        "policy_folder": str(tmp_path / "policy"),
        "top_logprobs": V,
        "max_rounds": 4,
        "sync_every": 2,
        "timeout_s": 30,
    }
    roll = paper_train.Rollout("grpo", {"g_aug": 0}, G, {"batch_rows": G}, None, 0, backend="vllm", vllm=v)
    waits = []
    acc = type("Acc", (), {"is_main_process": True, "unwrap_model": lambda self, m: m})()
    acc.wait_for_everyone = lambda: waits.append(1)
    trainer = type("T", (), {"accelerator": acc, "model": start, "state": type("S", (), {"global_step": 0})()})()
    synced = []
    for step in range(5):
        trainer.state.global_step = step
        synced.append(roll.maybe_sync(trainer))
    assert synced == [False, False, True, False, True] and len(waits) == 2
    assert [p for p, _ in fake.posts] == ["/collective_rpc", "/reset_prefix_cache"] * 2


def test_the_backend_key_is_checked_and_vllm_asks_for_the_servers_gpus():
    cfg = copy.deepcopy(load_paper_config("eapo", "paper"))
    paper.check(cfg)
    assert paper.train_job_gpus(cfg, "eapo") == cfg["resources"]["train_gpus"]  # transformers: the learner's only
    cfg["math"]["rollout_backend"] = "sglang"
    with pytest.raises(ConfigError, match=r"math.rollout_backend 'sglang' is not allowed.*'transformers', 'vllm'"):
        paper.check(cfg)
    cfg["math"]["rollout_backend"] = "vllm"
    cfg["resources"]["train_gpus"] = 4
    cfg["math"]["trl"]["gradient_accumulation_steps"] = 16
    paper.check(cfg)
    v = cfg["math"]["vllm"]
    assert paper.train_job_gpus(cfg, "eapo") == 4 + v["policy_gpus"] + v["prior_gpus"]
    assert paper.train_job_gpus(cfg, "grpo") == 4 + v["policy_gpus"]  # no pi_E server without injection
    with pytest.raises(ValueError, match="allowed values"):
        paper_train.Rollout("grpo", {"g_aug": 0}, G, {"batch_rows": G}, None, 0, backend="sglang")
    with pytest.raises(RuntimeError, match=r"needs 8 GPUs .*math.vllm.policy_gpus 2"):
        vllm_rollout.gpu_split("0,1,2,3", 4, 2, 2)
    assert vllm_rollout.gpu_split("0,1,2,3,4,5,6,7", 4, 2, 2) == {"learner": "0,1,2,3", "policy": "4,5", "prior": "6,7"}


def test_the_launch_starts_both_servers_on_their_gpus_and_the_learner_on_the_rest(tmp_path, monkeypatch):
    started, ran = [], []

    class Served:
        def __init__(self, command, url, **kw):
            started.append((command, url, kw))

        def __enter__(self):
            return None

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(serve, "served", Served)
    monkeypatch.setattr(paper.subprocess, "run", lambda cmd, check, env: ran.append(env))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")
    (tmp_path / "start").mkdir()
    (tmp_path / "start" / "model.safetensors").write_bytes(b"x")
    cfg = load_paper_config("eapo", "paper")
    vcfg = dict(cfg["math"]["vllm"])
    spec = {
        "rollout_backend": "vllm",
        "vllm": vcfg,
        "prior": str(tmp_path / "prior"),
        "start": str(tmp_path / "start"),
        "out_dir": str(tmp_path / "run"),
        "dtype": "bfloat16",
    }
    paper.launch(spec, str(tmp_path / "s.json"), 4, python="python")
    assert ran[0]["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    (policy_cmd, policy_url, pk), (prior_cmd, _, qk) = started
    assert pk["env"] == {"CUDA_VISIBLE_DEVICES": "4,5", "VLLM_SERVER_DEV_MODE": "1"}
    assert qk["env"]["CUDA_VISIBLE_DEVICES"] == "6,7"
    assert policy_cmd[:3] == ["vllm", "serve", str(tmp_path / "run.vllm_policy")]
    assert prior_cmd[2] == str(tmp_path / "prior")
    assert "--logprobs-mode" in policy_cmd and policy_cmd[policy_cmd.index("--max-logprobs") + 1] == "20"
    written = json.loads((tmp_path / "s.json").read_text())["vllm"]
    assert written["policy_url"] == policy_url and written["policy_folder"] == str(tmp_path / "run.vllm_policy")
    assert (tmp_path / "run.vllm_policy" / "model.safetensors").read_bytes() == b"x"


# --- through TRL: the learner recomputes log mu on the vLLM rollout's sequences -----------------------------------


def test_trl_gets_log_mu_recomputed_from_its_pi_old_and_pi_e_on_the_vllm_sequences(servers, tmp_path, request):
    request.getfixturevalue("fake_math_verify")  # test_eapo_paper's fixtures (imported above)
    cfg, pretrained, data = request.getfixturevalue("prepared")
    from transformers import AutoModelForCausalLM

    base = paper.model_folder(str(pretrained))
    prior_folder = tmp_path / "prior"
    prior = AutoModelForCausalLM.from_pretrained(base)
    with torch.no_grad():
        for p in prior.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=torch.Generator().manual_seed(7)))
    prior.save_pretrained(prior_folder)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (prior_folder / f).write_bytes((Path(base) / f).read_bytes())
    policy_fake = servers(AutoModelForCausalLM.from_pretrained(base).eval(), "policy", eos=None)
    prior_fake = servers(prior.eval(), "prior", eos=None)
    cfg["eapo"].update(alpha=0.5, quantile=0.0)  # tau_H at the lowest entropy: critical steps are certain
    cfg["math"]["rollout_backend"] = "vllm"
    spec = _spec(cfg, data, tmp_path, "eapo", base, prior=str(prior_folder))
    spec["vllm"].update(
        policy_url=policy_fake.url,
        policy_name="policy",
        prior_url=prior_fake.url,
        prior_name="prior",
        policy_folder=str(tmp_path / "unused"),
        top_logprobs=8,
        max_rounds=4,
        timeout_s=30,
    )
    trainer = paper_train.build(spec)
    seen = _recording(trainer)
    trainer.train()
    last, out = seen[0]
    assert last["recompute"] and not any(p == "/collective_rpc" for p, _ in policy_fake.posts)  # step 0: no sync
    width = out["completion_ids"].shape[1]
    critical = paper_train._pad(last["critical"], width, False, "cpu") & out["completion_mask"].bool()
    assert critical.any() and len(prior_fake.posts) > 0
    ids = torch.cat([out["prompt_ids"], out["completion_ids"]], 1)
    attn = torch.cat([out["prompt_mask"], out["completion_mask"]], 1)
    start = AutoModelForCausalLM.from_pretrained(base).eval()
    with torch.no_grad():
        old = sequence_logprobs(start, ids, attn, 1.0)[:, -width:]
        pe = sequence_logprobs(prior, ids, attn, 1.0)[:, -width:]
    mu = vllm_rollout.mixture_logprobs(old, pe, 0.5)
    assert torch.allclose(out["old_per_token_logps"][critical], mu[critical], atol=1e-5)
    rest = out["completion_mask"].bool() & ~critical
    assert torch.allclose(out["old_per_token_logps"][rest], old[rest], atol=1e-5)
