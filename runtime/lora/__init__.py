"""LoRA adapters per request: PEFT adapters read and checked (adapter.py), the slot pool and the wrapped projections
(pool.py), the adapters loaded by name and the engine's load / unload / resolve (manager.py)."""
