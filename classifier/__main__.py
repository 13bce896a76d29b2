"""``python -m classifier train|evaluate ...``: what ``model-optimizer classifier`` runs."""

import sys

from classifier.cli import main

sys.exit(main())
