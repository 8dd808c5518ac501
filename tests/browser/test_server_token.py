"""The JupyterLab the browser tests start answers only to its own run's token: a fresh
random one each time, never a fixed string anyone can read in this repository."""

import re
import urllib.error
import urllib.request

import pytest

from tests.browser import jupyterlab as J


def test_each_server_gets_a_fresh_random_token(tmp_path):
    tokens = {J.fresh_token() for _ in range(20)}
    assert len(tokens) == 20
    assert all(re.fullmatch(r"[0-9a-f]{48}", t) for t in tokens)
    token = tokens.pop()
    cmd = J.server_command(8888, token, tmp_path)
    assert f"--IdentityProvider.token={token}" in cmd


@pytest.mark.slow
def test_the_server_refuses_a_request_without_its_token(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    with J.jupyter_server(tmp_path, home) as (base, token):
        assert re.fullmatch(r"[0-9a-f]{48}", token), token  # a fresh one, not a fixed string
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{base}/api/contents", timeout=10)
        assert refused.value.code == 403
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"{base}/api/contents?token=course-test-token", timeout=10)
        assert J.api(base, token, "/api/contents")["type"] == "directory"
