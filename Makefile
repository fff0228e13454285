# Two commands a new user runs first: `make demo` and `make test`.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# Two jobs: the setup's steps wait on the network, Maven and single-threaded tools (the venv, the class archive's
# training run, mypy), so on 2 cores a fresh clone's setup takes ~100 s instead of ~130 s. Maven's runs stay one at a
# time (order-only prerequisites below: they share ~/.m2 and the operator's build directory). The suite's own run
# is one job (the recipe after every prerequisite), its output as it comes.
ifeq ($(MAKELEVEL),0)  # set once: a sub-make that sets it again leaves the jobserver ("-j2 forced in makefile")
MAKEFLAGS += --jobs=2
endif
UV := uv==0.13.9

.PHONY: setup check-mvn system-deps demo test test-long test-fast lint bench clean-data check-java check-javac peers \
  check-spark-version junit

check-java:
	@command -v java >/dev/null 2>&1 || { echo "Java 17+ is required by Spark and was not found on PATH. Install it (Debian: apt-get install -y openjdk-17-jre-headless) and run make again." >&2; exit 1; }
	@java -version 2>&1 | head -1 | grep -Eq '"(1[7-9]|2[0-9])' || { echo "Spark 4.2 needs Java 17 or newer; found: $$(java -version 2>&1 | head -1)" >&2; exit 1; }

check-mvn:
	@command -v mvn >/dev/null 2>&1 || { echo "Maven (mvn) builds the JVM operator (jvm/operator/pom.xml) and fetches the pinned JVM artifacts (jvm/deps/pom.xml, jvm/kafka/pom.xml) and was not found on PATH. Install it (Debian: apt-get install -y maven) and run make again." >&2; exit 1; }

check-javac:
	@command -v javac >/dev/null 2>&1 || { echo "javac (JDK 17+) is required to build the JVM operator (SESSIONS_OPERATOR=jvm) and was not found on PATH. Install it (Debian: apt-get install -y openjdk-17-jdk-headless) and run make again." >&2; exit 1; }

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q $(UV)
	# Compiled at install, as pip does: with PYTHONDONTWRITEBYTECODE set (CI machines often set it) every process
	# would otherwise compile every module it imports, each time.
	$(VENV)/bin/uv pip install --python $(PY) --compile-bytecode -q -e '.[test]'
	touch $(STAMP)

# Headless Chromium for the Dagster UI test and PostgreSQL 15 for the Postgres-backed Dagster instance
# (Debian packages; needs root, as on CI machines).
system-deps:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; \
	  else echo "chromium is missing: install the Debian packages chromium and chromium-driver (the UI test will be skipped)" >&2; fi; }
	@[ -x /usr/lib/postgresql/15/bin/initdb ] || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql-15 >/dev/null; \
	  else echo "PostgreSQL 15 is missing: install the Debian package postgresql-15 (the Dagster e2e test needs it)" >&2; fi; }

# The JVM artifacts the product loads beside pyspark's jars (Delta Spark), pinned in jvm/deps/pom.xml, fetched once
# here from Maven Central into build/jars/ (pipelines/job/runtime.py puts them on Spark's class path): never at job start.
RUNTIME_JARS := build/jars/.fetched
$(RUNTIME_JARS): jvm/deps/pom.xml
	@$(MAKE) -s check-mvn
	rm -rf build/jars
	mvn -q -B -f jvm/deps/pom.xml dependency:copy-dependencies -DexcludeTransitive=true \
	  -DoutputDirectory=$(CURDIR)/build/jars
	touch $@

# Hadoop's S3A filesystem and the AWS SDK for a checkpoint on S3 (jvm/s3a/pom.xml), on the class path only of a job
# whose checkpoint is there (pipelines/job/runtime.py).
S3A_JARS := build/jars-s3a/.fetched
$(S3A_JARS): jvm/s3a/pom.xml | $(RUNTIME_JARS)
	@$(MAKE) -s check-mvn
	rm -rf build/jars-s3a
	mvn -q -B -f jvm/s3a/pom.xml dependency:copy-dependencies -DexcludeTransitive=true \
	  -DoutputDirectory=$(CURDIR)/build/jars-s3a
	touch $@

