from testbed.core import NodeView


def key(node: NodeView) -> tuple:
    """Least frequently used (prefix hits) first; ties by least recently used."""
    return (node.hits, node.last_access)
