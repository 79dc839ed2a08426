"""Cachescope's Qt-free core: the paged prefix-cache engine and everything headless.

The bookkeeping modules (hashing, block_pool, manager, events, trace, replay) import
neither torch nor Qt; the model runner, store and semantic cache live beside them.
The names below are imported at their first use, so that importing one module of the
engine (its errors, say) does not import the whole core.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.core.errors import CapacityError, InputError, TraceError
    from engine.core.events import EventBus
    from engine.core.hashing import BlockHasher
    from engine.core.manager import PrefixCacheManager, Request

_HOMES = {
    "BlockHasher": "engine.core.hashing",
    "CapacityError": "engine.core.errors",
    "EventBus": "engine.core.events",
    "InputError": "engine.core.errors",
    "PrefixCacheManager": "engine.core.manager",
    "Request": "engine.core.manager",
    "TraceError": "engine.core.errors",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(home), name)
