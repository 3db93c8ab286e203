"""The paper scale's verifiable reward (spec section 8): 1 iff the completion's last `\\boxed{...}` is equivalent to
the reference answer under `math-verify`, else 0.

The rule, with no fallback:
- the prediction is the content of the LAST `\\boxed{...}` (or `\\fbox{...}`) of the completion, braces balanced;
  a completion with none, or whose last box never closes, scores 0 without calling math-verify;
- the reference and the prediction are each parsed by `math_verify.parse` as inline LaTeX (`$...$`) and compared
  by `math_verify.verify(gold, prediction)` (gold first: math-verify's comparison is not symmetric);
- without `math-verify` installed the reward raises ImportError naming the package; it never falls back to string
  matching, which would score a different task.
"""

from __future__ import annotations

from collections.abc import Sequence

BOX_COMMANDS = ("\\boxed", "\\fbox")
MATH_VERIFY = "math-verify==0.9.0"  # the version envs/lm-verl.yaml pins; the paper-scale rules need it in their env


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` / `\\fbox{...}` in `text` (nested braces kept), or None when there is
    none or the last one never closes. `\\boxed 5` (a box without braces) gives the token after the space."""
    start = max(text.rfind(cmd) for cmd in BOX_COMMANDS)
    if start < 0:
        return None
    rest = text[start:]
    cmd = next(c for c in BOX_COMMANDS if rest.startswith(c))
    rest = rest[len(cmd) :]
    if rest.startswith(" "):
        token = rest.strip().split()[0].rstrip("$") if rest.strip() else ""
        return token or None
    if not rest.startswith("{"):
        return None
    depth = 0
    for i, ch in enumerate(rest):
        depth += ch == "{"
        depth -= ch == "}"
        if depth == 0:
            return rest[1:i]
    return None


def _math_verify():
    try:
        import math_verify
    except ImportError as err:
        raise ImportError(
            f"the eapo paper-scale reward needs `{MATH_VERIFY}` in the job's environment (math-verify equivalence on "
            "the last \\boxed{}); install it there, there is no fallback"
        ) from err
    return math_verify


def math_reward(completion: str, answer: str) -> float:
    """1.0 iff the last boxed answer of `completion` is math-verify-equivalent to `answer`, else 0.0."""
    predicted = last_boxed(completion)
    if predicted is None:
        return 0.0
    mv = _math_verify()
    gold = mv.parse(f"${answer}$")
    guess = mv.parse(f"${predicted}$")
    return float(bool(mv.verify(gold, guess)))


def trl_math_reward(prompts: Sequence, completions: Sequence[str], answer: Sequence[str], **_) -> list[float]:
    """TRL reward function (GRPOTrainer passes the dataset's `answer` column as a keyword)."""
    if len(completions) != len(answer):
        raise ValueError(f"{len(completions)} completions for {len(answer)} answers")
    return [math_reward(c, a) for c, a in zip(completions, answer)]


trl_math_reward.__name__ = "math_verify"
