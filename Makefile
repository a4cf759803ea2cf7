# tilegemm: every target sets up what it needs. `make demo` and `make test` work on a fresh
# machine with no GPU; `make test-gpu` / `make bench` run on a CUDA machine.
PYTHON ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
# On a machine without a GPU pin the CPU build of torch (a bare `torch` pulls a multi-GB CUDA build).
TORCH_CPU ?= torch==2.13.0
STAMP := $(VENV)/.tilegemm-installed

.PHONY: demo test test-gpu test-gpu-sanitize bench lint format install clean wheel-smoke test-transformers-ends \
	compile-gluon-tritons

$(STAMP): pyproject.toml
	test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	if ! command -v nvidia-smi >/dev/null 2>&1; then $(VPY) -m pip install -q "$(TORCH_CPU)"; fi
	$(VPY) -m pip install -q -e ".[cutile,hf,dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VPY) modeling/transformers/infer.py --compare --model tiny
	$(VPY) modeling/demo.py

test: $(STAMP)
	$(VPY) -m pytest -q -n 2 --durations=15 tests

# On the GPU machine (no network): use the system python that has torch, with src/ on PYTHONPATH
# (`source .devbundle/setup.sh && make test-gpu PY=python3`). Every `gpu` test in one run (the memory-heavy ones one
# after another on one worker, the rest on the others), recorded in benchmarks/results/gpu-tests/<date>-<tree>.json
# (tests/gpu_suite.py; stopped, and recorded as incomplete, at `--budget` seconds, 540 by default). GPU_SUITE_ARGS adds
# options (`--workers N`, `--budget S`, pytest arguments). Under another triton (no cuTile beside its bundle), the
# gluon tests only: benchmarks/gluon/gluon_suite_other_triton.sh (records <date>-<tree>-triton<version>.json).
PY ?= $(VPY)
GPU_SUITE_ARGS ?=
test-gpu:
	PYTHONPATH=src:$$PYTHONPATH $(PY) tests/gpu_suite.py $(GPU_SUITE_ARGS)

# compute-sanitizer over every kernel family on awkward shapes and garbage device values (tests/sanitize/cases.py):
# memcheck (out-of-bounds and misaligned accesses). Value checks off, fallback an error, PyTorch's caching
# allocator off so that every tensor is its own allocation. initcheck does not see the TMA stores of cuTile
# kernels (tests/sanitize/initcheck_probe.py shows it: a fresh output read back is "uninitialized", the same
# output prefilled by torch is clean and correct), so initcheck gates only the prefilled probe.
SANITIZE_ENV := PYTHONPATH=src:$$PYTHONPATH TILEGEMM_CHECK_VALUES=0 TILEGEMM_DISABLE_FALLBACK=1 PYTORCH_NO_CUDA_MEMORY_CACHING=1
SANITIZER ?= compute-sanitizer
test-gpu-sanitize:
	$(SANITIZE_ENV) $(SANITIZER) --tool memcheck --error-exitcode 3 --print-limit 20 $(PY) tests/sanitize/cases.py
	$(SANITIZE_ENV) $(SANITIZER) --tool initcheck --error-exitcode 3 --print-limit 20 $(PY) tests/sanitize/initcheck_probe.py prefilled

# The benchmark harness (tilegemm-bench), --full set under a time budget, into benchmarks/results/.
# BENCH_ARGS adds options (e.g. `--family dense --deepgemm off`); BENCH_NAME names the files.
BENCH_NAME ?= h100
BENCH_ARGS ?=
bench:
	PYTHONPATH=src:$$PYTHONPATH $(PY) -m tilegemm.bench --full --time-budget 540 $(BENCH_ARGS) \
		--save benchmarks/results/$(BENCH_NAME).json --markdown benchmarks/results/$(BENCH_NAME).md

