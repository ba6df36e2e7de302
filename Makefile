# The commands CI runs (.ci/run calls `make test`). Everything installs into ./.venv.
PY        ?= python3
VENV      ?= .venv
BIN       := $(VENV)/bin
TORCH     ?= torch==2.13.0
PG_URL    ?= postgresql+psycopg://postgres@127.0.0.1:5432/test
REDIS_URL ?= redis://127.0.0.1:6379/0
PYTEST    := OMP_NUM_THREADS=1 $(BIN)/pytest -q -p no:cacheprovider
# The documentation site (mkdocs.yml, docs/): strict, so a broken link, anchor or nav entry is an error.
MKDOCS    := NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs

.PHONY: install run demo docs docs-build test lint test-embedded test-pg test-labelstudio bench-smoke datasets clean

$(BIN)/bait: pyproject.toml
	$(PY) -m venv $(VENV)
	# torch first, pinned: a bare `torch` requirement would pull several GB of CUDA packages.
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e '.[dev,text]'
	touch $(BIN)/bait

install: $(BIN)/bait  ## create .venv with torch==2.13.0 and the project

run: install  ## embedded defaults: SQLite under ./data, in-process runner, CPU, 127.0.0.1:8000
	$(BIN)/bait serve --migrate

demo: install  ## the whole loop on scikit-learn's digits against the service `make run` started (BAIT_API_KEY=...)
	$(BIN)/bait demo

docs: install  ## the documentation site at http://127.0.0.1:8001, rebuilt on every edit (offline)
	$(MKDOCS) serve -a 127.0.0.1:8001

docs-build: install  ## build the site strictly into ./site (git-ignored): what `make lint` and CI run
	$(MKDOCS) build --strict --clean --site-dir site

lint: install docs-build
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	cd client && ../$(BIN)/mypy  # the client package, type-checked on its own
	$(BIN)/lint-imports

test-embedded: install  ## the whole suite on SQLite + the in-process runner
	$(PYTEST)

test-pg: install  ## the whole suite on PostgreSQL + Redis + real RQ workers (services must be up)
	BAIT_TEST_DATABASE_URL=$(PG_URL) BAIT_TEST_REDIS_URL=$(REDIS_URL) $(PYTEST)

test-labelstudio: install  ## end to end against a real Label Studio 1.23.2 (its own venv, cached in .labelstudio-venv)
	scripts/labelstudio_env.sh
	$(PYTEST) -m labelstudio -s tests/labelstudio

test: lint test-embedded test-pg  ## everything CI runs

datasets: install  ## the offline benchmark suite into $${BAIT_DATASETS_DIR:-~/.cache/bait-datasets} (apt-get download; a few minutes)
	$(BIN)/python -m bench.suite fetch

bench-smoke: install
	$(BIN)/python bench/selection_speed.py --smoke

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache site
