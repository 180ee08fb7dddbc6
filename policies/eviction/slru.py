from testbed.core import NodeView

PROTECT_AFTER_HITS = 2


def key(node: NodeView) -> tuple:
    """Segmented LRU: nodes hit at least twice are protected; the probationary segment
    goes first, each segment in LRU order."""
    return (node.hits >= PROTECT_AFTER_HITS, node.last_access)
