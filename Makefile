# polygate: `make serve` and `make test` do all set-up on a fresh machine.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
SERVING := $(VENV)/.installed-serve
DATA   ?= .data

.PHONY: serve test bytecode unit unit-twins integration integration-parallel integration-spark cluster lint lint-tree typecheck hooks venv bench clean java mosquitto

MQTT   := plugins/polygate-mqtt
HTTP   := plugins/polygate-http
PLUGINS := $(MQTT) $(HTTP)

# What serving needs (the gateway and the plugins), then, for make test, the test tools and Spark.
$(SERVING): setup.cfg pyproject.toml $(MQTT)/pyproject.toml $(HTTP)/pyproject.toml $(wildcard codecs/*/_speedups.c codecs/*/*.h) \
          $(MQTT)/polygate_mqtt/_speedups.c gateway/_speedups.c gateway/_speedups.h gateway/spark/_arrow.c
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip setuptools wheel
	$(PIP) install --quiet -e .
	$(PIP) install --quiet -e './$(MQTT)' -e './$(HTTP)'
	touch $(SERVING)

$(STAMP): $(SERVING)
	$(PIP) install --quiet -e '.[test,spark]'
	$(PIP) install --quiet -e './$(MQTT)[test]' -e './$(HTTP)[test]'
	touch $(STAMP)

venv: $(STAMP)

# The sources' bytecode, written before the tests: where the environment tells Python not to write
# it (PYTHONDONTWRITEBYTECODE), each of the thousand-odd gateway and CLI processes the tests start
# would compile the project's 120-odd modules again, a third of its start (0.85 s -> 0.62 s of CPU
# per gateway start measured here). Only what changed is compiled again; hidden directories (the
# test tools' own environments under tests/) are left alone.
bytecode: $(STAMP)
	$(PY) -m compileall -q -x '(^|/)\.' gateway codecs storage $(PLUGINS) tests

serve: $(SERVING)
	$(VENV)/bin/gateway serve --data-dir $(DATA)

# import-linter and mypy walk an installed tree, so they check a real build (the editable install
# maps gateway.codecs/gateway.storage without such a tree).
lint-tree: $(STAMP)
	rm -rf build  # a stale build/lib would install modules that no longer exist
	$(PIP) install --quiet --no-deps --no-build-isolation --target build/lint .

# mypy checks the gateway and the plugins (settings: [tool.mypy] in pyproject.toml); its
# report names each file where it is in the repository, not in build/lint.
MYPY = cd build/lint && MYPYPATH=../../$(MQTT):../../$(HTTP) ../../$(VENV)/bin/mypy --config-file ../../pyproject.toml \
	  -p gateway -p polygate_mqtt -p polygate_http >mypy.txt; status=$$?; \
	  sed -e 's,^gateway/codecs/,codecs/,' -e 's,^gateway/storage/,storage/,' -e 's,^$(CURDIR)/,,' mypy.txt; \
	  exit $$status

lint: lint-tree
	$(VENV)/bin/ruff check gateway codecs storage tests benchmarks plugins examples docs
	cd build/lint && PYTHONPATH=. ../../$(VENV)/bin/lint-imports --config ../../setup.cfg
	cd build/lint && PYTHONPATH=.:../../$(MQTT) ../../$(VENV)/bin/lint-imports --config ../../$(MQTT)/pyproject.toml
	cd build/lint && PYTHONPATH=.:../../$(HTTP) ../../$(VENV)/bin/lint-imports --config ../../$(HTTP)/pyproject.toml
	$(MYPY)

# The type check alone (make lint runs it last).
typecheck: lint-tree
	$(MYPY)

# The Spark tests (tests/test_spark_*.py) run Spark in a local JVM.
java:
	@command -v java >/dev/null || { echo "make test needs Java 17 for the Spark tests:" \
	  "apt-get install -y openjdk-17-jre-headless (Debian/Ubuntu), or set JAVA_HOME/PATH to a JDK 17"; exit 1; }

# Two kinds of tests. Unit tests (tests/unit/ and each plugin's tests/unit/) run in memory: codecs,
# conversions, the broker and the stores, no process (their conftest makes starting one fail),
# no JVM, no cluster; `make unit` is the loop to run while editing. Integration tests (the rest of
# tests/ and of each plugin's tests/) start real `gateway serve` processes and real clients.
UNIT_TESTS  := tests/unit $(addsuffix /tests/unit,$(PLUGINS))
INTEGRATION_TESTS := tests $(addsuffix /tests,$(PLUGINS)) --ignore=tests/unit $(addprefix --ignore=,$(addsuffix /tests/unit,$(PLUGINS)))
PYTEST := $(PY) -m pytest -q -p no:cacheprovider
# Integration tests mostly wait on sockets and child processes, so more workers than cores pay: on
# 2 cores, ten integration files took 113 s one at a time, 64 s on 4 workers, 58 s on 6, 75 s on 8.
# The Spark tests run beside them in one process of their own (one JVM for them all, where each
# worker would start its own). Tests that must have the machine to themselves are marked serial
# and run after, one at a time.
WORKERS ?= 6
PARALLEL := -n $(WORKERS)

