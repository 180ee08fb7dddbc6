from testbed.core import NodeView


def key(node: NodeView) -> tuple:
    """Lowest priority (the highest of the requests that used the node) first, then LRU."""
    return (node.priority, node.last_access)
