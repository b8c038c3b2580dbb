"""The checkpoint model: recorded calls become typed nodes, an index, metadata and tensor byte plans."""
