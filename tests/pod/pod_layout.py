"""The shared pod's layout (tests/pod/conftest.py builds it; tests that re-form its vPods
import it from here, not from conftest: pytest names every conftest module `conftest`, so
`from conftest import ...` gets whichever directory's conftest was loaded last when
tests/pod and tests/integration are collected by one call)."""

VPOD1 = [0, 2, 4, 6]
VPOD2 = [1, 3, 5, 7]
TIMEOUT_MS = 300
