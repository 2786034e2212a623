"""`python -m sglpy.runtime.server`: run the HTTP server."""

import sys

from .app import main

sys.exit(main())
