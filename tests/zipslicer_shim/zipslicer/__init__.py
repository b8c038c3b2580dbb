"""A stand-in for the `zipslicer` package that is ckptfs: lets zipslicer's own test suite run against
ckptfs.load (see tests/test_zipslicer_suite.py). Only the names that suite uses."""

import torch

import ckptfs

load = ckptfs.load

# zipslicer's public table of the dtypes it supports (its tests iterate over it)
dtype_sizes = {
    torch.float64: 8, torch.float32: 4, torch.bfloat16: 2, torch.float16: 2, torch.int64: 8, torch.int32: 4,
    torch.int16: 2, torch.uint8: 1, torch.int8: 1, torch.bool: 1,
}
