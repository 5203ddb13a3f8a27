"""What the daemon says about itself: Prometheus metrics (:mod:`.metrics`), structured
logs that carry identifiers, never payloads or credentials (:mod:`.logs`), and the HTTP
endpoint serving ``/metrics``, ``/healthz`` and ``/readyz`` (:mod:`.endpoint`)."""
