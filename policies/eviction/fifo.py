from testbed.core import NodeView


def key(node: NodeView) -> tuple:
    """Oldest inserted first, however often it was used."""
    return (node.created,)
