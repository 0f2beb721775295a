import sys

from skipsearch.cli import main

sys.exit(main())
