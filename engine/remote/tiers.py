"""One tier model for every producer: a medium as an engine or connector names it -> its tier.

vLLM says `GPU`, `CPU`, `STORAGE`; SGLang `GPU`, `CPU_PINNED`, `DISK`, `EXTERNAL`; the
Mooncake store connector a lower-case `cpu`; LMCache a torch device string (`cuda:0`).
Cachescope keeps four tiers (GPU, CPU, STORAGE, REMOTE) and the raw name beside them; a
medium it does not know is a tier of its own, named upper-case. No Qt, no sockets.
"""

from __future__ import annotations

GPU, CPU, STORAGE, REMOTE = "GPU", "CPU", "STORAGE", "REMOTE"
TIERS = (GPU, CPU, STORAGE, REMOTE)

# Case-insensitive names (upper-cased here) of each tier; torch device types are read from
# the part before the colon, so `cuda:0` and `xpu:1` are accelerators.
_ALIASES = {
    GPU: ("GPU", "CUDA", "HIP", "ROCM", "XPU", "NPU", "HPU", "MPS", "MTIA", "DEVICE", "HBM"),
    CPU: ("CPU", "CPU_PINNED", "PINNED", "HOST", "DRAM", "LOCAL_CPU"),
    STORAGE: ("STORAGE", "DISK", "LOCAL_DISK", "SSD", "NVME", "FILE", "FS", "GDS"),
    REMOTE: ("EXTERNAL", "REMOTE", "MOONCAKE", "REDIS", "VALKEY", "NIXL"),
}
_TIER_OF = {alias: tier for tier, names in _ALIASES.items() for alias in names}


def tier_of_medium(medium: str | None) -> str:
    """The tier a medium names: vLLM's None is the GPU; `cpu`, `CPU_PINNED` are CPU;
    `DISK`, `STORAGE` storage; `EXTERNAL` a remote pool; `cuda:0` the GPU by its device
    type. Any other name is a tier of its own, upper-case (so `Foo` and `FOO` are one)."""
    if medium is None:
        return GPU
    name = str(medium).strip().upper()
    if not name:
        return GPU
    tier = _TIER_OF.get(name)
    if tier is None and ":" in name:  # a torch device string: type[:index]
        tier = _TIER_OF.get(name.split(":", 1)[0])
    return tier if tier is not None else name


def tier_order(tier: str) -> int:
    """Sort key: GPU, CPU, STORAGE, REMOTE, then other tiers."""
    return TIERS.index(tier) if tier in TIERS else len(TIERS)
