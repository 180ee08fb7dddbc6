"""Eviction policies: each module defines `key(node) -> tuple`; unreferenced radix leaves
go smallest key first. Nodes carry last_access, hits, created, priority and nid."""
