from kvbudget.cli.main import main

raise SystemExit(main())
