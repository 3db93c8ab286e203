"""Tool calling through the kit's local server (the path the ReAct harness takes at cpu scale): a template without
tool support gets the tools as a <tools> block in the system message, the conversation's tool calls and results are
written back as text, <tool_call> blocks of a generation become OpenAI tool calls, malformed ones stay text, and a
template that renders tools itself gets them as `tools=`."""

from __future__ import annotations

import json

import pytest

from paperflow.core.lm import local_server as ls
from paperflow.core.lm.local_server import LocalServer
from paperflow.core.lm.serve import ServerError

TOOL = {
    "type": "function",
    "function": {
        "name": "get_user",
        "description": "Find a user by email.",
        "parameters": {"type": "object", "properties": {"email": {"type": "string"}}, "required": ["email"]},
    },
}


class CharTokenizer:
    """A tokenizer of characters (id = code point) whose chat template writes `<|role|>content` turns and ignores
    `tools` unless `native` (then it writes them as a `<|tools|>` turn), like SmolLM2's and Qwen's templates."""

    pad_token_id = 0
    eos_token_id = 1

    def __init__(self, native: bool = False):
        self.native = native
        self.rendered: list[list[dict]] = []

    def apply_chat_template(self, messages, tools=None, add_generation_prompt=False, tokenize=True):
        self.rendered.append([dict(m) for m in messages])
        text = "".join(f"<|{m['role']}|>{m.get('content') or ''}" for m in messages)
        if self.native and tools:
            text = "<|tools|>" + json.dumps(tools) + text
        text += "<|assistant|>" if add_generation_prompt else ""
        return [ord(c) for c in text] if tokenize else text

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


class Config:
    max_position_embeddings = 1 << 16


class Model:
    config = Config()


def canned(monkeypatch, texts):
    """The server's model answers each request with the next of `texts` (in place of sampling); the prompts'
    decoded texts are collected."""
    prompts, replies = [], iter(texts)

    def run(self, jobs):
        for job in jobs:
            prompts.append(self.tokenizer.decode(job.ids))
            job.result = [{"text": next(replies), "finish_reason": "stop", "tokens": 5} for _ in range(job.n)]

    monkeypatch.setattr(LocalServer, "_run", run)
    return prompts


def test_a_tool_call_block_becomes_an_openai_tool_call(monkeypatch):
    prompts = canned(
        monkeypatch,
        ['Let me look.\n<tool_call>\n{"name": "get_user", "arguments": {"email": "a@b.c"}}\n</tool_call>'],
    )
    tok = CharTokenizer()
    with LocalServer(Model(), tok, "m") as server:
        doc = server.client().post(
            "/chat/completions",
            {
                "model": "m",
                "messages": [{"role": "system", "content": "Policy."}, {"role": "user", "content": "Who is a@b.c?"}],
                "tools": [TOOL],
                "tool_choice": "auto",
                "temperature": 0.0,
                "max_tokens": 40,
            },
        )
    choice = doc["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Let me look."
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_user"
    assert json.loads(call["function"]["arguments"]) == {"email": "a@b.c"}
    # the tools reached the model as a <tools> block of their schemas in the system message, after the policy
    system = tok.rendered[-1][0]
    assert system["role"] == "system" and system["content"].startswith("Policy.\n\n# Tools")
    assert json.dumps(TOOL) in system["content"] and "<tool_call>" in system["content"]
    assert prompts[0].startswith("<|system|>Policy.") and json.dumps(TOOL) in prompts[0]


def test_several_calls_are_parsed_in_order_and_a_system_message_is_added_when_there_is_none(monkeypatch):
    canned(
        monkeypatch,
        [
            '<tool_call>{"name": "get_user", "arguments": {"email": "x"}}</tool_call>'
            '<tool_call>{"name": "get_user"}</tool_call>'
        ],
    )
    tok = CharTokenizer()
    with LocalServer(Model(), tok, "m") as server:
        (choice,) = server.client().chat([{"role": "user", "content": "go"}], tools=[TOOL], max_tokens=40)
    calls = choice["message"]["tool_calls"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"email": "x"}, {}]
    assert len({c["id"] for c in calls}) == 2
    assert choice["message"]["content"] is None
    assert [m["role"] for m in tok.rendered[-1]] == ["system", "user"]
    assert tok.rendered[-1][0]["content"].startswith("# Tools")


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>{not json}</tool_call>",
        '<tool_call>{"arguments": {"email": "x"}}</tool_call>',  # no name
        '<tool_call>{"name": "get_user", "arguments": "email=x"}</tool_call>',  # arguments not an object
        '<tool_call>["get_user"]</tool_call>',
        '<tool_call>{"name": "get_user", "arguments": {"email": "x"}}',  # unclosed (max_tokens hit)
        "I cannot do that.",
    ],
)
def test_a_malformed_block_stays_text(monkeypatch, text):
    canned(monkeypatch, [text])
    with LocalServer(Model(), CharTokenizer(), "m") as server:
        (choice,) = server.client().chat([{"role": "user", "content": "go"}], tools=[TOOL], max_tokens=40)
    assert choice["finish_reason"] == "stop"
    assert choice["message"] == {"role": "assistant", "content": text}


def test_a_malformed_block_beside_a_good_one_stays_in_the_content():
    bad = "<tool_call>{oops}</tool_call>"
    good = '<tool_call>{"name": "get_user", "arguments": {}}</tool_call>'
    content, calls = ls.parse_tool_calls(f"a {bad} b {good} c", iter(range(10)))
    assert [c["function"]["name"] for c in calls] == ["get_user"]
    assert content == f"a {bad} b  c"


def test_a_tool_result_round_trips_into_the_next_prompt(monkeypatch):
    """The harness's second request (the assistant's call, with no content, and the tool's result) is written as text
    turns the template accepts: the call as its <tool_call> block, consecutive results as one user turn."""
    prompts = canned(monkeypatch, ["Ada Lovelace."])
    tok = CharTokenizer()
    messages = [
        {"role": "system", "content": "Policy."},
        {"role": "user", "content": "Who is a@b.c?"},
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "call_0",
                    "type": "function",
                    "function": {"name": "get_user", "arguments": '{"email": "a@b.c"}'},
                },
                {"id": "call_1", "type": "function", "function": {"name": "get_user", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_0", "content": '{"name": "Ada Lovelace"}'},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"error": "email is required"}'},
    ]
    with LocalServer(Model(), tok, "m") as server:
        (choice,) = server.client().chat(messages, tools=[TOOL], max_tokens=40)
    assert choice["message"] == {"role": "assistant", "content": "Ada Lovelace."}
    assert choice["finish_reason"] == "stop"
    rendered = tok.rendered[-1]
    assert [m["role"] for m in rendered] == ["system", "user", "assistant", "user"]
    blocks = ls.TOOL_CALL.findall(rendered[2]["content"])
    assert [json.loads(b) for b in blocks] == [
        {"name": "get_user", "arguments": {"email": "a@b.c"}},
        {"name": "get_user", "arguments": {}},
    ]
    assert rendered[3]["content"] == (
        '<tool_response>\n{"name": "Ada Lovelace"}\n</tool_response>\n'
        '<tool_response>\n{"error": "email is required"}\n</tool_response>'
    )
    # what the model wrote is what it reads back: its parsed call rendered again parses to the same call
    content, calls = ls.parse_tool_calls(rendered[2]["content"], iter(range(10)))
    assert [c["function"] for c in calls] == [c["function"] for c in messages[2]["tool_calls"]]
    assert prompts[0].endswith("</tool_response><|assistant|>")


def test_a_template_that_renders_tools_gets_them_itself(monkeypatch):
    canned(monkeypatch, ["done"])
    tok = CharTokenizer(native=True)
    messages = [{"role": "user", "content": "go"}]
    with LocalServer(Model(), tok, "m") as server:
        server.client().chat(messages, tools=[TOOL], max_tokens=40)
        assert server.renders_tools()
    assert tok.rendered[-1] == messages  # passed through, not rewritten


def test_without_tools_the_prompt_is_unchanged(monkeypatch):
    prompts = canned(monkeypatch, ['<tool_call>{"name": "get_user", "arguments": {}}</tool_call>'])
    tok = CharTokenizer()
    with LocalServer(Model(), tok, "m") as server:
        (choice,) = server.client().chat([{"role": "user", "content": "go"}], max_tokens=40)
    assert prompts == ["<|user|>go<|assistant|>"]
    assert "tool_calls" not in choice["message"]  # no tools offered: the text is the answer


@pytest.mark.parametrize(
    ("body", "key"),
    [
        ({"tool_choice": "required", "tools": [TOOL]}, "tool_choice"),
        ({"tool_choice": {"type": "function", "function": {"name": "get_user"}}, "tools": [TOOL]}, "tool_choice"),
        ({"tools": [{"name": "get_user"}]}, "tools"),
        ({"tools": "get_user"}, "tools"),
    ],
)
def test_tool_options_it_cannot_honour_are_refused_naming_the_key(monkeypatch, body, key):
    canned(monkeypatch, ["x"])
    with LocalServer(Model(), CharTokenizer(), "m") as server:
        with pytest.raises(ServerError, match=rf"HTTP 400: .*\b{key}\b"):
            server.client().post(
                "/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "go"}], **body}
            )
        with pytest.raises(ServerError, match=r"HTTP 400: .*\btools\b.*chat/completions"):
            server.client().post("/completions", {"model": "m", "prompt": "go", "tools": [TOOL]})
