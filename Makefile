# cdclake developer entry points. `make demo` and `make test` set everything up themselves.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
MVN := mvn -B -q -s jars/maven-settings.xml
export PYTHONUNBUFFERED := 1

.PHONY: setup jars demo test lint bench bench-quick broker-start broker-stop clean

setup: $(VENV)/.installed jars

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $@

# JVM jars from Maven Central (cached in ~/.m2 and copied into jars/*/lib).
jars: jars/spark/lib/.copied jars/kafka/lib/.copied

jars/%/lib/.copied: jars/%/pom.xml jars/maven-settings.xml
	rm -rf jars/$*/lib
	$(MVN) -f jars/$*/pom.xml dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=$(CURDIR)/jars/$*/lib
	touch $@

demo: setup
	$(PY) -m cdclake.demo

# Test files are spread over TEST_WORKERS processes (pytest-xdist), each with its own Spark session and broker, the
# longest files first (tests/conftest.py; --no-loadscope-reorder keeps that order).
TEST_WORKERS ?= 2
test: setup
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=20

# Benchmarks with their targets (benchmarks/README.md); both exit 0 even when a target fails.
bench: setup
	$(PY) -m benchmarks

bench-quick: setup
	$(PY) -m benchmarks --quick

lint: setup
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/mypy src benchmarks

broker-start: setup
	$(PY) -m cdclake.devtools.broker start

broker-stop:
	$(PY) -m cdclake.devtools.broker stop

clean:
	rm -rf .cdclake .pytest_cache .mypy_cache .ruff_cache
