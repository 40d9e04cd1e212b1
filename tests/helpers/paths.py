"""Where things are in the checkout, for tests at any depth of the mirrored test tree."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
FIXTURES = TESTS / "fixtures"
COLLECTIONS = REPO / ".collections"
