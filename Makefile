# attn: every target installs what it needs into .venv (pinned) on first use.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
CONFIG ?= configs/default.yaml
ARGS   ?=
EXP    ?= experiments/sqrt_dk.yaml
RUNS   ?=

.PHONY: train demo demo-figure lint test test-slow test-faults browser bench bench-board ablation ablations verify-ablation verify-ablations verify-published sweep publish compare runs board board-screenshot plot clean-venv

# The runtime, then attn itself as an editable install: .venv/bin/attn runs the working tree's code.
# .venv/.runtime, touched last, says .venv was made whole: a .venv without it (a make cut short by Ctrl-C or a
# full disk) is never trusted, but removed and made again from nothing.
$(VENV)/.runtime: requirements.txt pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "attn needs Python >= 3.10; found " + sys.version.split()[0] + " (set PYTHON=python3.x)")'
	@if test ! -e $@ && { test -e $(VENV) || test -L $(VENV); }; then \
	  echo "make: $(VENV) was not made whole (no $@: cut short?); removing it to make it again" >&2; rm -rf $(VENV); fi
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e .
	@touch $@

# The test dependencies are installed without compiling them (--no-compile): pip would compile every module of
# mlflow, tensorboard, distributed and the rest, most of which no test imports; make test writes the bytecode of
# those it does import as it first imports them. attn's runtime above is compiled, for make train.
$(VENV)/.dev: requirements-dev.txt $(VENV)/.runtime
	$(PY) -m pip install --quiet --disable-pip-version-check --no-compile -r requirements-dev.txt
	@touch $@

## make train [CONFIG=configs/x.yaml] [ARGS="optim.lr=0.05 seed=1"] [RESUME=runs/<run>]
# A diverged run is a result, not a failure of make train: it says so (attn train itself exits 3 for it).
TRAIN_ARGS = $(if $(RESUME),--resume $(RESUME),$(CONFIG)) $(ARGS)
train: $(VENV)/.runtime
	@echo "attn train $(TRAIN_ARGS)"
	@ATTN_VIA_MAKE=train $(PY) -m attn train $(TRAIN_ARGS); status=$$?; \
	if [ $$status = 3 ]; then echo "make train: the run diverged (its loss or weights went non-finite): a result, kept with its metrics and figures" >&2; exit 0; fi; \
	exit $$status

## make demo [ARGS="--runs-dir runs/demo2"]: the claim, run by run: configs/wide.yaml (1/sqrt(d_k)) and
## configs/wide_unscaled.yaml trained side by side into runs/demo (a run already finished there with the same config
## is reused, never overwritten), then runs/demo/demo.png: both losses from step 0, where the queries look, the mechanism
demo: $(VENV)/.runtime
	$(PY) -m attn demo $(ARGS)

## make demo-figure: README's picture, experiments/results/demo.png, from a make demo into a temporary directory
demo-figure: $(VENV)/.runtime
	@set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(PY) -m attn demo --runs-dir $$tmp >/dev/null; cp $$tmp/demo.png experiments/results/demo.png; \
	echo "experiments/results/demo.png: $$(wc -c < experiments/results/demo.png) bytes"

## make compare RUNS="runs/sqrt_dk/*" [ARGS="--metric eval_loss --smooth 0.9 --x wall_time"]
# set -f: the shell leaves globs to attn, which expands them itself (** too) and skips the files they match
compare: $(VENV)/.runtime
	@test -n '$(RUNS)' || { echo 'error: RUNS: got nothing; expected run or experiment directories, e.g. make compare RUNS="runs/sqrt_dk/*"' >&2; exit 2; }
	set -f; $(PY) -m attn compare $(RUNS) $(ARGS)

## make runs [RUNS=runs/sqrt_dk] [ARGS="--status diverged"]: list runs
runs: $(VENV)/.runtime
	$(PY) -m attn runs $(RUNS) $(ARGS)

## make board [RUNS="runs/sqrt_dk runs/lr"] [ARGS="--port 9000" or ARGS="--static DIR"]: the run board,
## live on http://127.0.0.1:8765/ until Ctrl-C (RUNS default: runs)
board: $(VENV)/.runtime
	set -f; $(PY) -m attn board $(RUNS) $(ARGS)

## make board-screenshot [RUNS=...]: README's picture of the board, experiments/results/board.png: the static page
## with no URL parameters, of two seeds each of configs/wide.yaml and configs/wide_unscaled.yaml (400 steps; the
## scaled head learns, the unscaled one stalls at chance) trained into a temporary directory, or of RUNS; needs chromium
BOARD_PNG := experiments/results/board.png
CHROMIUM_FLAGS := --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
  --disable-component-update --disable-sync --hide-scrollbars --window-size=1280,1460 --virtual-time-budget=3000
