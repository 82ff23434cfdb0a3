# Two commands for a newcomer: `make demo` and `make test`. `make ui` shows the demo instance.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
WORKSPACE ?= demo_workspace
HOST ?= 127.0.0.1
PORT ?= 3000

.PHONY: venv demo test test-fast lint ui bench results import-graph clean-demo peers-venv engine engine-stop

$(STAMP): requirements.lock pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -r requirements.lock
	$(BIN)/pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	@touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/basemodel demo --workspace $(WORKSPACE)

test: $(STAMP)
	$(BIN)/ruff check basemodel_pipeline basemodel_pipeline_tests bench
	$(BIN)/python -m pytest -n 2 -q; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 0; fi; exit $$rc

# the development loop: unit-sized modules only (basemodel_pipeline_tests/conftest.py FAST_MODULES)
test-fast: $(STAMP)
	$(BIN)/python -m pytest -n 2 -q -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check basemodel_pipeline basemodel_pipeline_tests bench
	$(BIN)/ruff format --check basemodel_pipeline basemodel_pipeline_tests bench

ui: $(STAMP)
	@mkdir -p $(abspath $(WORKSPACE))/dagster_home
	@test ! -f $(abspath $(WORKSPACE))/config.yaml || DAGSTER_HOME=$(abspath $(WORKSPACE))/dagster_home \
		$(BIN)/basemodel sync-partitions $(abspath $(WORKSPACE))/config.yaml
	DAGSTER_HOME=$(abspath $(WORKSPACE))/dagster_home BASEMODEL_CONFIG=$(abspath $(WORKSPACE))/config.yaml \
		$(BIN)/dagster dev -m basemodel_pipeline.definitions -h $(HOST) -p $(PORT)

bench: $(STAMP)
	$(BIN)/python bench/bench_demo.py --workspace bench_workspace

# bench/RESULTS.md from bench/results/*.json (standard library only); run after a benchmark, commit both
results:
	$(PYTHON) bench/results_page.py

# docs/import-graph.svg: the layers and the imports between packages (test_import_graph checks it is current)
import-graph: $(STAMP)
	$(BIN)/python docs/import_graph.py

# bench/bench_peers.py's own environment (CoLES from pytorch-lifestream beside the pipeline); never .venv
PEERS := .venv-peers
$(PEERS)/.installed: bench/peers-requirements.txt pyproject.toml
	@test -x $(PEERS)/bin/python || $(PYTHON) -m venv $(PEERS)
	$(PEERS)/bin/pip install -q --disable-pip-version-check -r bench/peers-requirements.txt
	$(PEERS)/bin/pip install -q --disable-pip-version-check --no-deps pytorch-lifestream==0.7.0
	$(PEERS)/bin/pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	@touch $@

peers-venv: $(PEERS)/.installed

# A Docker engine of the project's own and its images (root, Debian; docs/orchestration.md)
engine:
	deploy/local-engine.sh start
	deploy/local-engine.sh images

engine-stop:
	deploy/local-engine.sh stop

clean-demo:
	rm -rf $(WORKSPACE)
