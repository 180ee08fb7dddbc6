"""KV memory: the paged allocator, the page table and the prefix caches. Knows no queues."""
from testbed.kv.allocator import OutOfPages, PageAllocator
from testbed.kv.integrity import IntegrityError, check_kv_integrity
from testbed.kv.nocache import NoPrefixCache
from testbed.kv.page_table import PageTable
from testbed.kv.radix import RadixCache, RadixNode

CACHE_NAMES = ("radix", "none")


def make_prefix_cache(name: str, page_size: int, eviction_key):
    if name == "radix":
        return RadixCache(page_size, eviction_key)
    if name == "none":
        return NoPrefixCache(page_size)
    raise ValueError(f"unknown cache {name!r}; known: {', '.join(CACHE_NAMES)}")


__all__ = ["OutOfPages", "PageAllocator", "PageTable", "RadixCache", "RadixNode", "NoPrefixCache",
           "IntegrityError", "check_kv_integrity", "make_prefix_cache", "CACHE_NAMES"]
