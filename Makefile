# Two commands do all the set-up (see README.md):
#   make smoke   install, then run every enabled paper at smoke scale -> results/smoke/summary.md
#   make test    install, then run the whole test suite (what CI runs)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
CORES  ?= 2

.PHONY: install lint smoke cpu test test-fast report record record-cpu clean

$(BIN)/.installed: pyproject.toml envs/no-deps.txt envs/pip-check-allowed.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[all,workflow,test]'
	$(BIN)/pip install --quiet --no-deps -r envs/no-deps.txt
	$(BIN)/python tools/pip_check.py
	touch $@

install: $(BIN)/.installed

smoke: install
	$(BIN)/snakemake --cores $(CORES)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/snakefmt --check .

cpu: install  # every paper at cpu scale (at most 20 min each on 2 cores) -> results/cpu/summary.md
	$(BIN)/snakemake --cores $(CORES) --config scale=cpu

PYTEST_ARGS ?=
test: install lint  # both cores (pytest-xdist); CI prints the 25 slowest tests
	$(BIN)/python -m pytest -n $(CORES) --durations=25 $(PYTEST_ARGS)

test-fast: install
	$(BIN)/python -m pytest -n $(CORES) -m "not slow"

report: install
	$(BIN)/snakemake --report report.html

record: install  # after `make smoke`: docs/results/smoke.{json,md} from the audited results/smoke
	$(BIN)/paperflow record write --scale smoke
	$(BIN)/paperflow record readme

record-cpu: install  # after `make cpu` (or one paper's cpu run, then `paperflow record write --scale cpu --papers x`)
	$(BIN)/paperflow record write --scale cpu
	$(BIN)/paperflow record readme

clean:
	rm -rf results .snakemake report.html report.zip
