PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Two stamps: `make run` needs the runtime only; `make test` adds the test extras (torch, transformers, ruff).
RUNTIME := $(VENV)/.runtime-installed
TESTDEPS := $(VENV)/.test-installed
# The installers' own progress, not -q: a first install must not look like a hang. The runtime goes in
# through scripts/install.sh (uv, else pip); the test extras through pip, which reads pip.conf (the CPU
# torch wheel is found through it).
INSTALL := scripts/install.sh $(PY)
PIP := $(PY) -m pip install --progress-bar on --disable-pip-version-check --no-compile

.PHONY: run test lint clean
# A recipe that fails leaves no target behind: a venv whose pip never installed would otherwise pass for
# a made one on the next run.
.DELETE_ON_ERROR:

$(PY):
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || { \
	  echo "Lockstep needs Python 3.11 or newer; $(PYTHON) is $$(command -v $(PYTHON) >/dev/null && $(PYTHON) -V 2>&1 || echo "not found")."; \
	  echo "Name another interpreter: make run PYTHON=python3.11"; exit 1; }
	@echo "==> creating the virtual environment in $(VENV)"
	$(PYTHON) -m venv $(VENV) || { rm -rf $(VENV); \
	  echo "could not create $(VENV) (on Debian/Ubuntu: apt install python3-venv)"; exit 1; }

# Reinstall when the project's metadata changes; pick the CuPy build matching the NVIDIA driver.
$(RUNTIME): pyproject.toml | $(PY)
	@echo "==> installing Lockstep and its runtime dependencies (first run: under a minute)"
	extra=$$(scripts/cuda_extra.sh); $(INSTALL) -e ".$${extra:+[$${extra#,}]}"
	touch $(RUNTIME)

$(TESTDEPS): $(RUNTIME)
	@echo "==> installing the test extras (pytest, torch CPU, transformers, ruff)"
	$(PIP) -e ".[test]$$(scripts/cuda_extra.sh)"
	touch $(TESTDEPS)

run: $(RUNTIME)
	@echo "==> starting the studio"
	$(VENV)/bin/lockstep

test: $(TESTDEPS)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -p no:cacheprovider

lint: $(TESTDEPS)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV)
