"""Caches of finished responses: the semantic cache (embeddings, nearest neighbours,
threshold, risk flags), its evaluation on labelled pairs, and the exact response cache.
"""
