"""A short selection of the examples for `make demo`: main(backend) runs them and prints the results."""

import time

import batch_progress
import parallel_tips_fork
import quest_json_regex
import tool_use_select
from example_backend import default_backend


def main(backend=None):
    """Run quest JSON, tool use, parallel tips and a small batch on one backend, printing each result."""
    backend = backend or default_backend()
    for title, fn in [("Quest JSON (regex)", quest_json_regex.main), ("Tool use with select", tool_use_select.main),
                      ("Parallel tips with fork", parallel_tips_fork.main),
                      ("Batch with a progress bar", lambda b: batch_progress.main(b, n=4))]:
        print(f"\n=== {title} ===")
        t = time.perf_counter()
        try:
            fn(backend)
        except Exception as e:  # one failing example should not hide the others' results
            print(f"FAILED: {type(e).__name__}: {e}")
        print(f"({time.perf_counter() - t:.1f}s)")


if __name__ == "__main__":
    main()
