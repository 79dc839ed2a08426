"""How the kernel's functions are compiled: numba's `njit`, cached on disk when it can be.

Every compiled function of the kernel is in `engine.kernel.loop`, one file, on purpose:
numba keys a cached function on its own file's stamp (modification time and size) and its
own bytecode, not on the functions it calls, so a helper changed in another file would
leave a caller loaded from the cache running the old helper. With one file, any edit to
the kernel's compiled code invalidates all of it, and the next first use compiles again.

`kernel_jit` is `njit(cache=True)` that never fails because of the cache: where numba
finds no writable cache directory (neither beside the source, nor `NUMBA_CACHE_DIR`, nor
the user's cache) the function compiles in memory in each process, and a cache that
cannot be read or written when a function is loaded or saved (a full disk, a directory
removed or made read-only after start) counts as a miss, or is skipped. Both are correct, only slower at first use;
`python -m engine.warmup` (run by `make`'s install step) fills the cache once.
"""

from __future__ import annotations

from typing import Any, Callable

from numba import njit


def kernel_jit(**options: Any) -> Callable[[Callable[..., Any]], Any]:
    """`njit(cache=True, **options)`, falling back to compiling without a cache."""

    def wrap(fn: Callable[..., Any]) -> Any:
        try:
            dispatcher = njit(cache=True, **options)(fn)
        except RuntimeError:  # "cannot cache function ...: no locator available"
            return njit(**options)(fn)
        cache = getattr(dispatcher, "_cache", None)  # numba's FunctionCache (a private attribute)
        load, save = getattr(cache, "load_overload", None), getattr(cache, "save_overload", None)
        if load is not None and save is not None:
            def load_or_compile(sig: Any, target_context: Any) -> Any:
                try:
                    return load(sig, target_context)
                except OSError:
                    return None  # an unreadable cache is a miss: the function compiles

            def save_or_skip(sig: Any, data: Any) -> None:
                try:
                    save(sig, data)
                except OSError:
                    pass  # the compiled function is in memory and correct; only the disk copy is lost

            cache.load_overload = load_or_compile
            cache.save_overload = save_or_skip
        return dispatcher

    return wrap