# The README's install path: build the wheel, install it with the cutile and hf extras into a fresh venv (the CPU
# torch where there is no GPU), and run the README's snippets on the CPU from outside the checkout (.ci/wheel_smoke.py).
SMOKE := .wheel-smoke
wheel-smoke: $(STAMP)
	rm -rf $(SMOKE)
	$(VPY) -m pip wheel -q --no-deps -w $(SMOKE)/dist .
	$(PYTHON) -m venv $(SMOKE)/venv
	if ! command -v nvidia-smi >/dev/null 2>&1; then $(SMOKE)/venv/bin/python -m pip install -q "$(TORCH_CPU)"; fi
	$(SMOKE)/venv/bin/python -m pip install -q "$$(ls $(SMOKE)/dist/tilegemm-*.whl)[cutile,hf]"
	cd $(SMOKE) && venv/bin/python ../.ci/wheel_smoke.py

# tests/hf (the patched tiny models and the indexer, on the CPU) at both ends of the supported transformers
# range, each in a throwaway venv with the CPU torch and `transformers==<end>`. The ends have one source, the line
# `TRANSFORMERS_ENDS = ("oldest", "newest tested")` of src/tilegemm/transformers/compat.py (its floor is pyproject's
# `hf` extra's; tests/test_packaging.py holds them equal). ENDS_TESTS narrows the tests (e.g. one file).
TRANSFORMERS_ENDS ?= $(shell sed -n 's/^TRANSFORMERS_ENDS = ("\([^"]*\)", "\([^"]*\)").*/\1 \2/p' src/tilegemm/transformers/compat.py)
ENDS := .transformers-ends
ENDS_TESTS ?= tests/hf
test-transformers-ends:
	test -n "$(TRANSFORMERS_ENDS)"
	failed=""; for v in $(TRANSFORMERS_ENDS); do \
		rm -rf $(ENDS)/$$v && $(PYTHON) -m venv $(ENDS)/$$v && \
		$(ENDS)/$$v/bin/python -m pip install -q "$(TORCH_CPU)" "transformers==$$v" pytest pytest-xdist hypothesis numpy \
			|| exit 1; \
		echo "== transformers $$v"; \
		PYTHONPATH=$(CURDIR)/src:$(CURDIR) $(ENDS)/$$v/bin/python -m pytest -q -n 2 -m "not gpu and not slow" \
			$(ENDS_TESTS) || failed="$$failed $$v"; \
		rm -rf $(ENDS)/$$v; \
	done; \
	if [ -n "$$failed" ]; then echo "tests failed with transformers$$failed"; exit 1; fi

# The gluon kernels' CPU compile gate (tests/compile_gate/test_compile_gluon*.py: sm_90a SASS facts) under each triton
# of GLUON_TRITONS, each in a throwaway venv with the CPU torch and that triton (cuobjdump from its own bundle). The
# gluon backend's tested range at run time is src/tilegemm/backend/selector.py's; this shows which other tritons
# compile the same kernels.
GLUON_TRITONS ?= 3.7.1 3.8.0 3.9.0
TRITONS := .gluon-tritons
compile-gluon-tritons:
	failed=""; for v in $(GLUON_TRITONS); do \
		rm -rf $(TRITONS)/$$v && $(PYTHON) -m venv $(TRITONS)/$$v && \
		$(TRITONS)/$$v/bin/python -m pip install -q "$(TORCH_CPU)" "triton==$$v" pytest numpy || exit 1; \
		echo "== triton $$v"; \
		CUOBJDUMP=$$(ls -d $(TRITONS)/$$v/lib/python*/site-packages/triton/backends/nvidia/bin)/cuobjdump \
		PYTHONPATH=$(CURDIR)/src:$(CURDIR)/tests $(TRITONS)/$$v/bin/python -m pytest -q -p no:cacheprovider \
			tests/compile_gate/test_compile_gluon.py tests/compile_gate/test_compile_gluon_ws.py \
			tests/compile_gate/test_compile_gluon_bf16_ws.py || failed="$$failed $$v"; \
		rm -rf $(TRITONS)/$$v; \
	done; \
	if [ -n "$$failed" ]; then echo "the gluon compile gate failed under triton$$failed"; exit 1; fi

lint: $(STAMP)
	$(VPY) -m ruff check .
	$(VPY) -m ruff format --check .

format: $(STAMP)
	$(VPY) -m ruff check --fix .
	$(VPY) -m ruff format .

clean:
	rm -rf $(VENV) build dist src/*.egg-info $(SMOKE) $(ENDS) $(TRITONS)
