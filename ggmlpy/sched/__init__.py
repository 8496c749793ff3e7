"""Backends, the scheduler, placement, the compiled-graph cache and the numpy reference backend."""
