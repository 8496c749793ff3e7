"""ggmlpy beyond one process, on Ray (the optional extra): layers on remote actors (docs/distributed.md); the server's replicas behind Ray Serve are llama/server/ray_serve."""
