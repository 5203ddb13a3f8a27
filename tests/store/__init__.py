"""The store's conformance suite: every operation of :class:`dispatcher.store.interface.Store`
on both dialects, with the same tests and the same expectations."""