# Apache Kafka's own broker for the Kafka ingest tests (tests/kafka_broker.py, deploy/local-kafka): a KRaft broker
# pinned in jvm/kafka/pom.xml with its runtime dependencies, fetched once here into build/kafka/, never at broker start.
KAFKA_JARS := build/kafka/.fetched
$(KAFKA_JARS): jvm/kafka/pom.xml | $(S3A_JARS)
	@$(MAKE) -s check-mvn
	rm -rf build/kafka
	mvn -q -B -f jvm/kafka/pom.xml dependency:copy-dependencies -DincludeScope=runtime \
	  -DoutputDirectory=$(CURDIR)/build/kafka
	touch $@

# The JVM operator (the default; SESSIONS_OPERATOR), a Maven module (jvm/operator/pom.xml) built against Spark at the
# pyspark wheel's version (check-spark-version) and loaded with spark.jars (pipelines/job/runtime.py). Maven builds
# in build/jvm/operator/; its two jars are copied to build/jvm/: sessions-operator.jar (src/main/java, the product)
# and sessions-operator-tests.jar (src/test/java but the JUnit tests: CoreHarness, the py4j harness of
# tests/test_jvm_operator.py), on the class path of the test suite's Spark JVMs only (SPARK_DIST_CLASSPATH, set by
# tests/conftest.py). A jar is copied only when its bytes changed (the build is reproducible): a rebuild that changes
# nothing in the product's jar leaves it, and the class archive made against it, as they are.
JVM_POM := jvm/operator/pom.xml
JVM_BUILD := build/jvm/operator
JVM_JAR := build/jvm/sessions-operator.jar
JVM_TESTS_JAR := build/jvm/sessions-operator-tests.jar
JVM_SRC := $(shell find jvm/operator/src -type f)
$(JVM_BUILD)/.packaged: $(JVM_SRC) $(JVM_POM) $(STAMP) | $(KAFKA_JARS)
	@$(MAKE) -s check-mvn check-javac check-spark-version
	mvn -q -B -f $(JVM_POM) -DskipTests package
	touch $@

$(JVM_JAR) $(JVM_TESTS_JAR): build/jvm/%.jar: $(JVM_BUILD)/.packaged
	@cmp -s $(JVM_BUILD)/$*.jar $@ || cp $(JVM_BUILD)/$*.jar $@

# spark-sql is `provided` in jvm/operator/pom.xml: the pyspark wheel's own jars run the operator, so the two versions
# must be one.
check-spark-version:
	@pom=$$(sed -n 's:.*<spark.version>\(.*\)</spark.version>.*:\1:p' $(JVM_POM)); \
	  wheel=$$($(PY) -c 'import pyspark; print(pyspark.__version__)'); \
	  [ "$$pom" = "$$wheel" ] || { echo "$(JVM_POM) builds the JVM operator against Spark $$pom but the pyspark wheel is $$wheel: set its <spark.version> to $$wheel" >&2; exit 1; }

# The JVM operator's JUnit tests (jvm/operator/src/test/java/sessions/*Test.java), run by `make test`: seconds.
junit: check-mvn check-javac $(STAMP) $(JVM_BUILD)/.packaged
	@$(MAKE) -s check-spark-version
	mvn -q -B -f $(JVM_POM) test

# A real HDFS on loopback for tests and local runs (deploy/local-hdfs, tests/hdfs_cluster.py): Hadoop's MiniDFSCluster
# (hadoop-client-minicluster, pinned in jvm/hdfs/pom.xml at pyspark's Hadoop version) fetched into build/hdfs/, and
# the small launcher around it compiled against it and the pyspark wheel's Hadoop client jars; it runs with build/hdfs/*
# and pyspark's jars/* on the class path. The jar is stored again uncompressed (56 -> 143 MB): Jersey (WebHDFS) and Jetty
# find their classes and web apps by reading a whole jar through, and inflating this one cost ~4 s of CPU at every
# NameNode start.
HDFS_JARS := build/hdfs/.fetched
$(HDFS_JARS): jvm/hdfs/pom.xml | $(JVM_BUILD)/.packaged
	@$(MAKE) -s check-mvn
	rm -rf build/hdfs
	mvn -q -B -f jvm/hdfs/pom.xml dependency:copy-dependencies -DexcludeTransitive=true \
	  -DoutputDirectory=$(CURDIR)/build/hdfs
	set -e; cd build/hdfs; for jar in *.jar; do rm -rf unpacked; mkdir unpacked; (cd unpacked && jar xf ../$$jar); \
	  jar --create --no-compress --file $$jar --manifest unpacked/META-INF/MANIFEST.MF -C unpacked .; done; rm -rf unpacked
	touch $@

