"""The pytest plugin as a user's project sees it (issue 11 item 4): a failing test gets
the daemons' logs in its report; `ualink_pod_session` is one pod for the session; a machine
without what pods need skips, naming each missing capability, and `--ualink-require` (or
UALINK_REQUIRE=1) turns that into a failure."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.pod

USER_TESTS = textwrap.dedent('''
    import pytest

    @pytest.mark.ualink_pod(nodes=2, trace=True)
    def test_fails(ualink_pod):
        assert ualink_pod.node(0).fabric() == {"node1": True}
        assert False, "on purpose"

    def test_session_a(ualink_pod_session):
        assert ualink_pod_session.node(1).fabric() == {"node0": True}

    def test_session_b(ualink_pod_session):
        assert ualink_pod_session.node(0).fabric() == {"node1": True}
''')


def run_user_tests(tmp_path: Path, *args: str, prefix: tuple[str, ...] = ()):
    (tmp_path / "test_user.py").write_text(USER_TESTS)
    return subprocess.run([*prefix, sys.executable, "-m", "pytest", "-q", "-rs",
                           "-p", "no:cacheprovider", "test_user.py", *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)


def test_failure_reports_carry_the_daemon_logs(tmp_path):
    r = run_user_tests(tmp_path)
    assert "1 failed, 2 passed" in r.stdout, r.stdout + r.stderr
    assert "ualinkd node0 log (call)" in r.stdout and "ualinkd node1 log (call)" in r.stdout
    assert "node0: serving" in r.stdout  # the daemon's own lines


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
def test_missing_capabilities_are_named_and_required_fails(tmp_path):
    no_net_admin = ("setpriv", "--bounding-set", "-net_admin")
    r = run_user_tests(tmp_path, prefix=no_net_admin)
    assert "3 skipped" in r.stdout, r.stdout + r.stderr
    assert "missing CAP_NET_ADMIN for network namespaces and veths (in a container: " \
           "--cap-add NET_ADMIN)" in r.stdout
    r = run_user_tests(tmp_path, "--ualink-require", prefix=no_net_admin)
    assert r.returncode != 0 and "3 errors" in r.stdout, r.stdout
    assert "--ualink-require / UALINK_REQUIRE=1: not skipped" in r.stdout
