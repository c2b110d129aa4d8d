import pathlib
import sys

# Test dirs have no __init__.py: make the local helpers importable.
sys.path.insert(0, str(pathlib.Path(__file__).parent))
