"""The planner's command line refuses what it cannot use: each bad value in one line on
stderr, nothing on stdout and exit status 2, never a traceback or another value blamed;
a plan whose step would take more than a day is a problem (exit 1); clusters past what
the search ranks in seconds are refused with the limit named; ``--version`` and the
version in ``--json``."""

import json
import subprocess
import sys
import time

import pytest

from emulator import __version__
from emulator.planner import cluster_preset, model_preset, search
from emulator.planner.__main__ import MAX_SEARCH_GPUS, main

BASE = {"--gpus": "64", "--gpus-per-node": "8", "--model": "llama3-70b", "--seq": "4096", "--batch-tokens": "2M"}


def cli(capsys, **changes):
    """Run the command line with BASE's flags changed (None drops one): (status, stdout, stderr)."""
    flags = {**BASE, **{"--" + k.rstrip("_").replace("_", "-"): v for k, v in changes.items()}}
    argv = [a for k, v in flags.items() if v is not None for a in ([k] if v is True else [k, str(v)])]
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse's own errors
        rc = exc.code
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("flag, value, says", [
    ("gpus_per_node", "0", "--gpus-per-node: '0': must be at least 1"),
    ("gpus_per_node", "-8", "--gpus-per-node: '-8': must be at least 1"),
    ("gpus_per_node", "eight", "--gpus-per-node: 'eight' is not a whole number"),
    ("batch_tokens", "infM", "--batch-tokens: 'infM' is not a size"),
    ("batch_tokens", "nanK", "--batch-tokens: 'nanK' is not a size"),
    ("batch_tokens", "1e999", "--batch-tokens: '1e999' is not a size"),
    ("batch_tokens", "0.3K", "--batch-tokens: '0.3K' is not a size"),
    ("batch_tokens", "0", "--batch-tokens: '0': must be at least 1"),
    ("batch_tokens", "1000", "--batch-tokens (1,000) must be a whole number of --seq (4,096) token sequences"),
    ("batch_tokens", "6000", "--batch-tokens (6,000) must be a whole number of --seq (4,096) token sequences"),
    ("seq", "0", "--seq: '0': must be at least 1"),
    ("gpus", "-64", "--gpus: '-64': must be at least 1"),
    ("gpus", "60", "--gpus (60) must be a multiple of --gpus-per-node (8)"),
    ("top", "0", "--top: '0': must be at least 1"),
    ("top", "-1", "--top: '-1': must be at least 1"),
    ("rejected", "-2", "--rejected: '-2': a count of at least 0, or -1 for all"),
    ("model", "n_layers=4,d_model=64", "--model: missing n_heads, d_ff, vocab; a ModelSpec needs n_layers, d_model, "
                                       "n_heads, d_ff, vocab"),
    ("model", "n_layers=4,d_model=64,n_heads=4,d_ff=256,vocab=x", "vocab='x' must be a positive int"),
    ("model", "llama9", "no preset 'llama9'"),
    ("cluster", "tpu", "no preset 'tpu'"),
    ("dims", "dp=0", "dp=0"),
])
def test_a_value_it_cannot_use_is_refused_in_one_line(capsys, flag, value, says):
    rc, out, err = cli(capsys, **{flag: value})
    assert rc == 2 and out == "", (rc, out)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("python -m emulator.planner: ") and says in lines[0], lines[0]
    if flag == "batch_tokens":
        assert "micro" not in lines[0]  # the batch is what was wrong, not a value derived from it


def test_a_step_longer_than_a_day_is_a_problem(capsys):
    rc, out, _ = cli(capsys, batch_tokens="1000000G", top="2", rejected="0")
    assert rc == 1 and "problem: one step would take" in out and "more than a day" not in out.split("problem:")[0]
    assert "lower --batch-tokens or add GPUs" in out
    rc, out, _ = cli(capsys, batch_tokens="1000000G", top="2", json=True)
    data = json.loads(out)
    assert rc == 1 and data["ranked"] and data["problems"][0].startswith("one step would take")
    plan = "dp=4,tp=8,pp=2,zero_stage=1,sequence_parallel=true,micro_batches=128,recompute=selective"
    rc, out, _ = cli(capsys, batch_tokens="1000000G", dims=plan, json=True)
    data = json.loads(out)
    assert rc == 1 and not data["valid"] and any(p.startswith("one step would take") for p in data["problems"])
    rc, out, _ = cli(capsys, dims=plan)  # an ordinary batch: a step of seconds, no such problem
    assert rc == 0 and "one step would take" not in out


def test_a_cluster_too_large_to_search_is_refused_at_once_with_the_limit(capsys):
    t0 = time.perf_counter()
    rc, out, err = cli(capsys, gpus="1G")
    assert time.perf_counter() - t0 < 5
    assert rc == 2 and out == "" and f"up to {MAX_SEARCH_GPUS:,} GPUs" in err and "--dims" in err
    assert cli(capsys, gpus=str(MAX_SEARCH_GPUS + 8))[0] == 2


def test_the_search_ranks_a_cluster_at_the_limit_in_seconds():
    m, c = model_preset("llama3-405b"), cluster_preset("h100", nodes=MAX_SEARCH_GPUS // 8)
    t0 = time.process_time()
    ranked = search(m, c, 8192, 2**30, top=10)
    took = time.process_time() - t0
    assert ranked and took < 20, f"ranking {MAX_SEARCH_GPUS:,} GPUs took {took:.1f} s of CPU"


def test_version_and_json_carry_the_version(capsys):
    rc, out, _ = cli(capsys, version=True)
    assert rc == 0 and out.strip() == f"python -m emulator.planner {__version__}"
    rc, out, _ = cli(capsys, json=True, top="1")
    assert rc == 0 and json.loads(out)["version"] == __version__
    rc, out, _ = cli(capsys, json=True, dims="dp=8,tp=8,micro_batches=8")
    assert json.loads(out)["version"] == __version__


def test_as_a_module_the_exit_status_is_the_commands():
    run = subprocess.run([sys.executable, "-m", "emulator.planner", "--gpus", "64", "--gpus-per-node", "0", "--model",
                          "llama3-70b", "--seq", "4096", "--batch-tokens", "2M"], capture_output=True, text=True)
    assert run.returncode == 2 and run.stdout == "" and len(run.stderr.strip().splitlines()) == 1, run.stderr
