# Two entry points, both safe on a fresh Debian machine (root or not):
#   make demo   set up, then run the main job on the simulated lab
#   make test   set up, then ruff, ansible-lint, antsibull-docs' docs lint, the docs site, galaxy-importer, the tests
#               and (as root) the molecule scenarios
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
COLL_LINK := .collections/ansible_collections/orbite/qualification
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: setup system venv link demo test lint sanity integration unit molecule compat sanity-and-molecule \
	build-collection publish-venv galaxy-import docs-lint docs-venv docs release bench clean

setup: system venv link

system:
	@bash scripts/setup-system.sh

venv: $(VENV)/.installed

$(VENV)/.installed: requirements-dev.txt meta/ee-requirements.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "Python >= 3.10 is needed for ansible-core >= 2.17")'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	@touch $@

link:
	@mkdir -p $(dir $(COLL_LINK))
	@test -L $(COLL_LINK) || ln -s ../../.. $(COLL_LINK)

demo: setup
	@bash scripts/demo.sh

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ansible-lint --offline -q

# pytest-xdist, one worker per core; tests that start the sim lab share one worker (tests/conftest.py).
unit: setup
	$(BIN)/pytest -q -n auto --durations=25 tests

# Namespaced fake hosts need root (mount/UTS/PID namespaces, sshd); say so rather than fail.
# The scenarios (extensions/molecule/*, one lab each, one after the other): the rail-accounting, restart and
# interruption gates over SSH. Molecule's default ephemeral directory (~/.ansible/tmp/molecule.<hash of
# "extensions">.<scenario>) is the same for every checkout on a machine, and it holds the scenario's lab
# and runs: each checkout gets its own, outside the checkout (the lab refuses to live in the collection).
MOLECULE_SCENARIOS := rail_accounting restart interruption
MOLECULE_TMP ?= $(or $(TMPDIR),/tmp)/orbite-molecule-$(shell printf %s '$(CURDIR)' | cksum | cut -d' ' -f1)
molecule: setup
	@if [ "$$(id -u)" = 0 ]; then \
	  for scenario in $(MOLECULE_SCENARIOS); do \
	    (cd extensions && MOLECULE_EPHEMERAL_DIRECTORY=$(MOLECULE_TMP)/$$scenario \
	      $(CURDIR)/$(BIN)/molecule test -s $$scenario) || exit 1; \
	  done; \
	else \
	  echo "molecule: SKIPPED (needs root for the namespaced fake hosts; run make molecule as root)"; \
	fi

# The oldest supported ansible-core (>= 2.17) runs the gate too, from its own venv.
compat: setup
	@bash scripts/compat.sh

# ansible-test sanity on the built and installed collection (scripts/sanity.sh says what it installs).
sanity: setup
	@bash scripts/sanity.sh

# ansible-test integration targets (tests/integration/targets) on the installed collection.
integration: setup
	@bash scripts/integration.sh

# sanity and molecule side by side (they share nothing: scripts/side_by_side.sh), then the steps that run a lab
# on the fixed loopback addresses one after the other; pytest last, so its summary line closes the output.
test: lint docs-lint docs galaxy-import sanity-and-molecule integration compat unit

sanity-and-molecule: setup
	@bash scripts/side_by_side.sh sanity molecule

build-collection: setup
	$(BIN)/ansible-galaxy collection build --force --output-path build .

# A tool's venv of its own (its requirements apart from .venv's): $(call tool_venv,<venv>) as the recipe of
# <venv>/.installed, whose one prerequisite is the requirements file.
define tool_venv
	@test -x $(1)/bin/python || $(PYTHON) -m venv $(1)
	$(1)/bin/python -m pip install --quiet --upgrade pip
	$(1)/bin/python -m pip install --quiet -r $<
	@touch $@
endef

# The publishing checks' own venv: galaxy-importer brings its own ansible-core, ansible-lint and flake8.
PUBLISH_VENV ?= .venv-publish
export PUBLISH_VENV
publish-venv: $(PUBLISH_VENV)/.installed

$(PUBLISH_VENV)/.installed: scripts/publish-requirements.txt
	$(call tool_venv,$(PUBLISH_VENV))

# galaxy-importer (Galaxy's and Automation Hub's upload check) on that tarball (scripts/galaxy-import.sh): it
# fails on the missing repository URL only, and imports whole once named one (docs/publishing.md).
galaxy-import: build-collection publish-venv
	@bash scripts/galaxy-import.sh

# The plugin and role docs as the docs site renders them (antsibull-docs: markup, references, schemas).
docs-lint: setup publish-venv
	$(PUBLISH_VENV)/bin/antsibull-docs lint-collection-docs --plugin-docs $(COLL_LINK)

# The HTML docs site under build/docs/html (scripts/docs.sh): antsibull-docs' plugin and role pages and the guide
# (docs/*.md), built by Sphinx from its own venv; any warning of the collection's own fails it.
DOCS_VENV ?= .venv-docs
export DOCS_VENV
docs-venv: $(DOCS_VENV)/.installed

$(DOCS_VENV)/.installed: scripts/docs-requirements.txt
	$(call tool_venv,$(DOCS_VENV))

docs: setup docs-venv
	@bash scripts/docs.sh

# The tarball to publish: build/release/<tarball>, naming the collection's public repository (README, "Releasing").
release: build-collection publish-venv
	@test -n "$(REPOSITORY)" || { echo "make release REPOSITORY=<the collection's https:// repository URL>" >&2; exit 2; }
	@bash scripts/galaxy-import.sh "$(REPOSITORY)"

bench: setup
	@for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf build .pytest_cache .ruff_cache .hypothesis
