"""Triton kernels, each beside a pure-torch reference (the CPU path and the test oracle)."""
