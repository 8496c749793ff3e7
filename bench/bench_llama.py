"""pp512 / tg128 / start-up / RSS for a model, as JSON (same as `ggmlpy bench`).

Usage: python bench/bench_llama.py [-m MODEL] [-t THREADS] [--backend NAME]
"""
from ggmlpy.cli.bench_run import main

raise SystemExit(main())
