"""Eviction policies: each module defines `key(node: testbed.core.NodeView) -> tuple`;
unreferenced radix leaves go smallest key first (ties in node creation order). A key reads
only a NodeView's members: last_access, hits, created, priority and num_pages."""
