# Headwater: `make run` starts a local cluster on 127.0.0.1:1883, `make test` runs every check.
# `install` is idempotent: apt only for missing programs, pip only when pyproject.toml, setup.py
# or a compiled source changed, Maven only while Kafka's jars are not cached yet.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

VENV ?= .venv
PY := $(VENV)/bin/python
HEADWATER_COMPILE ?= 1
# one stamp per build (compiled, or pure with HEADWATER_COMPILE=0): switching installs again
INSTALL_STAMP := $(VENV)/.headwater-install$(if $(filter 0,$(HEADWATER_COMPILE)),-pure).stamp
JS_DIR := tests/js
JS_STAMP := $(JS_DIR)/node_modules/.headwater-install.stamp
EXTRAS ?= test,dev,analytics
RUN_ARGS ?=
BENCH_ARGS ?=
PROFILE_ARGS ?=
SUDO := $(shell [ "$$(id -u)" -eq 0 ] || echo sudo)
# program:Debian package, installed with apt-get when the program is not found.
APT_NEEDS := redis-server:redis-server haproxy:haproxy mosquitto:mosquitto \
	mosquitto_pub:mosquitto-clients java:openjdk-17-jre-headless mvn:maven node:nodejs npm:npm \
	cc:gcc

.PHONY: help install system-packages kafka-jars js-packages test lint run docs bench clean distclean

help:
	@echo "make run      install what is missing, then start a dev cluster (headwater dev up)"
	@echo "make test     install what is missing, then ruff, mypy and pytest"
	@echo "make bench    install what is missing, then python -m bench all: throughput, routing,"
	@echo "              scale, sessions and profile, Headwater (headwater dev up) beside mosquitto"
	@echo "              (docs/benchmarks.md; BENCH_ARGS=--quick: smoke run)"
	@echo "make profile  install what is missing, then py-spy one node at full QoS 0 and QoS 1"
	@echo "              fan-in: where the microseconds per message go (docs/benchmarks.md,"
	@echo "              flame graphs in docs/flame; PROFILE_ARGS=\"--seconds 3 --no-write\")"
	@echo "make install  apt packages, .venv, the project with [$(EXTRAS)], Kafka's jars, MQTT.js"
	@echo "make compose-up    install what is missing, then start docker/docker-compose.yml and"
	@echo "                   wait for every front-end's /ready (README \"Docker\")"
	@echo "make compose-down  stop and remove the stack's containers (VOLUMES=1: its data too)"
	@echo "make lint     ruff check, ruff format --check, mypy"
	@echo "make docs     render docs/design.md to docs/design.pdf (installs markdown-pdf into .venv)"
	@echo "make clean    remove caches and the .headwater state dir (distclean: also .venv)"

install: system-packages $(INSTALL_STAMP) kafka-jars js-packages

system-packages:
	@export PATH="$$PATH:/usr/local/sbin:/usr/sbin:/sbin"; missing=""; \
	for need in $(APT_NEEDS); do \
		command -v "$${need%%:*}" >/dev/null 2>&1 || missing="$$missing $${need#*:}"; \
	done; \
	if [ -n "$$missing" ]; then \
		echo "apt-get install:$$missing"; \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -q; \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; \
	fi

$(PY):
	@python=""; \
	for candidate in python3 python3.13 python3.12 python3.11; do \
		if command -v "$$candidate" >/dev/null 2>&1 && \
			"$$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then \
			python="$$candidate"; break; \
		fi; \
	done; \
	if [ -z "$$python" ]; then echo "Python 3.11+ is required: install python3.11" >&2; exit 1; fi; \
	if ! "$$python" -m venv $(VENV); then \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv; \
		"$$python" -m venv $(VENV); \
	fi

# setup.py compiles the hot path with mypyc beside its source; an edited source is compiled again
# (a package refuses to import an extension older than its source: mqttcore/compiled.py).
# HEADWATER_COMPILE=0 installs pure Python. The dependencies go in first, pure, with mypy (the
# dev extra): mypyc then types the sources against them, as `make lint`'s mypy does (pip's
# isolated build would see no redis or confluent-kafka).
COMPILED := $(shell grep -o '^ *"[a-z_/]*\.py"' setup.py | tr -d ' "')
$(INSTALL_STAMP): pyproject.toml setup.py $(COMPILED) | $(PY)
	@if [ "$(HEADWATER_COMPILE)" != 0 ] && ! $(PY) -c 'import os, sys, sysconfig; \
		sys.exit(not os.path.exists(sysconfig.get_paths()["include"] + "/Python.h"))'; then \
		echo "apt-get install: python3-dev (Python.h, to compile the hot path)"; \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-dev; \
	fi
	HEADWATER_COMPILE=0 $(PY) -m pip install -q -e '.[$(EXTRAS),dev]'
	@rm -f $(VENV)/.headwater-install*.stamp
	@if [ "$(HEADWATER_COMPILE)" != 0 ]; then \
		echo "$(PY) -m pip install -q --no-deps --no-build-isolation -e .  # compiles the hot path"; \
		$(PY) -m pip install -q --no-deps --no-build-isolation -e .; \
	else \
		echo "pure Python: the compiled modules removed"; \
		find mqttcore router frontend -name '*.so' -delete; \
	fi
	@touch $@

