"""Cachescope's Qt-free core: the paged prefix-cache engine and everything headless.

The bookkeeping modules (hashing, block_pool, manager, events, trace, replay) import
neither torch nor Qt; the model runner, store and semantic cache live beside them.
"""

from engine.core.errors import CapacityError, InputError, TraceError
from engine.core.events import EventBus
from engine.core.hashing import BlockHasher
from engine.core.manager import PrefixCacheManager, Request

__all__ = [
    "BlockHasher",
    "CapacityError",
    "EventBus",
    "InputError",
    "PrefixCacheManager",
    "Request",
    "TraceError",
]
