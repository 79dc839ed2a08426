"""What-if analyses over requests: replaying conversations on the real model, block-size
and capacity sweeps, token diffs of two requests, and hosted prompt-caching bills.
"""
