"""Small helpers with no knowledge of federated learning: lazy attributes, quiet imports,
private files, the machine in words, kept buffers."""
