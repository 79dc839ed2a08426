"""Remote pools: running vLLM and SGLang servers' KV-cache event streams as Cachescope's own events.

The API the app and the CLI build on (no Qt anywhere in this package):

    from engine.remote import AttachOptions, Attachment

    att = Attachment(AttachOptions(("tcp://127.0.0.1:5557",), ("tcp://127.0.0.1:5558",),
                                   data_parallel_size=2),
                     on_batch=lambda pool, batch, events: ...,   # subscriber thread, under att.lock
                     on_health=lambda health: ...,               # StreamHealth copy
                     on_notice=lambda pool, kind, message: ...)  # refilled|missed|malformed|restart|...
    att.events.subscribe(listener)  # Cachescope events: BlockStored / BlockEvicted / CacheReset
    att.start()                     # InputError (one sentence) if an endpoint is bad or busy
    ...
    with att.lock:                  # pools are mutated on subscriber threads
        att.pools[0].num_cached_in("GPU"); att.combined.num_cached
    att.stop()                      # twice is harmless; AttachOptions.to_dict/from_dict for settings

Notice kinds: refilled, missed, malformed, restart (the pool was reset), refill_timeout,
reconnected, joined (a pod's first frame on a bound endpoint: a new pool), error.

Fleets: `AttachOptions(servers=...)` names each endpoint's server; with `bind=True` every
topic `kv@<pod>@<model>` is a stream and pool of its own. `att.fleet()` is an
`engine.remote.fleet.Fleet` (servers -> pools; `locate`, `shared_blocks`, `route` for the
router's view of a probe, `summaries`). Tiers are normalized by `engine.remote.tiers`
(GPU, CPU, STORAGE, REMOTE; the raw medium names in `pool.media`). `att.health()` returns one StreamHealth per stream (batches, refilled,
missed, malformed, restarts, lag_s) at any time; `total_health` sums them for a status bar.

Every converted event carries `remote: RemoteInfo` (engine.core.events): source, rank,
batch_seq and batch_time, medium (tier: GPU, CPU, STORAGE), group_idx,
kv_cache_spec_kind, lora_id, lora_name, extra_keys, locality, session_id, block_size.
`BlockStored.salt` is the cache salt (the tenant). Block ids are -1: vLLM does not publish
them. Hashes are bytes in one canonical form (`wire.canonical_hash`): an integer event
hash is its 8 bytes unsigned (16 hex digits), a digest its 32 bytes (64 hex digits).

`PromptProbe`/`probe_prompt` say how much of a prompt a pool holds and why the rest is missing;
`VllmPublisher`/`EnginePublisher` send our own engine's events in vLLM's wire format.
Modules: wire (frames and msgpack), tiers, pool (the per-rank model), subscriber (one
stream), attachment (many streams), fleet, discovery (SGLang's /server_info, servers
files), probe, publisher. Keeping a capture in the store is
`engine.analysis.remote_capture` (the store sits above this package).
"""

from engine.remote.attachment import AttachOptions, Attachment, StreamSpec
from engine.remote.fleet import Fleet, RouterView, ServerScore, TierWeights, server_of_topic
from engine.remote.pool import CombinedPool, RemoteBlock, RemotePool
from engine.remote.probe import ProbeResult, PromptProbe, probe_prompt, prompt_keys
from engine.remote.publisher import EnginePublisher, VllmPublisher
from engine.remote.subscriber import StreamHealth, VllmSubscriber, check_endpoint, endpoint_for_rank, total_health
from engine.remote.wire import MalformedFrame, VllmBatch, VllmEvent, canonical_hash, decode_batch, encode_batch

__all__ = [
    "AttachOptions", "Attachment", "StreamSpec", "Fleet", "RouterView", "ServerScore", "TierWeights",
    "server_of_topic", "CombinedPool", "RemoteBlock", "RemotePool", "ProbeResult",
    "PromptProbe", "probe_prompt", "prompt_keys", "EnginePublisher", "VllmPublisher", "StreamHealth", "VllmSubscriber", "check_endpoint",
    "endpoint_for_rank", "total_health", "MalformedFrame", "VllmBatch", "VllmEvent", "canonical_hash", "decode_batch",
    "encode_batch",
]
