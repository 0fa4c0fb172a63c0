"""deployctl's tests."""

import os
import sys

# Bytecode is cached (beside the sources; git ignores __pycache__/) even where the environment
# says not to (PYTHONDONTWRITEBYTECODE): otherwise each xdist worker compiles the tests and
# deployctl again (~3 s of CPU here) and so does each of the hundreds of CLI runs (~0.1 s each).
# Here, the first module of the suite pytest imports, it also covers conftest and its imports.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
