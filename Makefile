# attn: every target installs what it needs into .venv (pinned) on first use.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
CONFIG ?= configs/default.yaml
ARGS   ?=
EXP    ?= experiments/sqrt_dk.yaml
RUNS   ?=

.PHONY: train test bench ablation ablations sweep compare runs plot clean-venv

$(VENV)/.runtime: requirements.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "attn needs Python >= 3.10; found " + sys.version.split()[0] + " (set PYTHON=python3.x)")'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	@touch $@

$(VENV)/.dev: requirements-dev.txt $(VENV)/.runtime
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	@touch $@

## make train [CONFIG=configs/x.yaml] [ARGS="optim.lr=0.05 seed=1"] [RESUME=runs/<run>]
train: $(VENV)/.runtime
ifdef RESUME
	$(PY) -m attn train --resume $(RESUME) $(ARGS)
else
	$(PY) -m attn train $(CONFIG) $(ARGS)
endif

## make test: the whole suite
test: $(VENV)/.dev
	$(PY) -m pytest -q $(ARGS)

clean-venv:
	rm -rf $(VENV)
