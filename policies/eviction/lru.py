from testbed.core import NodeView


def key(node: NodeView) -> tuple:
    """Least recently used first."""
    return (node.last_access,)
