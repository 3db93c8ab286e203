"""The report contract: `publish` writes every output of a report rule from a `Report`, links
figures and tables relative to the report, and refuses outputs it does not fill or keys the rule
lacks. Keyed inputs and the long-frame helpers that the papers' claims share."""

from __future__ import annotations

import json

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from paperflow.core.claims import long_table
from paperflow.core.config import ConfigError, reject_unknown, require_keys
from paperflow.core.frames import seed_summary
from paperflow.core.keys import key, keyed, unkey
from paperflow.core.report import Figure, Report, Table, publish

CLAIMS = [
    {"id": "c", "statement": "s", "metric": "m", "method": "a", "comparison": "<", "threshold": 3.0, "gated": False}
]


def _report(fig_key: str = "figure_curve", table_key: str = "table_all") -> Report:
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    rows = [{"seed": s, "method": "a", "metric": "m", "value": v} for s, v in ((0, 1.0), (1, 1.2), (2, 1.1))]
    return Report(
        title="T",
        summary="S",
        table=long_table(rows, "tiny"),
        figures=[Figure(fig_key, "a curve", fig)],
        tables=[Table(table_key, "every row", pd.DataFrame({"a": [1, 2]}))],
        metrics={"extra": 7},
    )


def _outputs(tmp_path, **extra):
    return {
        "report": tmp_path / "out" / "report.md",
        "metrics": tmp_path / "out" / "metrics.json",
        "figure_curve": tmp_path / "out" / "figures" / "curve.png",
        "table_all": tmp_path / "out" / "tables" / "all.csv",
        "metrics_table": tmp_path / "out" / "metrics.parquet",
        **extra,
    }


def test_publish_writes_every_output_with_relative_links(tmp_path):
    out = _outputs(tmp_path)
    (tmp_path / "out").mkdir()
    doc = publish(_report(), out, paper="p", scale="tiny", claims=CLAIMS)
    text = out["report"].read_text()
    assert "![a curve](figures/curve.png)" in text and "[every row](tables/all.csv)" in text
    assert out["figure_curve"].read_bytes()[:4] == b"\x89PNG"
    assert pd.read_csv(out["table_all"]).a.tolist() == [1, 2]
    on_disk = json.loads(out["metrics"].read_text())
    assert on_disk == doc and doc["extra"] == 7 and doc["paper"] == "p" and doc["scale"] == "tiny"
    assert doc["claims"][0]["verdict"] == "held" and doc["claims"][0]["ci_high"] < 3.0 and doc["all_gated_held"] is True
    assert pd.read_parquet(out["metrics_table"]).value.tolist() == [1.0, 1.2, 1.1]


def test_publish_refuses_an_output_it_does_not_fill(tmp_path):
    out = _outputs(tmp_path, figure_other=tmp_path / "other.png")
    with pytest.raises(KeyError, match="figure_other"):
        publish(_report(), out, paper="p", scale="tiny", claims=CLAIMS)


def test_publish_refuses_a_key_the_rule_lacks(tmp_path):
    out = _outputs(tmp_path)
    out["figure_renamed"] = out.pop("figure_curve")
    with pytest.raises(KeyError, match="figure_curve"):
        publish(_report(), out, paper="p", scale="tiny", claims=CLAIMS)


def test_publish_requires_the_key_prefixes(tmp_path):
    out = _outputs(tmp_path)
    out["curve"] = out.pop("figure_curve")
    with pytest.raises(ValueError, match="figure_"):
        publish(_report(fig_key="curve"), out, paper="p", scale="tiny", claims=CLAIMS)


def test_keyed_inputs_round_trip_by_label():
    files = {("ph", 0): "a", ("ph", 1): "b", ("gauss", 0): "c"}
    named = keyed("ckpt", files) | keyed("test", {"pareto": "d"})
    assert unkey(named, "ckpt", types=(str, int)) == files
    assert unkey(named, "test") == {"pareto": "d"}
    assert list(unkey(dict(reversed(list(named.items()))), "ckpt", types=(str, int))) == [
        ("gauss", 0),
        ("ph", 1),
        ("ph", 0),
    ]


def test_keyed_inputs_refuse_ambiguous_labels_and_missing_groups():
    with pytest.raises(ValueError, match="__"):
        key("ckpt", ("a__b", 0))
    with pytest.raises(KeyError, match="nope__"):
        unkey({"ckpt__a": "x"}, "nope")
    with pytest.raises(ValueError, match="label part"):
        unkey({"ckpt__a__0": "x"}, "ckpt", types=(str,))


def test_seed_summary_is_mean_std_and_count():
    frame = pd.DataFrame({"m": ["a"] * 3 + ["b"], "seed": [0, 1, 2, 0], "value": [1.0, 2.0, 3.0, 5.0]})
    table = seed_summary(frame, ["m"]).set_index("m")
    assert table.loc["a"].tolist() == [2.0, 1.0, 3] and table.loc["b", "n_seeds"] == 1
    assert np.isnan(table.loc["b", "std"])


def test_require_keys_and_reject_unknown_name_the_keys():
    with pytest.raises(ConfigError, match=r"datasets\.x is missing key\(s\) n, rho"):
        require_keys({"kind": "t"}, ["kind", "n", "rho"], "datasets.x")
    with pytest.raises(ConfigError, match=r"'lrr' \(did you mean 'lr'\?\); allowed: lr, epochs"):
        reject_unknown({"lrr": 1}, ["lr", "epochs"], "train")
    reject_unknown({"lr": 1}, ["lr", "epochs"], "train")
