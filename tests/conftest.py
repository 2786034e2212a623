"""Shared test setup. TRITON_INTERPRET must be set before any kernel module imports triton."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
