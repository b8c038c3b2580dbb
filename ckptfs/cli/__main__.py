"""``python -m ckptfs.cli``: the ``ckptfs`` command."""

import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
