"""The daemon's periodic jobs, each a ``run_once()`` the scheduler in
:mod:`dispatcher.daemon` calls: :mod:`.lease_recovery` (expired leases back to work or to
``unknown``), :mod:`.reconcile` (``unknown`` outcomes asked of the provider),
:mod:`.verifier` (receipts checked against the provider), :mod:`.retention` (the purge,
once per cluster), :mod:`.gauges` (backlog gauges) and :mod:`.replication` (whether a
failover can lose commits); :mod:`.cluster_lock` holds the locks of the jobs that run
once per cluster at a time."""
