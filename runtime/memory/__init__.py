"""KV memory: the token-slot pool, the radix prefix cache, and the KV manager that owns both."""
