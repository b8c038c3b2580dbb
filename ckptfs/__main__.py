"""``python -m ckptfs ...``: the same as the ``ckptfs`` command."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
