"""KV memory: the paged allocator, the page table and the prefix caches. Knows no queues."""
from testbed.core.registry import Registry
from testbed.kv.allocator import OutOfPages, PageAllocator
from testbed.kv.integrity import IntegrityError, check_kv_integrity
from testbed.kv.nocache import NoPrefixCache
from testbed.kv.page_table import PageTable
from testbed.kv.radix import RadixCache, RadixNode

# cache.name -> cls(page_size, eviction_key)
PREFIX_CACHES = Registry("cache.name")
PREFIX_CACHES.register("radix", RadixCache)  # share prefixes
PREFIX_CACHES.register("none", NoPrefixCache)  # share nothing


def make_prefix_cache(name: str, page_size: int, eviction_key):
    return PREFIX_CACHES.get(name).obj(page_size, eviction_key)


__all__ = ["OutOfPages", "PageAllocator", "PageTable", "RadixCache", "RadixNode", "NoPrefixCache",
           "IntegrityError", "check_kv_integrity", "make_prefix_cache", "PREFIX_CACHES"]
