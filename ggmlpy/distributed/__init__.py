"""ggmlpy beyond one process, on Ray (the optional extra): replicas behind Ray Serve, layers on remote actors (docs/distributed.md)."""
