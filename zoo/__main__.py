from lab.cli import main  # the command line lives in the application layer (lab/)

raise SystemExit(main())
