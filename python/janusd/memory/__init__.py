"""janusd.memory: xTensor, the per-device page pool shared by co-located models."""

from janusd.memory.xtensor import (
    DEFAULT_CACHE_HIGH,
    DEFAULT_CACHE_LOW,
    DevicePool,
    KvRegion,
    PoolStats,
    WeightSegment,
    XTensorError,
)

__all__ = [
    "DEFAULT_CACHE_HIGH",
    "DEFAULT_CACHE_LOW",
    "DevicePool",
    "KvRegion",
    "PoolStats",
    "WeightSegment",
    "XTensorError",
]
