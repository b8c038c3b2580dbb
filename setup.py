"""The one compiled part of ckptfs: ckptfs.model._tablescan (a plain state_dict pickle read as columns).

Everything else is in setup.cfg. The extension is optional: where it cannot be built (no C compiler, no
Python headers) ckptfs installs without it and indexes such pickles by unpickling them (slower, same result).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("ckptfs.model._tablescan", ["ckptfs/model/_tablescan.c"], optional=True,
                  extra_compile_args=["-O2"]),
    ],
)
