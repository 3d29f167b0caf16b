# hkt_nb: the two commands a new user needs are `make book` and `make test` (see README.md).
SHELL := /bin/bash
.DEFAULT_GOAL := book

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch is installed only when the environment has none (Colab and GPU machines keep theirs).
# On these build machines torch==2.13.0 resolves offline to a CPU wheel; elsewhere you may prefer
#   make book TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cpu"
TORCH_SPEC ?= torch==2.13.0
PRESET ?= smoke
# the experiment chapters: one per benchmark of the task registry (chapter 4, hkt_nb/lra/tasks.py), read when used
EXPERIMENTS = $(shell $(BIN)/python -m hkt_nb.lra.tasks chapters)
EMPTY :=
SPACE := $(EMPTY) $(EMPTY)
EXPERIMENTS_RE = ^($(subst $(SPACE),|,$(strip $(EXPERIMENTS))))\.ipynb$$
# Real data: a local copy in the hub's parquet layout (HKT_DATA_DIR), else the Hugging Face hub.
HKT_DATA_DIR ?= $(if $(wildcard ../shared/data),$(abspath ../shared/data),)
export HKT_DATA_DIR
export PYTHONHASHSEED := 0

# the extras the chapters and the tests need (declared once, in settings.ini; the book page nbs/98_install, "Install")
EXTRAS ?= lra,theory,book,dev
BOOK_HTML := _build/_build/html

.PHONY: install book test chapters check-sync lint pytest nbtest browser-test book-build clean gpu-check gpu-check-dry gpu-data gpu-results

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: setup.py settings.ini pyproject.toml | $(BIN)/python
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install $(TORCH_SPEC)
	$(BIN)/python -m pip install -e ".[$(EXTRAS)]"
	$(BIN)/python -m pip check
	touch $@

install: $(VENV)/.installed

## book: execute the chapters (CPU-friendly defaults) and write the HTML book
book: install
	$(BIN)/python scripts/build_book.py --preset $(PRESET)

## chapters: run the experiment chapters through papermill with PRESET=smoke|cpu|cpu_small|paper
chapters: install
	@test -n "$(EXPERIMENTS)" || { echo "no experiment chapters: '$(BIN)/python -m hkt_nb.lra.tasks chapters' failed"; exit 1; }
	@mkdir -p results/chapters/$(PRESET)
	@for nb in $(EXPERIMENTS); do \
	  if [ -f nbs/$$nb.ipynb ]; then \
	    echo "papermill $$nb (preset $(PRESET))"; \
	    (cd nbs && MPLBACKEND=module://matplotlib_inline.backend_inline TQDM_DISABLE=1 HF_DATASETS_DISABLE_PROGRESS_BARS=1 KINETO_LOG_LEVEL=6 ../$(BIN)/papermill --no-progress-bar -k python3 -p preset $(PRESET) \
	      $$nb.ipynb ../results/chapters/$(PRESET)/$$nb.ipynb) || exit 1; \
	  fi; \
	done

check-sync: install
	BIN=$(BIN) scripts/check_sync.sh

## lint: ruff (unused imports, redefinitions, unused locals, import order; pyproject.toml) over the library
lint: install
	$(BIN)/ruff check hkt_nb

pytest: install
	MPLBACKEND=Agg $(BIN)/python -m pytest -q tests

## browser-test: open every page of the built book in headless Chromium (after `make book`)
browser-test: install
	HKT_BOOK_HTML=$(BOOK_HTML) HKT_REQUIRE_BOOK=1 $(BIN)/python -m pytest -q -rs tests/test_pkg_browser.py

nbtest: install
	MPLBACKEND=Agg OMP_NUM_THREADS=1 $(BIN)/nbdev_test --skip_file_re '$(EXPERIMENTS_RE)'  # the experiment chapters run in `chapters`; 2 workers x 1 thread on 2 cores

## test: the whole suite (what CI runs): sync checks, ruff, library tests (slow ones included), the
## experiment chapters with the smoke preset (first: the results chapter needs runs to read), notebook
## tests, the book build with warnings as errors, and the book opened in headless Chromium
test: check-sync lint pytest
	$(MAKE) gpu-check-dry
	$(MAKE) chapters PRESET=smoke
	$(MAKE) nbtest
	$(MAKE) book PRESET=smoke
	$(MAKE) browser-test

## gpu-check: on a machine with one CUDA GPU, the checks of issue 12 in under 8 minutes (CUDA tests, bench_cost
## up to T = 16,384, budgeted paper-preset ListOps runs), recorded under results/gpu/
gpu-check: install
	$(BIN)/python scripts/gpu_check.py

## gpu-data: on the CPU, before a device call: ListOps at the paper's length, generated and tokenised into the one
## file the call carries, _build/gpu_carry/listops-paper.tar.gz (scripts/gpu_results.py)
gpu-data: install
	$(BIN)/python scripts/gpu_results.py prepare

## gpu-results: on a machine with one CUDA GPU, after `make gpu-data` here: HKT and MHA on that data, one seed each
## under a stated time budget (under 8 minutes in all), with full-test predictions, recorded under results/gpu/accuracy/
gpu-results: install
	$(BIN)/python scripts/gpu_results.py train

## gpu-check-dry: the same steps on the CPU at toy size (part of `make test`; the accuracy step included), recorded under _build/gpu_check_dry/
gpu-check-dry: install
	OMP_NUM_THREADS=1 $(BIN)/python scripts/gpu_check.py --dry-run

clean:
	rm -rf _build _proc _docs build dist *.egg-info results/chapters/smoke

## results: regenerate the results chapter from results/ alone (no training, no data) into
## _build/results/09_results.ipynb; the HTML book is not changed (`make book` executes nbs/09_results.ipynb
## itself, also from results/). RESULTS_PRESET=auto|smoke|cpu|cpu_small|paper (auto: the largest preset in which one task's
## grid is complete, else the preset with the most finished runs; each task summarised at its largest complete preset)
RESULTS_PRESET ?= auto
.PHONY: results
results: install
	@mkdir -p _build/results
	cd nbs && MPLBACKEND=module://matplotlib_inline.backend_inline $(abspath $(BIN))/papermill --no-progress-bar -k python3 \
	  -p results_dir ../results -p preset $(RESULTS_PRESET) 09_results.ipynb ../_build/results/09_results.ipynb
	@echo "results chapter: _build/results/09_results.ipynb"