kafka-jars: $(INSTALL_STAMP)
	@$(PY) -m headwater.services.kafka --fetch >/dev/null

# MQTT.js, for the tests that drive a node from Node.js (node and npm come with system-packages).
js-packages: system-packages $(JS_STAMP)

$(JS_STAMP): $(JS_DIR)/package.json $(JS_DIR)/package-lock.json
	cd $(JS_DIR) && npm ci --no-audit --no-fund
	@touch $@

test: install compose-plugin
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/pytest -q

lint: $(INSTALL_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

run: install
	$(VENV)/bin/headwater dev up $(RUN_ARGS)

# markdown-pdf renders with PyMuPDF: no LaTeX, no browser. PyMuPDF 2.x drags in onnxruntime; 1.x does not.
# The figures are Graphviz sources, docs/diagrams/*.dot, drawn to PNG by docs/render.py with dot
# (installed here on first use: the tests do not need it).
DOCS_TOOLS := 'markdown-pdf>=1.13,<2' 'pymupdf>=1.24,<2'

docs: | $(PY)
	@command -v dot >/dev/null 2>&1 || { \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -q; \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q graphviz; }
	@$(PY) -c 'import markdown_pdf, pymupdf' 2>/dev/null || $(PY) -m pip install -q $(DOCS_TOOLS)
	$(PY) docs/render.py docs/design.md docs/design.pdf

bench: install
	$(PY) -m bench all $(BENCH_ARGS)

.PHONY: profile
profile: install
	$(PY) -m bench profile $(PROFILE_ARGS)

clean:
	rm -rf .headwater .mypy_cache .ruff_cache .pytest_cache build *.egg-info
	find mqttcore router frontend -name '*.so' -delete
	rm -f $(VENV)/.headwater-install*.stamp
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)

# Analytics (docs/analytics.md): a Spark job on the log, e.g.
# make analytics ANALYTICS_JOB=top_publishers ANALYTICS_ARGS="--trigger available-now"
ANALYTICS_JOB ?= traffic
ANALYTICS_ARGS ?=
.PHONY: analytics
analytics: $(INSTALL_STAMP)
	$(VENV)/bin/headwater analytics $(ANALYTICS_JOB) $(ANALYTICS_ARGS)

# Containers (README "Docker"): `compose-up` installs what is missing (Debian's docker.io where no
# engine answers, Docker Compose v2 built from its Go module where `docker compose` is missing),
# then headwater/compose.py starts dockerd if needed, builds a Debian base image where no registry
# answers, writes docker/.env once, builds the images and starts the stack, waiting for /ready.
# `compose-down` removes the containers (VOLUMES=1: the volumes too).
COMPOSE_VERSION ?= v2.29.7
COMPOSE_PLUGINS := $(if $(SUDO),$(HOME)/.docker/cli-plugins,/usr/local/lib/docker/cli-plugins)
VOLUMES ?=
.PHONY: compose-up compose-down docker-engine compose-plugin

docker-engine:
	@export PATH="$$PATH:/usr/local/sbin:/usr/sbin:/sbin"; \
	if ! docker info >/dev/null 2>&1 && ! command -v dockerd >/dev/null 2>&1; then \
		echo "apt-get install: docker.io"; \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -q; \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io; \
	fi

compose-plugin: docker-engine
	@export PATH="$$PATH:/usr/local/go/bin"; \
	if ! docker compose version >/dev/null 2>&1; then \
		command -v go >/dev/null 2>&1 || { \
			echo "docker compose (v2) is missing: install Go 1.21+ to build it" >&2; exit 1; }; \
		echo "building Docker Compose $(COMPOSE_VERSION) from its Go module (a few minutes)"; \
		bin=$$(mktemp -d); \
		GOBIN=$$bin go install -ldflags "-s -w -X \
			github.com/docker/compose/v2/internal.Version=$(COMPOSE_VERSION)" \
			github.com/docker/compose/v2/cmd@$(COMPOSE_VERSION); \
		mkdir -p $(COMPOSE_PLUGINS); \
		install -m 755 $$bin/cmd $(COMPOSE_PLUGINS)/docker-compose; \
		rm -rf $$bin; \
	fi

compose-up: $(INSTALL_STAMP) compose-plugin
	$(PY) -m headwater.compose up

compose-down: $(INSTALL_STAMP)
	$(PY) -m headwater.compose down $(if $(VOLUMES),--volumes)
