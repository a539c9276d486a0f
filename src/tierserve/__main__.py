from tierserve.cli import main

raise SystemExit(main())
