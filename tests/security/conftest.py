import pathlib
import sys

# Test dirs have no __init__.py: make the local helpers (and tests/node's harness) importable.
HERE = pathlib.Path(__file__).parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "node"))
