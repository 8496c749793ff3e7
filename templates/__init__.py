"""CUDA C templates (jinja2), installed as the package `ggmlpy.templates`."""
