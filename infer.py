from specchat.tui.cli import main

raise SystemExit(main())