HDFS_JAR := build/hdfs/local-hdfs.jar
HDFS_SRC := $(wildcard jvm/hdfs/src/sessions/hdfs/*.java)
$(HDFS_JAR): $(HDFS_SRC) $(HDFS_JARS) $(STAMP)
	@$(MAKE) -s check-javac
	rm -rf build/hdfs/classes
	javac -Xlint:all,-path -Werror --release 17 -d build/hdfs/classes \
	  -cp "build/hdfs/*:$$($(PY) -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')/*" \
	  $(HDFS_SRC)
	jar cf $@ -C build/hdfs/classes .

# The Spark JVM's class archive (AppCDS; pipelines/job/class_archive.py): one training run, ~30 s, saves ~2 s at every
# JVM start. A JDK or pyspark upgrade makes it stale: the JVM then starts without it (and says so in its log).
CLASS_ARCHIVE := build/jvm/spark-classes.jsa
$(CLASS_ARCHIVE): $(JVM_JAR) $(RUNTIME_JARS) $(STAMP) pipelines/job/class_archive.py
	$(PY) -m pipelines.job.class_archive $@

setup: check-java $(STAMP) $(RUNTIME_JARS) $(S3A_JARS) $(KAFKA_JARS) $(JVM_JAR) $(JVM_TESTS_JAR) $(CLASS_ARCHIVE) $(HDFS_JARS) $(HDFS_JAR)

demo: setup
	$(PY) -m sessionctl.demo

# ruff and mypy (pyproject [tool.ruff], [tool.mypy]): CI fails on a lint or type regression before the suite runs.
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# The per-commit suite: every test but the long depth (pyproject [tool.pytest.ini_options] markers; the depths in
# tests/conftest.py), under 15 minutes on 2 cores. TEST_WORKERS pytest processes (pytest-xdist), a whole module per
# worker at a time (module fixtures); each worker has its own SparkSession. TEST_WORKERS=0: one process.
# The 30 slowest tests are listed at the end: where the suite's time goes. The JVM operator's JUnit tests (junit) first.
TEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist $(1))
test: setup system-deps lint junit
	$(PY) -m pytest -q --durations=30 $(call XDIST,loadfile) -m "not long" tests

# The long depth, which CI runs after `make test`: the storage matrix on the local HDFS and S3 (moto), the crash
# campaigns, the standalone cluster, Apache Kafka's broker, the Dagster stack with PostgreSQL and a browser, and the
# kills inside a running stream's recovery. Each worker starts its servers once.
test-long: setup system-deps
	$(PY) -m pytest -q --durations=30 $(call XDIST,loadfile) -m long tests

# The pure tier and the core scenarios in-process against the oracle, under 3 minutes. No module fixtures there, so
# tests are spread one by one (an idle worker takes queued tests from the busy one).
test-fast: setup
	$(PY) -m pytest -q $(call XDIST,worksteal) -m fast tests

bench: setup
	$(PY) benchmarks/throughput.py

clean-data:
	rm -rf .data

# The Flink peer of benchmarks/end_to_end.py in its own venv (apache-flink's pins clash with ours: apache-beam & co).
PEERS_VENV := benchmarks/peers/.venv-flink

$(PEERS_VENV)/.installed: benchmarks/peers/requirements-flink.txt
	python3 -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install -q --upgrade pip
	$(PEERS_VENV)/bin/python -m pip install -q -r benchmarks/peers/requirements-flink.txt
	touch $(PEERS_VENV)/.installed

peers: check-java $(PEERS_VENV)/.installed
