def key(node):
    """Least recently used first."""
    return (node.last_access,)
