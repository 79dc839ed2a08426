"""Cachescope's Qt-free core: the paged prefix-cache engine and everything headless.

The bookkeeping modules (hashing, block_pool, manager, events, trace, replay) import
neither torch nor Qt; the model runner, store and semantic cache live beside them.
"""

from engine.errors import CapacityError, InputError, TraceError
from engine.events import EventBus
from engine.hashing import BlockHasher
from engine.manager import PrefixCacheManager, Request

__all__ = [
    "BlockHasher",
    "CapacityError",
    "EventBus",
    "InputError",
    "PrefixCacheManager",
    "Request",
    "TraceError",
]
