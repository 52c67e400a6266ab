from specchat.entry import main

raise SystemExit(main())
