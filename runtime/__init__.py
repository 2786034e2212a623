"""sglpy runtime: engine, scheduler, KV pool, radix cache, models, server."""
