# Two commands a new user runs first: `make demo` and `make test`.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test bench clean-data check-java

check-java:
	@command -v java >/dev/null 2>&1 || { echo "Java 17+ is required by Spark and was not found on PATH. Install it (Debian: apt-get install -y openjdk-17-jre-headless) and run make again." >&2; exit 1; }
	@java -version 2>&1 | head -1 | grep -Eq '"(1[7-9]|2[0-9])' || { echo "Spark 4.2 needs Java 17 or newer; found: $$(java -version 2>&1 | head -1)" >&2; exit 1; }

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

setup: check-java $(STAMP)

demo: setup
	$(PY) -m pipelines.demo

test: setup
	$(PY) -m pytest -q tests

bench: setup
	$(PY) benchmarks/throughput.py

clean-data:
	rm -rf .data
