"""`python -m specchat.bench`: the benchmark (see suite.py)."""

from specchat.bench.suite import main

raise SystemExit(main())
