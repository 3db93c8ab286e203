"""Reference implementations from other packages, loaded the way this environment allows.

The `dro` package (0.4.3) is a cross-check reference for the DRO papers. Its top-level
`dro/__init__.py` imports `dro.neural_model`, which imports torchvision; torchvision does not
work beside the pinned CPU torch build, so `dro` is installed without its dependencies
(envs/no-deps.txt) and its linear models are imported here without running that `__init__`.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types


def dro_linear_model():
    """The `dro.linear_model` subpackage (SinkhornLinearDRO, KLDRO, CVaRDRO, WassersteinDRO, ...).

    Raises ImportError naming the install step when `dro` is missing."""
    if "dro.linear_model" in sys.modules:
        return sys.modules["dro.linear_model"]
    spec = importlib.util.find_spec("dro")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the `dro` reference package is not installed: pip install --no-deps -r envs/no-deps.txt")
    if "dro" not in sys.modules:
        shell = types.ModuleType("dro")
        shell.__path__ = list(spec.submodule_search_locations)  # a package without its __init__
        sys.modules["dro"] = shell
    return importlib.import_module("dro.linear_model")
