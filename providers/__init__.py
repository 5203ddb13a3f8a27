"""Adapters to the systems that own effects. See docs/providers.md.

Build providers with :func:`providers.registry.build_providers`; the interface is in
:mod:`providers.base`.
"""