# The protocol suites again with every gateway in cluster mode, each test on a Tansu cluster of its
# own (tests of local-mode rules are marked local_only and skipped there).
CLUSTER_SUITES := $(addprefix tests/,test_v1_gateway.py test_kafka_confluent.py test_kafka_python.py \
	test_kafka_aiokafka.py test_kafka_groups.py test_kafka_raw.py test_kafka_kcat.py test_kafka_kafkajs.py \
	test_kafka_platformatic.py \
	test_tank_gateway.py test_cursus_clients.py test_cursus_errors.py test_cursus_interop.py test_produce_refusals.py) \
	$(addprefix $(MQTT)/tests/,test_mqtt_mappings.py test_mqtt_retained.py test_mqtt_sessions.py test_mqtt_shared.py \
		test_mqtt5_gateway.py) \
	$(addprefix $(HTTP)/tests/,test_http_rest_proxy.py)

unit: bytecode
	$(PYTEST) $(UNIT_TESTS)

# The unit tests with the C twins, then again with their Python side only.
unit-twins: bytecode
	$(PYTEST) $(UNIT_TESTS)
	POLYGATE_NO_EXTENSIONS=1 $(PYTEST) $(UNIT_TESTS)

# Each pass ends with its slowest tests: where to look first when the run grows past its budget.
integration: bytecode java
	$(MAKE) --no-print-directory -j2 --output-sync=target integration-parallel integration-spark
	$(PYTEST) --durations=15 -m serial $(INTEGRATION_TESTS)

integration-parallel: bytecode
	$(PYTEST) $(PARALLEL) --durations=15 -m "not serial and not spark" $(INTEGRATION_TESTS)

integration-spark: bytecode java
	$(PYTEST) --durations=15 -m "spark and not serial" $(INTEGRATION_TESTS)

cluster: bytecode
	POLYGATE_TEST_STORAGE=cluster $(PYTEST) $(PARALLEL) $(CLUSTER_SUITES)

# Everything: lint beside the unit tests (the type check is mostly one core, the unit tests the
# other; each one's output is printed whole when it ends), then the integration tests, then the
# protocol suites in cluster mode.
test: $(STAMP) java
	$(MAKE) --no-print-directory -j2 --output-sync=target lint unit-twins
	$(MAKE) --no-print-directory integration
	$(MAKE) --no-print-directory cluster

# ruff on every commit (.pre-commit-config.yaml; it runs the ruff of .venv, no download).
hooks: $(STAMP)
	$(VENV)/bin/pre-commit install

# The MQTT benchmark's reference broker, from Debian.
mosquitto:
	@command -v mosquitto >/dev/null || test -x /usr/sbin/mosquitto || \
	  { apt-get update -q && apt-get install -y -q mosquitto; }

# The TANK benchmark's reference, built by hand (docs/conformance.md): make bench TANK_CLI=PATH
# TANK_REFERENCE=HOST:PORT; without them that benchmark measures the gateway alone.
TANK_CLI ?=
TANK_REFERENCE ?=

bench: $(STAMP) mosquitto
	$(PIP) install --quiet -e '.[bench]'
	$(PY) benchmarks/v1_produce.py
	$(PY) benchmarks/tank_produce_consume.py $(if $(TANK_CLI),--tank-cli $(TANK_CLI)) \
	  $(if $(TANK_REFERENCE),--reference $(TANK_REFERENCE))
	$(PY) benchmarks/kafka_produce_consume.py
	$(PY) benchmarks/cursus_produce.py
	$(PY) benchmarks/convert.py --reference
	$(PY) benchmarks/spark_read.py
	$(PY) benchmarks/spark_write.py --tank
	$(PY) benchmarks/cluster.py
	$(PY) benchmarks/tls_cost.py
	$(PY) benchmarks/transactions.py
	$(PY) $(MQTT)/benchmarks/mqtt_publish.py
	$(PY) $(HTTP)/benchmarks/http_produce.py
	$(PY) benchmarks/summary.py

clean:
	rm -rf $(VENV) $(DATA) build *.egg-info
