"""`python -m ualinkd.netns.nodeinit` runs twice at every pod node start (issue 15 item 3,
start-up time): importing the ualinkd.testing and ualinkd.netns packages must not load the
pod supervisor (and with it the config, the manager and the CLI); `from ualinkd.testing
import Pod` still does (the supervisor lives in ualinkd.netns.pod, issue 33 item 4)."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import sys
import ualinkd.testing
import ualinkd.netns
import ualinkd.netns.nodeinit
heavy = [m for m in ("ualinkd.netns.pod", "ualinkd.config", "ualinkd.ualink.manager",
                     "ualinkd.cli.ctl") if m in sys.modules]
assert not heavy, heavy
from ualinkd.testing import Pod, PodError, pod_config
import ualinkd.netns.pod as pod
assert Pod is pod.Pod and PodError is pod.PodError and pod_config is pod.pod_config
try:
    ualinkd.testing.no_such_name
except AttributeError:
    pass
else:
    raise AssertionError("no AttributeError")
print("ok")
"""


def test_testing_package_loads_the_pod_harness_on_first_use() -> None:
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
