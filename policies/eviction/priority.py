def key(node):
    """Lowest priority (the highest of the requests that used the node) first, then LRU."""
    return (node.priority, node.last_access)
