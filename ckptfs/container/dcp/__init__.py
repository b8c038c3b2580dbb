"""torch.distributed.checkpoint (DCP) directories: ``.metadata`` plus ``__<rank>_<n>.distcp`` files."""

from .checkpoint import DcpCheckpoint, is_dcp_directory
from .metadata import METADATA_FILE

__all__ = ["METADATA_FILE", "DcpCheckpoint", "is_dcp_directory"]
