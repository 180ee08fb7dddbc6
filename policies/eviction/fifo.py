def key(node):
    """Oldest inserted first, however often it was used."""
    return (node.created,)
