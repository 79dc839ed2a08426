"""Remote pools: a running vLLM server's KV-cache event stream turned into Cachescope's
own events.
"""
