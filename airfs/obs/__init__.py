"""Observability: latency histograms (:mod:`.histogram`) and the Prometheus exposition of
every component's statistics records (:mod:`.metrics`)."""
