from kvbudget.cli import main

raise SystemExit(main())
