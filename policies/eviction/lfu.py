def key(node):
    """Least frequently used (prefix hits) first; ties by least recently used."""
    return (node.hits, node.last_access)
