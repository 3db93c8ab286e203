"""EAPO's methods: what distinguishes one method's run (spec section 6's {method} wildcard), without torch, so that
the workflow's input functions can read a method while Snakemake builds the DAG."""

from __future__ import annotations

from dataclasses import dataclass

from paperflow.core.config import ConfigError


@dataclass(frozen=True)
class Method:
    """What distinguishes one method's run (the names of spec section 6's {method} wildcard)."""

    start: str = "base"  # the model it starts from: base | prior
    inject: str | None = None  # None | critical | random: where the prior's token may come in
    prior: str = "prior"  # the experience model injected: prior (pi_E) | base (the negative control)
    denominator: str = "mixture"  # mixture (mu, the true behaviour prob) | policy (pi_old: the noIS ablation)
    dynamic_sampling: bool = False  # DAPO
    luffy: bool = False  # one off-policy pi_E trace per group, shaped loss


METHODS: dict[str, Method] = {
    "grpo": Method(),
    "dapo": Method(dynamic_sampling=True),
    "eapo": Method(inject="critical"),
    "eapo_noIS": Method(inject="critical", denominator="policy"),
    "eapo_randpos": Method(inject="random"),
    "eapo_baseprior": Method(inject="critical", prior="base"),
    "luffy": Method(luffy=True),
    "from_prior": Method(start="prior"),
}


def method(name: str) -> Method:
    if name not in METHODS:
        raise ConfigError(f"unknown EAPO method {name!r}; allowed: {', '.join(METHODS)}")
    return METHODS[name]
