# Developer entry points. Everything runs from the project's own virtualenv (.venv).
#   make test [PYTEST_ARGS="-k stairway -x"]   the whole suite (tests/unit included), TEST_JOBS=3 processes
#   make test-unit                              pure logic, no PostgreSQL: seconds
#   make test-fast                              everything not marked slow, without the browser tests
#                                               (no chaos soak, no schemathesis, no benchmark smoke runs)
#   make test-slow                              the rest: what test-fast leaves out (test-fast + test-slow
#                                               = make test)
#   make test-embedded                          the migrations, the core lifecycle, one Gateway end to end
#                                               and the demo on the embedded PostgreSQL, whatever
#                                               TEST_DATABASE_URL says (the server `make test` uses alone)
#   make mutation                               mutation testing of domain/ against tests/unit (minutes);
#                                               writes docs/mutation-report.md (score, surviving mutants,
#                                               input hashes): commit it with any change to domain/ or tests/unit
#   make openapi / make cli-help                rewrite the committed contract snapshots from the code
#   make lint                                   ruff + mypy + import contracts (lint-imports) + rows
#                                               read by name (scripts/check_row_access.py)
#   make demo                                   the end-to-end demo (embedded PostgreSQL unless DATABASE_URL)
#   make docs                                   the documentation site: mkdocs build --strict into site/
#   make screenshots                            the console's browser tests, writing docs/console/*.png
# Tests use $TEST_DATABASE_URL when set, else an embedded PostgreSQL (.leasehold/test-pgdata).

PYTHON ?= python3
VENV := .venv
VENV_PY := $(VENV)/bin/python
STAMP := $(VENV)/.leasehold-installed
MUTATION_STAMP := $(VENV)/.leasehold-mutation-installed
PYTEST_ARGS ?=
TEST_JOBS ?= 3
MUTATION_JOBS ?= 2
# The tiers are pytest marker expressions: `slow` is set by hand on long modules, `browser` on
# everything under tests/browser (tests/conftest.py).
FAST := not slow and not browser
# TEST_JOBS processes (0: one process); a test module stays in one process, so module-scoped servers
# are started once and its tests run in file order. Modules are handed out in collection order,
# where tests/conftest.py puts the slow ones first (pytest-xdist would otherwise hand out the
# modules with the most tests first, leaving the longest single tests, schemathesis and the chaos
# soak, for the end, one process running them alone).
XDIST := -n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder
# What test-embedded runs: the stairway, the core lifecycle through the service layer, the worker
# API through a real Gateway, and the demo.
EMBEDDED_SLICE := tests/test_migrations.py tests/core/test_transitions.py tests/api/test_worker_api.py \
                  tests/test_demo.py tests/test_infra_database.py

.DEFAULT_GOAL := test
.PHONY: install test test-unit test-fast test-slow test-embedded mutation openapi cli-help lint demo screenshots docs

$(VENV_PY):
	$(PYTHON) -m venv $(VENV)

# Reinstall only when pyproject.toml is newer than the stamp.
$(STAMP): pyproject.toml | $(VENV_PY)
	$(VENV_PY) -m pip install --disable-pip-version-check -q -e '.[server,test,docs]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(VENV_PY) -m pytest $(XDIST) $(PYTEST_ARGS)

# tests/unit/conftest.py refuses any test there that asks for a database (the run stops), so this
# tier can never start or wait for a server.
test-unit: $(STAMP)
	$(VENV_PY) -m pytest tests/unit $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(VENV_PY) -m pytest $(XDIST) -m "$(FAST)" $(PYTEST_ARGS)

test-slow: $(STAMP)
	$(VENV_PY) -m pytest $(XDIST) -m "not ($(FAST))" $(PYTEST_ARGS)

# The path a fresh clone takes (no database configured): the embedded server, whose PostgreSQL
# major may differ from the one TEST_DATABASE_URL points at.
test-embedded: $(STAMP)
	env -u TEST_DATABASE_URL -u DATABASE_URL $(VENV_PY) -m pytest $(XDIST) $(EMBEDDED_SLICE) $(PYTEST_ARGS)

$(MUTATION_STAMP): pyproject.toml | $(STAMP)
	$(VENV_PY) -m pip install --disable-pip-version-check -q -e '.[server,test,mutation]'
	touch $(MUTATION_STAMP)

# Not part of `make test`: every mutant of domain/ (mutmut, configured in pyproject's [tool.mutmut])
# is judged by the unit tier, with hypothesis derandomized so a verdict never depends on luck.
# mutants/ is rebuilt each time (mutmut's cache does not know which mutants new tests may kill),
# starting with the hashes of the run's inputs (domain/, the unit tier, [tool.mutmut]).
# docs/mutation-report.md gets the score, every surviving mutant with its diff and those hashes
# (tests/unit/test_mutation_report.py holds them against the code: commit the report). It fails
# below 95%, when tests/unit/equivalent_mutants.md names a mutant that no longer survives, when
# mutants/leasehold/domain (what the tests import) is not the mutated copy, or when an input
# changed during the run.
mutation: $(MUTATION_STAMP)
	rm -rf mutants
	mkdir mutants
	$(VENV_PY) tests/unit/mutation_report.py --inputs > mutants/inputs.json
	LEASEHOLD_HYPOTHESIS_PROFILE=mutation $(VENV)/bin/mutmut run --max-children $(MUTATION_JOBS)
	$(VENV_PY) tests/unit/mutation_report.py

# The contract snapshots (docs/openapi.json, docs/cli/*.txt) that the snapshot tests compare
# with the code: rewrite them after an intended change of the HTTP API or the CLI, and commit.
openapi: $(STAMP)
	PYTHONPATH=tests $(VENV_PY) -m support.contract openapi

cli-help: $(STAMP)
	PYTHONPATH=tests $(VENV_PY) -m support.contract cli-help

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy -p leasehold
	$(VENV)/bin/lint-imports
	$(VENV_PY) scripts/check_row_access.py

demo: $(STAMP)
	$(VENV)/bin/leasehold demo

# The console's browser tests (headless system Chromium) with a PNG of every page they visit
# written into docs/console/ (the console's page of the docs shows them).
screenshots: $(STAMP)
	LEASEHOLD_CONSOLE_SCREENSHOTS=1 $(VENV_PY) -m pytest tests/browser $(PYTEST_ARGS)

# The documentation site (docs/, mkdocs.yml): --strict fails on a broken link or anchor. The
# reference pages are generated from the code during the build (scripts/docs_hooks.py).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict
