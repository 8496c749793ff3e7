from ggmlpy.cli import main

raise SystemExit(main())
