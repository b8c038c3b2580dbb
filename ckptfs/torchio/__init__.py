"""Everything that imports torch: torch tensors, the lazy state_dict, comparison with torch.load."""
