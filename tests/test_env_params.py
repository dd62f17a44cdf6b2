"""Unknown or not-applicable environment values are not logged as the text 'None' or 'True'.

Outside a git checkout the commit is unknown (None): no ``git_commit`` param, no
``mlflow.source.git.commit`` tag, so no commit selector ever matches it. On a machine without
CUDA, TF32 is not in effect whatever ``torch.backends.cudnn.allow_tf32`` says (it defaults to
True): ``tf32`` is None and not logged.
"""

from __future__ import annotations

import json

import pytest
import torch

from parity_tracker.run import run_parity
from parity_tracker.run.environment import torch_flags
from parity_tracker.track import log_run
from parity_tracker.track.store import get_client

SETTINGS = {"target": "tiny", "candidate": "scaled", "quantization": "none"}
UNKNOWN = {"git_commit": None, "git_branch": None, "git_dirty": None, "torch_version": "x",
           "parity_tracker_version": "0.1.0", "num_threads": 2, "deterministic": False,
           "tf32": None}  # fmt: skip


def test_tf32_is_not_applicable_without_cuda(monkeypatch):
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cudnn.allow_tf32 is True  # torch's default: the flag alone would say True
    assert torch_flags()["tf32"] is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # flags read, not devices
    saved = (matmul.allow_tf32, cudnn.allow_tf32)
    try:  # cuBLASModule sets through __setattr__: set and restore by hand
        matmul.allow_tf32, cudnn.allow_tf32 = False, False
        assert torch_flags()["tf32"] is False
        cudnn.allow_tf32 = True
        assert torch_flags()["tf32"] is True
    finally:
        matmul.allow_tf32, cudnn.allow_tf32 = saved


def test_unknown_environment_values_are_left_out_of_params(tiny_pair, sqlite_tracking_uri,
                                                          in_tmp_cwd):  # fmt: skip
    from parity_tracker.errors import InputError
    from parity_tracker.track.query import RunStore

    reference, candidate, inputs = tiny_pair
    result = run_parity(reference, candidate, inputs, settings=SETTINGS, environment=UNKNOWN)
    run_id = log_run(result, tracking_uri=sqlite_tracking_uri, render=None)
    run = get_client(sqlite_tracking_uri).get_run(run_id)
    params, tags = run.data.params, run.data.tags
    for key in ("git_commit", "git_branch", "git_dirty", "tf32"):
        assert key not in params
    assert "None" not in params.values()
    assert (params["num_threads"], params["deterministic"]) == ("2", "False")
    assert "mlflow.source.git.commit" not in tags
    store = RunStore(sqlite_tracking_uri)
    (info,) = store.find(target="tiny")
    assert info.commit is None
    with pytest.raises(InputError, match="no run matching"):
        store.run_for_commit("None", target="tiny")  # the text 'None' is no commit
    # summary.json keeps them as JSON null
    assert json.loads(result.record.to_json())["environment"]["git_commit"] is None


def test_cli_run_outside_git_logs_no_commit_and_tf32_as_in_effect(in_tmp_cwd,
                                                                  sqlite_tracking_uri):  # fmt: skip
    from test_cli import run_json

    res, out = run_json("--tracking-uri", sqlite_tracking_uri)
    assert res.exit_code == 0, res.output
    params = get_client(sqlite_tracking_uri).get_run(out["run_id"]).data.params
    assert "git_commit" not in params and "None" not in params.values()
    # stored without a commit: said on stderr, with the fix (stdout stays the JSON document)
    assert f"run {out['run_id']} records no commit" in res.stderr
    assert "--commit SHA" in res.stderr
    res, out = run_json("--tracking-uri", sqlite_tracking_uri, "--commit", "abc123")
    assert res.exit_code == 0 and "records no commit" not in res.stderr
    if torch.cuda.is_available():
        assert params["tf32"] in ("True", "False")
    else:
        assert "tf32" not in params


def test_history_of_runs_without_commit_says_unknown_never_none(in_tmp_cwd, sqlite_tracking_uri):
    from test_cli import TINY, invoke

    uri = ("--tracking-uri", sqlite_tracking_uri)
    assert invoke("run", TINY, *uri).exit_code == 0  # passes, no commit (tmp_path: no git)
    assert invoke("run", TINY, *uri, perturb=True).exit_code == 1  # fails, no commit
    res = invoke("history", TINY, *uri, "--json")
    out = json.loads(res.stdout)
    assert [p["commit"] for p in out["points"]] == [None, None]  # each run its own point
    assert out["first_bad_commit"] is None and out["newest_failing"] is True
    text = invoke("history", TINY, *uri, terminal_width=200).stdout
    assert "None" not in text and "unknown" in text
    # the newest run fails: never "none (the newest passes)"
    assert "first bad commit: unknown: the newest run fails" in text
    assert "newest passes" not in text
