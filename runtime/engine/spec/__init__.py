"""Speculative decoding: drafters (NGRAM prompt lookup, STANDALONE draft model and its cost gate) behind the
`Drafter` protocol, the step's draft phase, and the verifier that checks drafts against the target's forward.

drafter.py (the protocol, the draft phase, the configured drafter), ngram.py, draft_model.py, gate.py, probs.py,
verify.py; docs/speculative.md says how it works.
"""
