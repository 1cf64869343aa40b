"""Thin adapters that run saspec inside inference engines, one per engine: ``hf``
(transformers) and ``vllm`` (a package: its configurations, the plugin vLLM loads,
the hybrid, and the custom_class drafter).

Each adapter imports its engine lazily (inside functions or at first use), so
``import saspec`` never loads an engine, and drives a ``SpecEngine`` through its
public lifecycle: ``add_request`` / ``prepare`` / ``extend`` / ``remove_request``.
"""
