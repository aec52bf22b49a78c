PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test lint clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# Reinstall when the project's metadata changes; pick the CuPy build matching the NVIDIA driver.
$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q -e ".[test]$$(scripts/cuda_extra.sh)"
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/lockstep

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -p no:cacheprovider

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV)
