"""`python -m pyrigaud.client ...`: the kit alone, without the server's CLI."""

from pyrigaud.client.kit import main

raise SystemExit(main())
