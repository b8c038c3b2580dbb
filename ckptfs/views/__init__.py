"""What a checkpoint looks like as files: names (namespace) and the contents of every file."""
