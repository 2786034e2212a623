"""Host lists to tensors (device_io): the array.array route gives torch.tensor's tensor, and torch.tensor's errors."""

import gc

import pytest
import torch

from sglpy.runtime.device_io import host_tensor, rows, to_device


@pytest.mark.parametrize("values,dtype", [([1, -2, 2**40], torch.int64), ([3, 4], torch.int32),
                                          ([0.5, -1, 3.25], torch.float32), ([True, False], torch.int64),
                                          ([], torch.int64), ((1, 2), torch.int64), ([1.5, 2.7], torch.int64),
                                          ([1, 2], torch.bool)])
def test_host_tensor_equals_torch_tensor(values, dtype):
    got, want = host_tensor(values, dtype), torch.tensor(values, dtype=dtype)
    assert got.dtype == want.dtype and torch.equal(got, want)
    assert torch.equal(to_device(values, dtype, torch.device("cpu")), want)


def test_host_tensor_keeps_its_buffer_and_raises_like_torch():
    t = host_tensor(list(range(1000)), torch.int64)
    gc.collect()
    assert t.sum().item() == sum(range(1000)) and t.is_contiguous()
    t += 1  # writable
    with pytest.raises((OverflowError, RuntimeError, ValueError)):
        host_tensor([2**70], torch.int64)


def test_rows_slices_a_run_and_gathers_the_rest():
    x = torch.arange(20.0).view(5, 4)
    assert torch.equal(rows(x, [1, 2, 3]), x[1:4]) and rows(x, [1, 2, 3], copy=False).data_ptr() == x[1].data_ptr()
    assert torch.equal(rows(x, [4, 0, 2]), x[[4, 0, 2]])
