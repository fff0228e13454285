# syntax=docker/dockerfile:1
# User-code image: the sessions package, its pinned dependencies, Java for Spark, serving the Dagster
# definitions (assets.definitions) over gRPC. The Helm chart runs it as the user deployment and, with the
# K8sRunLauncher, as every run's pod. Build from the repo root:  docker build -t sessions-pipeline:<tag> .
# (Not built on the dev machines: they have no Docker daemon. See README "Production deployment".)

# bookworm pinned: plain python:3.11-slim follows Debian's newest release, which no longer ships OpenJDK 17.
FROM python:3.11-slim-bookworm

# Spark 4.2 needs Java 17+; the JDK, not the JRE: the image compiles the JVM operator. Its postinst registers
# man-page alternatives; the slim image has no man dirs.
# procps: Spark's launch scripts call ps. maven: fetches the pinned JVM artifacts (jvm/deps/pom.xml).
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jdk-headless maven procps \
    && rm -rf /var/lib/apt/lists/*

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/sessions

# Dependencies first, from pyproject.toml's pins, in their own layer: a code change does not reinstall
# PySpark. dagster-k8s (same release line as dagster 1.13.27) is for the chart's K8sRunLauncher: run pods
# start from this image and load the instance, which names dagster_k8s.
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt dagster-k8s==0.29.27 \
    && rm /tmp/requirements.txt

COPY pipelines/ pipelines/
COPY state_store/ state_store/
COPY assets/ assets/
COPY sessionctl/ sessionctl/
RUN pip install --no-deps .

# The JVM operator (the default stateful operator) compiled against the installed pyspark's jars, as the Makefile
# does (hence the JDK above, not the JRE), then the Spark JVM's class archive made by this image's own JVM
# (README "First two commands"). The package's code resolves both under /opt/sessions/build/jvm.
COPY jvm/ jvm/
# The pinned JVM artifacts (jvm/deps/pom.xml: Delta Spark), fetched at build time as `make setup` does.
RUN mvn -q -B -f jvm/deps/pom.xml dependency:copy-dependencies -DexcludeTransitive=true \
        -DoutputDirectory=/opt/sessions/build/jars \
    && rm -rf /root/.m2
RUN JARS="$(python -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')" \
    && javac --release 17 -d build/jvm/classes -cp "$JARS/*" jvm/src/sessions/*.java \
    && jar cf build/jvm/sessions-operator.jar -C build/jvm/classes . \
    && python -m pipelines.job.class_archive build/jvm/spark-classes.jsa

# Not root. SESSIONS_HOME is the data root (checkpoint, locks, local tables); in a cluster it is a shared
# volume mounted here by every pod (deploy/helm/values.yaml). DAGSTER_HOME is where the chart mounts the
# instance's dagster.yaml (deploy/dagster.yaml when run without the chart).
RUN useradd --create-home --uid 10001 sessions \
    && mkdir -p /data /opt/dagster/dagster_home \
    && chown sessions:sessions /data /opt/dagster/dagster_home
ENV SESSIONS_HOME=/data \
    DAGSTER_HOME=/opt/dagster/dagster_home
USER sessions

EXPOSE 4000
# The Dagster code server (it can reload definitions from the UI without a pod restart); the chart passes
# the same arguments through codeServerArgs. tests/test_dagster_e2e.py starts the code server from this line.
CMD ["dagster", "code-server", "start", "-h", "0.0.0.0", "-p", "4000", "-m", "assets.definitions"]
