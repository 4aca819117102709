# Two commands on a fresh machine: `make demo` and `make test`. Both set up what they need.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup demo test test-fast browser lab lessons bench bench-quick lint clean

$(STAMP): pyproject.toml package.json package-lock.json
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# the CPU build on this machine's disk; a bare `torch` would pull a multi-GB CUDA build
	$(PY) -m pip install -q torch==2.13.0
	npm ci --no-audit --no-fund --loglevel=error
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(VENV)/bin/neuraldbg demo weight-blowup
	$(VENV)/bin/neuraldbg demo nan-batch

# Chromium for the real-browser test (Debian's package; Playwright's own download fails offline)
browser:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -q && apt-get install -y -q chromium; }

test: setup browser
	npm run typecheck
	npm test
	$(VENV)/bin/ruff check neuraldbg_nb tests benchmarks notebooks
	$(VENV)/bin/mypy neuraldbg_nb
	$(VENV)/bin/lint-imports
	# two at a time (browsers, kernels and torchrun among them: their waits bound a hang, not
	# the speed), then one at a time what a neighbour would slow past its bounds: the tests
	# that assert on wall-clock time (`timed`)
	$(PY) -m pytest -q -n 2 --dist worksteal -m "not timed"
	$(PY) -m pytest -q -m "timed"

# the edit-test loop: the Python tests without a browser, notebooks, torchrun, benchmark
# scripts or trainings in subprocesses (about 2 minutes on 2 cores)
test-fast: setup
	$(PY) -m pytest -q -m "not slow and not browser and not lessons and not distributed and not benchmarks"

lab: setup
	$(VENV)/bin/jupyter lab notebooks/

# The lessons' sources are the percent scripts notebooks/NN_*.py (jupytext pairs them with
# the notebooks: notebooks/jupytext.toml). This writes each committed notebook from its
# script, without outputs; cell ids and metadata are kept from the notebook already there.
lessons: setup
	$(VENV)/bin/jupytext --to ipynb --update notebooks/[0-9][0-9]_*.py
	$(VENV)/bin/jupyter nbconvert --clear-output --inplace --log-level=WARN notebooks/[0-9][0-9]_*.ipynb

bench: setup
	$(PY) benchmarks/notebook_path.py
	$(PY) benchmarks/overhead.py
	$(PY) benchmarks/self_time.py
	$(PY) benchmarks/panel_scale.py
	$(PY) benchmarks/memory.py

bench-quick: setup
	$(PY) benchmarks/notebook_path.py --quick
	$(PY) benchmarks/overhead.py --quick
	$(PY) benchmarks/self_time.py --quick
	$(PY) benchmarks/panel_scale.py --quick
	$(PY) benchmarks/memory.py --quick

lint: setup
	$(VENV)/bin/ruff check neuraldbg_nb tests benchmarks notebooks
	$(VENV)/bin/mypy neuraldbg_nb
	$(VENV)/bin/lint-imports

clean:
	rm -rf $(VENV) node_modules neuraldbg_nb/static
