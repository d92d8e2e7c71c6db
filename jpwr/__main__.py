import sys

from jpwr.cli import main

sys.exit(main())
