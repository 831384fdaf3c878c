# attn: every target installs what it needs into .venv (pinned) on first use.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
CONFIG ?= configs/default.yaml
ARGS   ?=
EXP    ?= experiments/sqrt_dk.yaml
RUNS   ?=

.PHONY: train test test-faults bench ablation ablations sweep publish compare runs plot clean-venv

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

## make compare RUNS="runs/sqrt_dk/*" [ARGS="--metric eval_loss --smooth 0.9 --x wall_time"]
# set -f: the shell leaves globs to attn, which expands them itself (** too) and skips the files they match
compare: $(VENV)/.runtime
	@test -n '$(RUNS)' || { echo 'error: RUNS: got nothing; expected run or experiment directories, e.g. make compare RUNS="runs/sqrt_dk/*"' >&2; exit 2; }
	set -f; $(PY) -m attn compare $(RUNS) $(ARGS)

## make runs [RUNS=runs/sqrt_dk] [ARGS="--status diverged"]: list runs
runs: $(VENV)/.runtime
	$(PY) -m attn runs $(RUNS) $(ARGS)

## make sweep EXP=experiments/<name>.yaml [ARGS="--workers 2"]: any experiment, then its report
sweep: $(VENV)/.runtime
	$(PY) -m attn sweep $(EXP) $(ARGS)

## make ablation: the headline sqrt(d_k) experiment -> runs/sqrt_dk/report.md
ablation: $(VENV)/.runtime
	@start=$$(date +%s); $(PY) -m attn sweep experiments/sqrt_dk.yaml $(ARGS) || exit $$?; \
	echo "make ablation: $$(( $$(date +%s) - start )) s wall time" >&2

ABLATIONS := sqrt_dk init_scale lr optimizer scalings copy
## make ablations: the headline and every boundary experiment, with the total wall time
ablations: $(VENV)/.runtime
	@start=$$(date +%s); status=0; \
	for name in $(ABLATIONS); do $(PY) -m attn sweep experiments/$$name.yaml $(ARGS) || status=$$?; done; \
	echo "make ablations: $$(( $$(date +%s) - start )) s wall time for $(ABLATIONS)" >&2; exit $$status

## make publish: copy the experiments' reports and figures from runs/ into experiments/results/ (committed)
publish:
	@for name in $(ABLATIONS); do \
	  test -f runs/$$name/report.md || { echo "skip $$name: no runs/$$name/report.md" >&2; continue; }; \
	  mkdir -p experiments/results/$$name && cp runs/$$name/report.md runs/$$name/report.csv runs/$$name/*.png experiments/results/$$name/ && echo "experiments/results/$$name"; \
	done

## make bench [ARGS="--sizes default,large --unset-coretype"]: attn's training step against PyTorch eager
## (optional: .venv/bin/pip install torch), matmul rate, peak memory, sweep throughput -> runs/bench/
bench: $(VENV)/.runtime
	$(PY) -m attn bench $(ARGS)

## make test: the whole suite but the slow fault tests (under 2 minutes on 2 cores)
test: $(VENV)/.dev
	$(PY) -m pytest -q -m "not faults" $(ARGS)

## make test-faults: a real Dask cluster losing a worker, sweeps racing a CLI resume, and the
## property-based campaign over damaged run files, configs and experiments (HYPOTHESIS_PROFILE=campaign)
test-faults: $(VENV)/.dev
	$(PY) -m pytest -q -m faults $(ARGS)
	HYPOTHESIS_PROFILE=campaign $(PY) -m pytest -q tests/test_store_properties.py $(ARGS)

clean-venv:
	rm -rf $(VENV)
