"""Backend choice shared by the examples: `--url URL` (or $SGLPY_URL) uses a running server, else in-process."""

import os
import sys

import sglpy as sgl


def default_backend():
    """RuntimeEndpoint for --url/$SGLPY_URL, otherwise the in-process engine on the default model."""
    url = os.environ.get("SGLPY_URL")
    if "--url" in sys.argv:
        url = sys.argv[sys.argv.index("--url") + 1]
    return sgl.RuntimeEndpoint(url) if url else sgl.Engine()
