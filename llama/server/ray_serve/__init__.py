"""`ggmlpy serve --ray`: replicas of the server behind one endpoint on Ray Serve
(docs/distributed.md). app.py builds the Serve application (ingress, engines, router);
run.py starts Ray and serves it, and imports no Ray until it runs. The Ray split backend
(layers on remote actors) is the compiler's, in ggmlpy/distributed."""