board-screenshot: $(VENV)/.runtime
	@command -v chromium >/dev/null || { echo 'error: make board-screenshot needs chromium (apt-get install chromium)' >&2; exit 2; }
	@set -ef; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	if [ -z '$(RUNS)' ]; then \
	  for config in wide wide_unscaled; do for seed in 0 1; do \
	    $(PY) -m attn train configs/$$config.yaml seed=$$seed train.steps=400 logging.plots=false \
	      runs_dir=$$tmp/runs --name $$config-seed$$seed >/dev/null 2>&1 || test $$? = 3; \
	  done; done; \
	  here=$$PWD; cd $$tmp; $$here/$(PY) -m attn board --static page runs >/dev/null; cd $$here; \
	else $(PY) -m attn board --static $$tmp/page $(RUNS) >/dev/null; fi; \
	chromium $(CHROMIUM_FLAGS) --user-data-dir=$$tmp/profile --screenshot=$(BOARD_PNG) \
	  "file://$$tmp/page/index.html" 2>/dev/null >/dev/null; \
	echo "$(BOARD_PNG): $$(wc -c < $(BOARD_PNG)) bytes"

## make sweep EXP=experiments/<name>.yaml [ARGS="--workers 2"]: any experiment, then its report
sweep: $(VENV)/.runtime
	$(PY) -m attn sweep $(EXP) $(ARGS)

## make ablation: the headline sqrt(d_k) experiment -> runs/sqrt_dk/report.md
ablation: $(VENV)/.runtime
	@start=$$(date +%s); $(PY) -m attn sweep experiments/sqrt_dk.yaml $(ARGS) || exit $$?; \
	echo "make ablation: $$(( $$(date +%s) - start )) s wall time" >&2

ABLATIONS := sqrt_dk scores qk_rate batch_size width long_budget init_scale optimizer copy lengths mask_self rate_grid variance_vs_step optimizer_wide scores_wide long_budget_wide qk_norm_wide two_factors two_factors_edge two_factors_adamw two_factors_adamw_edge
## make ablations: the headline and every boundary experiment, with the total wall time
ablations: $(VENV)/.runtime
	@start=$$(date +%s); status=0; \
	for name in $(ABLATIONS); do $(PY) -m attn sweep experiments/$$name.yaml $(ARGS) || status=$$?; done; \
	echo "make ablations: $$(( $$(date +%s) - start )) s wall time for $(ABLATIONS)" >&2; exit $$status

## make verify-ablation: the headline again in float64 and under a second BLAS kernel; its verdicts compared
verify-ablation: $(VENV)/.runtime
	$(PY) -m attn verify experiments/sqrt_dk.yaml $(ARGS)

## make verify-ablations: every experiment of make ablations verified so (after make ablations); exit 1 if a verdict differs
verify-ablations: $(VENV)/.runtime
	@start=$$(date +%s); status=0; \
	for name in $(ABLATIONS); do $(PY) -m attn verify experiments/$$name.yaml $(ARGS) || status=$$?; done; \
	echo "make verify-ablations: $$(( $$(date +%s) - start )) s wall time for $(ABLATIONS)" >&2; exit $$status

## make verify-published EXP=experiments/<name>.yaml: its published result re-run here, without its runs, by the commit
## its report names (a git worktree under runs/published/); then attn publish <name> --verification-only
verify-published: $(VENV)/.runtime
	$(PY) -m attn verify $(EXP) --published $(ARGS)

## make publish: copy the experiments' reports into experiments/results/ and regenerate experiments/README.md
## and README's results block from their report.json
publish: $(VENV)/.runtime
	$(PY) -m attn publish $(ARGS)

## make bench [ARGS="--sizes default,large --threads 1 --headline"]: attn's training step against the fastest of
## PyTorch eager, torch.compile and JAX jit (installed from requirements-bench.txt when possible), memory, sweeps
$(VENV)/.bench: requirements-bench.txt $(VENV)/.runtime
	@$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-bench.txt || \
	  echo "make bench: requirements-bench.txt did not install; timing attn against the rivals that are installed" >&2
	@touch $@

bench: $(VENV)/.bench
	$(PY) -m attn bench $(ARGS)

## make bench-board (= make bench ARGS=--board) [ARGS="--board-runs 1200 --board-megabytes 200 --board-code DIR"]:
## the board at scale: /api/board with many runs, cold and warm; /api/records of a huge metrics.jsonl
bench-board: $(VENV)/.runtime
	$(PY) -m attn bench --board $(ARGS)

