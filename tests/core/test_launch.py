"""The launch prefix of a training job: plain python for one process, single-node torchrun for more."""

from __future__ import annotations

import pytest

from paperflow.core.launch import launch_command


def test_one_process_is_plain_python_and_several_are_torchrun():
    assert launch_command(1) == "python"
    assert launch_command(8) == "python -m torch.distributed.run --standalone --nnodes=1 --nproc-per-node=8"
    assert launch_command(2, python="/opt/env/bin/python").startswith("/opt/env/bin/python -m torch.distributed.run")


def test_zero_processes_is_refused():
    with pytest.raises(ValueError, match="at least one process"):
        launch_command(0)
