"""The desktop bundle and its Linux integration: the PyInstaller spec's metadata, the smoke
test's expectations, the desktop entry, MIME types, AppStream metadata, icons,
`make install-desktop`, the first-start conversion dialog and Help > About.

Building the bundle takes minutes, so `make test` does not; with CACHESCOPE_DIST pointing
at a build (`make dist`, then CACHESCOPE_DIST=dist/cachescope) the smoke test runs here too.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from configparser import ConfigParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGING = ROOT / "packaging"
APP_ID = "io.github.cachescope.Cachescope"
DESKTOP = PACKAGING / f"{APP_ID}.desktop"
METAINFO = PACKAGING / f"{APP_ID}.metainfo.xml"
MIME_XML = PACKAGING / f"{APP_ID}.mime.xml"
SMOKE_TEST = PACKAGING / "smoke-test"
EXPECTED = json.loads((PACKAGING / "smoke-expected.json").read_text(encoding="utf-8"))
ICON_SIZES = (16, 32, 48, 64, 128, 256, 512)


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (Debian: apt install "
                    f"{'appstream' if name == 'appstreamcli' else 'desktop-file-utils' if 'desktop' in name else 'shared-mime-info'})")
    return path


def _desktop_entry() -> dict[str, str]:
    parser = ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # keys are case-sensitive in desktop entries
    parser.read(DESKTOP, encoding="utf-8")
    return dict(parser["Desktop Entry"])


# ---------------------------------------------------------------- the built bundle
def test_smoke_test_on_a_built_bundle():
    dist = os.environ.get("CACHESCOPE_DIST")
    if not dist:
        pytest.skip("CACHESCOPE_DIST is not set; build with `make dist` and run with CACHESCOPE_DIST=dist/cachescope")
    proc = subprocess.run([sys.executable, str(SMOKE_TEST), dist], capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, proc.stderr.strip() or proc.stdout


def test_smoke_test_refuses_a_missing_bundle_in_one_line(tmp_path):
    proc = subprocess.run([sys.executable, str(SMOKE_TEST), str(tmp_path / "nothing")], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "make dist" in proc.stderr
    assert os.access(SMOKE_TEST, os.X_OK), "packaging/smoke-test must be executable"


def test_smoke_expectations_match_the_source_tree(capsys):
    """The replay totals the smoke test demands of the bundle are what the source tree gives."""
    from app.cli import main

    replay = EXPECTED["replay"]
    assert main(["replay", str(ROOT / replay["trace"]), *replay["args"]]) == 0
    assert json.loads(capsys.readouterr().out)["totals"] == replay["totals"]


def test_smoke_test_expects_every_panel():
    """The smoke test reads the panel names from app/window/panels.py's source; they must be the registry's."""
    pytest.importorskip("PySide6")
    from importlib.machinery import SourceFileLoader
    from importlib.util import module_from_spec, spec_from_loader

    from app.window.panels import PANELS

    spec = spec_from_loader("smoke_test", SourceFileLoader("smoke_test", str(SMOKE_TEST)))
    smoke = module_from_spec(spec)
    spec.loader.exec_module(smoke)
    assert smoke.expected_panels(EXPECTED["extra_docks"]) == [p.object_name for p in PANELS] + ["demo_guide"]


def test_spec_collects_the_metadata_transformers_checks():
    """transformers reads these versions through importlib.metadata; without them a GGUF fails
    to load in the bundle with "Invalid version: 'N/A'" (issue 14)."""
    hooks = pytest.importorskip("PyInstaller.utils.hooks", reason="PyInstaller is not installed (pip install -e .[packaging])")
    collected = {Path(src).name.split("-")[0].lower().replace("_", "-")
                 for src, _dest in hooks.copy_metadata("cachescope", recursive=True)}
    for dist in ("gguf", "accelerate", "torch", "tokenizers", "safetensors", "huggingface-hub", "transformers",
                 "sentence-transformers", "cachescope"):
        assert dist in collected, f"copy_metadata('cachescope', recursive=True) misses {dist}"
    spec = (PACKAGING / "cachescope.spec").read_text(encoding="utf-8")
    assert 'copy_metadata("cachescope", recursive=True)' in spec


def test_dist_and_build_are_ignored_by_git():
    ignored = (ROOT / ".gitignore").read_text(encoding="utf-8").split()
    assert "dist/" in ignored and "build/" in ignored


# ---------------------------------------------------------------- desktop integration
def test_desktop_entry_validates():
    proc = subprocess.run([_tool("desktop-file-validate"), str(DESKTOP)], capture_output=True, text=True)
    assert proc.returncode == 0 and "error" not in proc.stdout, proc.stdout


def test_metainfo_validates_offline():
    proc = subprocess.run([_tool("appstreamcli"), "validate", "--no-net", str(METAINFO)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_desktop_entry_metainfo_and_mime_types_agree():
    entry = _desktop_entry()
    root = ET.parse(METAINFO).getroot()
    assert root.findtext("id") == APP_ID
    assert root.findtext("launchable") == DESKTOP.name
    assert entry["Icon"] == APP_ID and entry["Exec"].startswith("cachescope ")
    assert len(root.findtext("description/p").split()) > 20
    mime_types = set(filter(None, entry["MimeType"].split(";")))
    ns = {"m": "http://www.freedesktop.org/standards/shared-mime-info"}
    defined = {t.get("type"): [g.get("pattern") for g in t.findall("m:glob", ns)]
               for t in ET.parse(MIME_XML).getroot().findall("m:mime-type", ns)}
    assert "*.cachescope.json" in defined["application/x-cachescope-session"]
    assert set(defined) <= mime_types
    assert {m.text for m in root.findall("provides/mediatype")} <= mime_types
    # Traces (JSONL) and conversations (JSON) open too.
    assert {"application/jsonl", "application/json"} <= mime_types


def test_metainfo_screenshots_are_the_committed_ones():
    images = [img.text for img in ET.parse(METAINFO).getroot().iter("image")]
    assert images, "AppStream metadata needs screenshots"
    for url in images:
        rel = re.sub(r"^https://raw\.githubusercontent\.com/[^/]+/[^/]+/[^/]+/", "", url)
        assert rel.startswith("docs/screenshots/") and (ROOT / rel).is_file(), url


def test_install_desktop_into_a_prefix(tmp_path):
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    dest = tmp_path / "dest"
    env = {**os.environ, "INSTALL_BUNDLE": "no"}
    proc = subprocess.run([make, "-s", "install-desktop", f"DESTDIR={dest}", "PREFIX=/usr"], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    share = dest / "usr" / "share"
    assert (share / "applications" / DESKTOP.name).read_bytes() == DESKTOP.read_bytes()
    assert (share / "metainfo" / METAINFO.name).is_file()
    assert (share / "mime" / "packages" / f"{APP_ID}.xml").is_file()
    for size in ICON_SIZES:
        png = share / "icons" / "hicolor" / f"{size}x{size}" / "apps" / f"{APP_ID}.png"
        head = png.read_bytes()[:24]
        assert head[:8] == b"\x89PNG\r\n\x1a\n"
        assert int.from_bytes(head[16:20], "big") == size, f"{png} is not {size} pixels wide"
    assert (share / "icons" / "hicolor" / "scalable" / "apps" / f"{APP_ID}.svg").is_file()
    assert not (dest / "usr" / "bin").exists(), "INSTALL_BUNDLE=no must not copy the bundle"
    if shutil.which("update-mime-database"):
        subprocess.run(["update-mime-database", str(share / "mime")], check=True, capture_output=True)
        globs = (share / "mime" / "globs2").read_text(encoding="utf-8")
        assert "application/x-cachescope-session:*.cachescope.json" in globs


# ---------------------------------------------------------------- first start and About
@pytest.mark.model
@pytest.mark.slow
def test_cancelling_the_first_start_conversion_leaves_nothing(tmp_path, monkeypatch):
    """Cancel pressed while the tokenizer is read: the load stops before converting weights."""
    from engine.model import loader

    monkeypatch.setenv("CACHESCOPE_CACHE_DIR", str(tmp_path / "cache"))
    assert loader.needs_conversion(None)
    steps = []

    def progress(text: str, fraction: float) -> None:
        steps.append(text)
        if text.startswith("converting"):
            raise loader.LoadCancelled("cancelled")

    with pytest.raises(loader.LoadCancelled):
        loader.load_model(None, progress=progress)
    assert steps[0].startswith("reading the tokenizer")
    models = tmp_path / "cache" / "models"
    assert not list(models.glob("*/model")), "no half-converted model may stay in the cache"
    assert not [p for p in models.rglob(".*") if p.is_dir()], "temporary folders are removed"
    assert loader.needs_conversion(None)


@pytest.mark.model
@pytest.mark.slow
def test_first_start_dialog_shows_progress_and_cancels(qtbot, tmp_path, monkeypatch):
    from app.runtime.context import make_test_context
    from app.window.main_window import MainWindow
    from app.dialogs.model_load_dialog import CANCELLED_MESSAGE

    monkeypatch.setenv("CACHESCOPE_CACHE_DIR", str(tmp_path / "cache"))
    ctx = make_test_context(tmp_path / "settings")
    ctx.suppress_dialogs = False  # the conversion dialog is what this test is about
    errors = []
    monkeypatch.setattr(ctx, "show_error", lambda text, title="Cachescope": errors.append(text))
    window = MainWindow(ctx, load_model=False)
    qtbot.addWidget(window)
    try:
        window.start_model_load()
        dialog = window.model_load.dialog
        assert dialog is not None and dialog.isVisible()
        qtbot.waitUntil(lambda: dialog.bar.value() > 0, timeout=300_000)
        assert "tokenizer" in dialog.step_label.text()
        dialog.cancel()
        assert window.model_load.is_cancel_requested and not dialog.buttons.isEnabled()
        qtbot.waitUntil(lambda: window.model_load.dialog is None, timeout=300_000)
        assert errors == [CANCELLED_MESSAGE]
        assert ctx.runner is None and window.status_labels["model"].text() == "no model"
    finally:
        ctx.shutdown()


def test_about_names_version_model_and_folders_and_clears_the_cache(qtbot, tmp_path, monkeypatch):
    from app.dialogs.about_dialog import AboutDialog
    from app import version
    from app.runtime.context import make_test_context

    cache = tmp_path / "cache"
    (cache / "models" / "m").mkdir(parents=True)
    (cache / "models" / "m" / "w.safetensors").write_bytes(b"\0" * 2048)
    monkeypatch.setenv("CACHESCOPE_CACHE_DIR", str(cache))
    monkeypatch.setenv("CACHESCOPE_DB", str(tmp_path / "data" / "cachescope.db"))
    ctx = make_test_context(tmp_path / "settings")
    try:
        dialog = AboutDialog(ctx)
        qtbot.addWidget(dialog)
        assert dialog.info["version"] == version()
        assert dialog.info["model"] == "SmolLM2-135M-Instruct" and not dialog.info["model_loaded"]
        assert dialog.info["data_dir"] == tmp_path / "data" and dialog.info["cache_dir"] == cache
        assert "2.0 KB" in dialog.cache_label.text() and dialog.clear_button.isEnabled()
        assert dialog.clear_cache(confirm=False)
        assert cache.is_dir() and not any(cache.iterdir())
        assert "(empty)" in dialog.cache_label.text() and not dialog.clear_button.isEnabled()
    finally:
        ctx.shutdown()