## make browser: the headless Chromium that the board's browser tests drive: chromium-driver with Debian's
## chromium-headless-shell (the old headless shell: chromium's engine without a browser window, at less CPU a page),
## else with chromium; and chromium (make board-screenshot). Nothing when all are there. As root, what is missing is
## installed with apt-get (the shell on its own: an archive without it still gets the rest). Then: the tests can start
## a browser (a line names what is still missing, if anything), or one line gives the command and make stops (exit 2)
CHROMIUM       ?= /usr/bin/chromium
CHROMEDRIVER   ?= /usr/bin/chromedriver
CHROMIUM_SHELL ?= /usr/lib/chromium/chromium-headless-shell
APT_GET        ?= apt-get
BROWSER_INSTALL = $(APT_GET) update -qq && DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq chromium chromium-driver
SHELL_INSTALL   = DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq chromium-headless-shell
browser:
	@if [ -x '$(CHROMEDRIVER)' ] && [ -x '$(CHROMIUM_SHELL)' ] && [ -x '$(CHROMIUM)' ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v '$(APT_GET)' >/dev/null 2>&1; then \
	  if [ ! -x '$(CHROMEDRIVER)' ] || [ ! -x '$(CHROMIUM)' ]; then \
	    echo "make: installing chromium and chromium-driver for the board's browser tests" >&2; \
	    { $(BROWSER_INSTALL); } >/dev/null 2>&1 || echo "make: $(APT_GET) could not install chromium and chromium-driver (exit $$?)" >&2; fi; \
	  if [ ! -x '$(CHROMIUM_SHELL)' ]; then \
	    echo "make: installing chromium-headless-shell for the board's browser tests" >&2; \
	    { $(SHELL_INSTALL); } >/dev/null 2>&1 || echo "make: $(APT_GET) could not install chromium-headless-shell (exit $$?)" >&2; fi; \
	fi; \
	missing=""; for f in '$(CHROMEDRIVER)' '$(CHROMIUM_SHELL)' '$(CHROMIUM)'; do [ -x "$$f" ] || missing="$$missing $$f"; done; \
	[ -z "$$missing" ] && exit 0; \
	if [ -x '$(CHROMEDRIVER)' ] && { [ -x '$(CHROMIUM_SHELL)' ] || [ -x '$(CHROMIUM)' ]; }; then \
	  echo "make: missing$$missing: the board's browser tests drive $$( [ -x '$(CHROMIUM_SHELL)' ] && echo '$(CHROMIUM_SHELL)' || echo '$(CHROMIUM), at more CPU'); as root: $(BROWSER_INSTALL) && $(SHELL_INSTALL)" >&2; \
	  exit 0; fi; \
	echo "error: the board's browser tests need $(CHROMEDRIVER) and $(CHROMIUM_SHELL) or $(CHROMIUM); missing:$$missing; install them as root: $(BROWSER_INSTALL) && $(SHELL_INSTALL)" >&2; \
	exit 2

## make lint: ruff's lint and format check of attn/ and tests/ (pyproject.toml); `.venv/bin/ruff format attn tests` formats
lint: $(VENV)/.dev
	$(VENV)/bin/ruff check --quiet attn tests
	$(VENV)/bin/ruff format --check --quiet attn tests

## make test: lint, then the suite but its slow tiers (target: 2 minutes on 2 cores); installs the browser first.
## --dist loadscope: each test module runs on one worker, so a module-scoped fixture (a sweep, trained runs, runs
## signalled through the CLI) is made once, not once on each worker that got some of its tests. Bytecode is cached
## (PYTHONDONTWRITEBYTECODE unset, __pycache__ is git-ignored): every worker and every attn child the tests start
## would otherwise compile attn from source again
test: browser $(VENV)/.dev lint
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -q -n 2 --dist loadscope -m "not faults and not slow" $(ARGS)

## make test-slow: the tests marked slow, whole commands end to end (sweeps signalled, killed or racing, publish killed
## at a sample of its writes, verify killed, a resume killed at a sample of its writes, the demo, the benches, the
## MLflow export); CI runs it after make test
test-slow: $(VENV)/.dev
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -q -n 2 --dist loadscope -m "slow and not faults" $(ARGS)

## make test-faults: a real Dask cluster losing a worker and its scheduler, publish killed at every write, sweeps racing a CLI resume, and the
## property-based campaign over damaged run files, configs and experiments (HYPOTHESIS_PROFILE=campaign)
test-faults: browser $(VENV)/.dev
	$(PY) -m pytest -q -m faults $(ARGS)
	HYPOTHESIS_PROFILE=campaign $(PY) -m pytest -q tests/test_store_properties.py $(ARGS)

clean-venv:
	rm -rf $(VENV)
