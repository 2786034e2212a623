"""Llama-family model implementations reading/writing the token KV pool."""
