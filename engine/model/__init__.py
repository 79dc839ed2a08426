"""A real model behind the engine: loading the bundled SmolLM2 (GGUF to safetensors once),
the paged KV pool tensor, the runner that gathers cached blocks into a DynamicCache and
prefills only the suffix, and the KV-memory formula. torch and transformers live here.
"""
