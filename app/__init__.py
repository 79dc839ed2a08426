"""The Cachescope desktop app and the `cachescope` command line (Qt-free parts live in `engine`)."""


def version() -> str:
    """The installed version (the bundle carries the package metadata too), else pyproject's."""
    from importlib import metadata
    from pathlib import Path

    try:
        return metadata.version("cachescope")
    except metadata.PackageNotFoundError:
        pass
    # A source checkout run without `pip install -e .`: read it where it is defined.
    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    try:
        for line in pyproject.read_text(encoding="utf-8").splitlines():
            if line.startswith("version = "):
                return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return "unknown"
