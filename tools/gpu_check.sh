#!/usr/bin/env bash
# The GPU check (issue 18): runs the CUDA-path tests of tests/gpu on this machine's GPU(s), with per-test times,
# inside 8 minutes. It refuses to run without CUDA, so it can never "pass" by skipping everything.
#
#   tools/gpu_check.sh [python]      # default: .venv/bin/python if present, else python3
#
# Output: torch / CUDA / GPU facts, then pytest's verdicts and durations; exit status is pytest's.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
"$PY" - <<'PYEOF'
import sys, torch
if not torch.cuda.is_available():
    sys.exit("tools/gpu_check.sh: torch sees no CUDA device (torch %s, built for CUDA %s); nothing to check"
             % (torch.__version__, torch.version.cuda))
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.device_count()} device(s):",
      ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())))
PYEOF
export PYTHONUNBUFFERED=1 WANDB_MODE=offline
start=$(date +%s)
status=0
timeout 480 "$PY" -m pytest -m gpu tests/gpu -v -rs --durations=0 -p no:cacheprovider -o addopts="" "${@:2}" || status=$?
echo "gpu check: ${status} after $(( $(date +%s) - start )) s"
exit $status
