"""The FUSE front end: the adapter (fuse_ops, knows nothing of formats) and the daemon (mount/umount)."""
