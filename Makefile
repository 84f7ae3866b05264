# gridstream: `make demo` and `make test` do all set-up themselves.
VENV    := .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed-stamp
PROTOS  := $(wildcard protos/gridstream/v1/*.proto)
GEN     := gridstream/v1/.generated-stamp

export SPARK_LOCAL_IP ?= 127.0.0.1

.PHONY: setup demo test lint unit bench clean

# Every process start (a service, its restart after a kill, a CLI call) would
# otherwise compile gridstream's modules from source again wherever bytecode
# is not written (PYTHONDONTWRITEBYTECODE, a read-only install such as the
# image's): a worker's imports took 0.33 to 0.50 s against 0.24 to 0.26 s, a
# local cluster's start 1.25 to 1.30 s against 1.16 s. compileall only
# compiles what changed since.
setup: $(STAMP) $(GEN)
	$(PY) -m compileall -q gridstream services spark_bridge

# tests/integration/test_console.py renders the web console in a real headless
# Chromium (the Debian package). Installed once, as root (CI); nothing to do
# when /usr/bin/chromium is there.
.PHONY: chromium
chromium:
	@if [ ! -x /usr/bin/chromium ]; then \
	    if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	        echo "installing chromium (Debian package) for the console's browser test"; \
	        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	    else \
	        echo "make setup: /usr/bin/chromium is missing and this is not root; run" \
	             "'apt-get install -y chromium' as root, or test_console.py's browser test fails"; \
	    fi; \
	fi

$(STAMP): requirements.txt pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -r requirements.txt
	$(VENV)/bin/pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

# The gRPC code is generated from protos/, never edited by hand.
$(GEN): $(STAMP) $(PROTOS)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m grpc_tools.protoc -I protos --python_out=. --grpc_python_out=. \
	    --mypy_out=. --mypy_grpc_out=. $(PROTOS)
	touch $(GEN)

demo: setup
	$(VENV)/bin/gridstream demo taxi

lint: setup
	$(VENV)/bin/ruff check gridstream services tests bench deploy spark_bridge
	$(VENV)/bin/mypy

# The suite runs in two pytest-xdist processes, a test file to each in turn
# (loadfile: a module's shared cluster is started once). Its chaos tests
# spend most of their time waiting for detection, restarts and drains (a
# minute of kills used 44 % of one core), so on 2 cores two at a time took
# the non-Spark part from 872 s to 470-516 s (make test from a fresh clone:
# 16 min 17 s before, 8 min 29 s to 10 min 7 s after). Spark's JVM is
# started in a pytest process of its own, before any gRPC thread exists
# there: forking the Java gateway while gRPC threads run has made it die at
# start on a loaded machine.
test: setup chromium lint
	GRPC_ENABLE_FORK_SUPPORT=false $(VENV)/bin/pytest -m "not spark" -n 2 --dist loadfile
	GRPC_ENABLE_FORK_SUPPORT=false $(VENV)/bin/pytest -m spark tests/spark

unit: setup
	$(VENV)/bin/pytest tests/unit

bench: setup
	$(PY) bench/throughput.py
	$(PY) bench/recovery.py
	$(PY) bench/stateserver.py
	$(PY) bench/tracking.py

clean:
	rm -rf $(VENV) gridstream/v1/*_pb2*.py gridstream/v1/*_pb2*.pyi $(GEN)

# gridstream against Bytewax, Pathway and plain Python (bench/peers; not part of
# `make test`). Each peer gets a virtual environment of its own, outside the
# repository like the output; `make bench-peers BENCH_PEERS_ARGS="--rounds 5"`.
.PHONY: bench-peers
BENCH_PEERS_DIR  ?= $(HOME)/.cache/gridstream-bench
BENCH_PEERS_ARGS ?=

bench-peers: setup $(BENCH_PEERS_DIR)/venvs/bytewax/.installed-stamp $(BENCH_PEERS_DIR)/venvs/pathway/.installed-stamp
	$(PY) bench/peers --venvs $(BENCH_PEERS_DIR)/venvs --out $(BENCH_PEERS_DIR)/out $(BENCH_PEERS_ARGS)

$(BENCH_PEERS_DIR)/venvs/%/.installed-stamp: bench/peers/requirements-%.txt
	rm -rf $(BENCH_PEERS_DIR)/venvs/$*
	python3 -m venv $(BENCH_PEERS_DIR)/venvs/$*
	$(BENCH_PEERS_DIR)/venvs/$*/bin/pip install -q --upgrade pip
	$(BENCH_PEERS_DIR)/venvs/$*/bin/pip install -q -r $<
	touch $@

# Ingest-to-sink latency at half of peak throughput, p50/p99/p99.9 per 5 s
# interval over 60 s (bench/latency.py; not part of `make test` or `make bench`):
# `make bench-latency BENCH_LATENCY_ARGS="--workload taxi --delivery at_most_once"`.
.PHONY: bench-latency
BENCH_LATENCY_ARGS ?=

bench-latency: setup
	$(PY) bench/latency.py $(BENCH_LATENCY_ARGS)

# Windowed aggregation: throughput next to the keyed reduce's, and p50/p99 from
# an event to its window's result (bench/windows.py; not part of `make test` or
# `make bench`): `make bench-windows BENCH_WINDOWS_ARGS="--runs 5"`.
.PHONY: bench-windows
BENCH_WINDOWS_ARGS ?=

bench-windows: setup
	$(PY) bench/windows.py $(BENCH_WINDOWS_ARGS)
