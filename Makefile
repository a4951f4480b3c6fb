# kbroker: a Kafka-compatible broker built from gRPC microservices.
#   make run    a whole local cluster, Kafka on 127.0.0.1:9092 (Ctrl-C stops it)
#   make test   every test, set-up included (make test-unit: the ones that start no process)
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PROTOS := $(shell find proto/kbroker -name '*.proto')
GEN := proto/gen/.stamp

.PHONY: all venv proto run test test-unit lint bench clean test-deps spark-report

all: venv

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	# The generated stubs (package kbroker) live in proto/gen, outside the source packages.
	echo "$(CURDIR)/proto/gen" > "$$($(PY) -c 'import sysconfig;print(sysconfig.get_paths()["purelib"])')/kbroker-proto.pth"
	$(PY) deploy/tools/install_k8s_tools.py $(VENV)/bin
	touch $@

venv: $(STAMP) $(GEN)

# Regenerate the Kafka message contract from kio, then compile every contract to Python.
proto: $(STAMP)
	$(PY) tools/gen_kafka_proto.py proto
	rm -f $(GEN)
	$(MAKE) $(GEN)

$(GEN): $(STAMP) $(PROTOS)
	rm -rf proto/gen && mkdir -p proto/gen
	$(PY) -m grpc_tools.protoc -I proto --python_out=proto/gen --pyi_out=proto/gen \
		--grpc_python_out=proto/gen $(PROTOS)
	find proto/gen/kbroker -type d -exec touch {}/__init__.py \;
	touch $@

run: venv
	$(VENV)/bin/kbroker up

# Things the tests drive besides Python clients: kcat and promtool (Debian's prometheus package,
# for the chart's alerts) and kafkajs (npm).
JS_STAMP := tests/clients/js/node_modules/.installed

$(JS_STAMP): tests/clients/js/package-lock.json
	cd tests/clients/js && npm ci --no-audit --no-fund --silent
	touch $@

test-deps: $(JS_STAMP)
	@command -v kcat >/dev/null || { apt-get update -qq && apt-get install -y -qq kcat >/dev/null; }
	@command -v promtool >/dev/null || { apt-get update -qq && \
		apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }

# Two passes, each on two workers: the tests that start no process (they mostly wait on
# timers), then the ones that start clusters, a test file per worker at a time (a file's tests
# share its clusters; the two workers' clusters share the machine, as clients and brokers do).
test: venv test-deps
	$(PY) -m pytest -q -p no:cacheprovider -m "not processes" -n 2 tests
	$(PY) -m pytest -q -p no:cacheprovider -m processes -n 2 --dist loadfile --durations=15 tests

# The fast inner loop: everything that starts no process (no cluster, no helm, no Spark), on two
# workers (most of these tests wait on timers rather than compute).
test-unit: venv
	$(PY) -m pytest -q -p no:cacheprovider -m "not processes" -n 2 tests

lint: venv
	$(VENV)/bin/ruff check services tools tests bench spark deploy

bench: venv
	$(PY) bench/throughput.py

# The request-latency and capacity reports (Parquet, PNG, Markdown) over a running cluster:
# CLUSTER=local (`make run`), local:<base port>, k8s:<namespace>/<release>, or host:port,...
CLUSTER ?= local
spark-report: venv
	$(PY) -m spark.jobs.latency_report --cluster '$(CLUSTER)' --output reports/latency
	$(PY) -m spark.jobs.capacity_report --cluster '$(CLUSTER)' --output reports/capacity

clean:
	rm -rf $(VENV) proto/gen data
