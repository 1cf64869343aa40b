"""Thin adapters that run saspec inside inference engines, one module per engine.

Each module imports its engine lazily (inside functions or at first use), so
``import saspec`` never loads an engine, and drives a ``SpecEngine`` through its
public lifecycle: ``add_request`` / ``prepare`` / ``extend`` / ``remove_request``.
"""
