"""Drive JupyterLab in headless Chromium the way a student does.

A server on loopback with a fresh random token (one per server started) and a throwaway
HOME serves a throwaway copy of the notebooks; Playwright (with Debian's Chromium, never a downloaded browser) opens a
notebook, waits until the kernel is really idle, runs all cells, saves, and hands back
what the page shows.
"""

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ROOT = Path(__file__).resolve().parents[2]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url, seconds=60):
    deadline = time.time() + seconds
    last = None
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.status, r.read()
        except Exception as exc:  # noqa: BLE001 -- still starting
            last = exc
            time.sleep(0.3)
    raise TimeoutError(f"{url} did not answer within {seconds}s (last error: {last})")


def throwaway_env(home):
    """A HOME of its own, with nothing of the user's: what JupyterLab shows here comes from
    the project (``tools/jupyterlab_settings.json``, linked into the environment)."""
    env = dict(os.environ, HOME=str(home), JUPYTER_CONFIG_DIR=str(home / ".jupyter"),
               JUPYTER_DATA_DIR=str(home / ".local/share/jupyter"), JUPYTER_RUNTIME_DIR=str(home / "runtime"),
               IPYTHONDIR=str(home / ".ipython"), PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    # for the test only: render every cell (by default JupyterLab only renders those in
    # view), so that the test sees every prompt and can screenshot any widget
    tracker = home / ".jupyter/lab/user-settings/@jupyterlab/notebook-extension"
    tracker.mkdir(parents=True, exist_ok=True)
    (tracker / "tracker.jupyterlab-settings").write_text('{"windowingMode": "none"}')
    return env


def api(base, token, path):
    """GET a JSON answer of the server's REST API."""
    with urllib.request.urlopen(f"{base}{path}?token={token}", timeout=10) as r:
        return json.loads(r.read())


def fresh_token():
    """A token no other run shares: anything else on this machine that reaches the port
    cannot use the server."""
    return secrets.token_hex(24)


def server_command(port, token, notebook_dir):
    return [str(Path(sys.executable).parent / "jupyter"), "lab", "--no-browser", "--ip=127.0.0.1",
            f"--port={port}", f"--IdentityProvider.token={token}", "--allow-root",
            f"--ServerApp.root_dir={notebook_dir}", "--ServerApp.port_retries=0"]


@contextmanager
def jupyter_server(notebook_dir, home):
    """JupyterLab on 127.0.0.1 with a fresh token; yields the base URL and the token."""
    port, token = free_port(), fresh_token()
    cmd = server_command(port, token, notebook_dir)
    log = open(home / "server.log", "w")
    proc = subprocess.Popen(cmd, env=throwaway_env(home), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/api/status?token={token}")
        yield f"http://127.0.0.1:{port}", token
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


@contextmanager
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        try:
            yield b
        finally:
            b.close()


def copy_notebooks(names, dest):
    for name in names:
        shutil.copy(name, dest / Path(name).name)


def open_notebook(page, base, token, name):
    page.goto(f"{base}/lab/tree/{name}?token={token}&reset", wait_until="domcontentloaded")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    wait_idle(page)


def wait_idle(page, timeout=90_000):
    """The status bar, not the toolbar, says when the kernel is ready (the toolbar's
    indicator can say idle while the status bar still reads 'Initializing')."""
    page.wait_for_function(
        """() => {
            const bar = document.querySelector('#jp-main-statusbar');
            return bar && /Idle/.test(bar.innerText) && !/Initializing|Connecting|Starting/.test(bar.innerText);
        }""", timeout=timeout)


def prompts(page):
    return page.eval_on_selector_all(".jp-CodeCell .jp-InputArea-prompt", "els => els.map(e => e.innerText.trim())")


def is_dirty(page):
    """Whether the open document is marked modified (its tab carries ``jp-mod-dirty``)."""
    return page.evaluate("() => !!document.querySelector('.jp-mod-dirty')")


def run_all(page, timeout=180_000):
    """Run All Cells, retrying once if the first cell did not start; wait for the end."""
    for attempt in range(2):
        page.click(".lm-MenuBar-itemLabel:text-is('Run')", timeout=10_000)
        page.click(".lm-Menu-item:has-text('Run All Cells')", timeout=10_000)
        try:
            page.wait_for_function(
                "() => { const p = document.querySelector('.jp-CodeCell .jp-InputArea-prompt');"
                " return p && p.innerText.trim() !== '[ ]:' && p.innerText.trim() !== ''; }", timeout=15_000)
            break
        except Exception:  # noqa: BLE001 -- the known first-run race; try once more
            if attempt:
                raise
            wait_idle(page)
    page.wait_for_function(
        """() => {
            const ps = [...document.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')].map(e => e.innerText.trim());
            return ps.length && ps.every(t => /^\\[\\d+\\]:$/.test(t));
        }""", timeout=timeout)
    wait_idle(page)


def save(page):
    page.keyboard.press("Control+s")
    page.wait_for_function("() => !document.querySelector('.jp-mod-dirty')", timeout=30_000)
