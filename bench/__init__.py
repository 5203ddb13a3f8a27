"""``make bench``: throughput, latency, backlog cost and scale-out, measured side by side in
one run on this machine and reported as ratios (never as timed test assertions)."""
