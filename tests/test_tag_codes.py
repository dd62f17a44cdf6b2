"""Per-tag statuses packed into a run's MLflow tags (``track.tag_codes``) and read back."""

from __future__ import annotations

import base64
import hashlib
import json
import random
import zlib
from pathlib import Path

import pytest

from parity_tracker.files.tables import MODULES_SCHEMA, rows_to_table, write_table
from parity_tracker.statuses import CODE_STATUSES, STATUS_CODES, STATUSES
from parity_tracker.track import tag_codes as tc
from parity_tracker.track.records import RunHead


def _table(rows):
    return rows_to_table([{"tag": t, "step": k, "status": s} for t, k, s in rows], MODULES_SCHEMA)


def _blob(codes: str) -> str:
    return base64.b64encode(zlib.compress(codes.encode(), 9)).decode()


def _sha(tags) -> str:
    return hashlib.sha256(json.dumps(tags).encode()).hexdigest()[:32]


def _bind(sha: str, run, codes: str) -> str:
    return hashlib.sha256(json.dumps([sha, run, codes]).encode()).hexdigest()[:32]


ROWS = [("a", 0, "equal"), ("b", 0, "close"), ("a", 1, "mismatch"), ("c", 0, "skipped"),
        ("b", 1, "equal")]  # fmt: skip


def test_every_status_has_one_distinct_code():
    assert set(STATUS_CODES) == set(STATUSES)
    assert len(set(STATUS_CODES.values())) == len(STATUSES)
    assert all(len(c) == 1 and c.isascii() for c in STATUS_CODES.values())
    assert all(CODE_STATUSES[STATUS_CODES[s]] == s for s in STATUSES)


def test_chunks_fit_mlflows_tag_value_limit():
    from mlflow.utils.validation import MAX_TAG_VAL_LENGTH

    assert tc.CHUNK_CHARS <= MAX_TAG_VAL_LENGTH


def test_codes_of_a_hand_written_table():
    # a: equal then mismatch -> mismatch; b: close, equal -> close (first); c: skipped
    assert tc.tag_codes(_table(ROWS)) == (["a", "b", "c"], "x~-")
    tags = tc.encode(_table(ROWS))
    sha = _sha(["a", "b", "c"])
    header = {"v": 2, "sha256": sha, "tags": 3, "chunks": 1, "run": None,
              "bind": _bind(sha, None, "x~-")}  # fmt: skip
    assert tags == {"parity.tag_codes": json.dumps(header, separators=(",", ":")),
                    "parity.tag_codes.0": _blob("x~-")}  # fmt: skip
    got = tc.decode({**tags, "mlflow.user": "x"})
    assert got == tc.TagCodes(_sha(["a", "b", "c"]), "x~-")
    assert [got.status(i) for i in (0, 1, 2, None)] == ["mismatch", "close", "skipped", None]


def test_many_tags_span_several_chunks():
    rng = random.Random(0)
    codes = "".join(rng.choice("=~xsRC-!") for _ in range(40_000))  # ~3 bits a code: no squeeze
    tags = [f"m{i}" for i in range(len(codes))]
    packed = tc.pack(tags, codes)
    blob = _blob(codes)
    n = -(-len(blob) // 6000)
    assert n >= 3
    assert json.loads(packed["parity.tag_codes"]) == {
        "v": 2, "sha256": _sha(tags), "tags": 40_000, "chunks": n, "run": None,
        "bind": _bind(_sha(tags), None, codes)}  # fmt: skip
    assert [packed[f"parity.tag_codes.{k}"] for k in range(n)] == [
        blob[k * 6000 : (k + 1) * 6000] for k in range(n)
    ]
    assert len(packed) == n + 1
    assert tc.decode(packed) == tc.TagCodes(_sha(tags), codes)
    missing = dict(packed)
    del missing["parity.tag_codes.1"]
    assert tc.decode(missing) is None  # never a partial answer


def test_too_many_chunks_are_not_encoded(monkeypatch):
    monkeypatch.setattr(tc, "MAX_CHUNKS", 1)
    rng = random.Random(1)
    codes = "".join(rng.choice("=~xsRC-!") for _ in range(40_000))
    assert tc.pack([f"m{i}" for i in range(40_000)], codes) == {}


@pytest.mark.parametrize(
    "rows",
    [
        [("a", 0, "equal"), ("b", 0, None)],  # null status
        [("a", 0, "equal"), ("b", 0, "nan_mismatch")],  # a status outside the vocabulary
    ],
)
def test_a_status_without_code_leaves_the_run_unencoded(rows):
    assert tc.tag_codes(_table(rows)) is None
    assert tc.encode(_table(rows)) == {}


def _header(**over):  # valid for the codes "x~-" of no run, unless ``over`` changes it
    fields = {"v": 2, "sha256": "0" * 32, "tags": 3, "chunks": 1, "run": None,
              "bind": _bind("0" * 32, None, "x~-")}  # fmt: skip
    return json.dumps({**fields, **over})


def test_the_valid_header_of_the_cases_below_decodes():
    assert tc.decode({"parity.tag_codes": _header(), "parity.tag_codes.0": _blob("x~-")}) == (
        tc.TagCodes("0" * 32, "x~-")
    )


@pytest.mark.parametrize(
    "tags",
    [
        {},  # a run logged before the codes
        {"parity.status": "passed"},
        {"parity.tag_codes": _header()},  # chunk missing
        {"parity.tag_codes": _header(tags=4), "parity.tag_codes.0": _blob("x~-")},  # length
        {"parity.tag_codes": _header(), "parity.tag_codes.0": _blob("x~?")},  # not a code
        {"parity.tag_codes": _header(v=1), "parity.tag_codes.0": _blob("x~-")},  # old format
        {"parity.tag_codes": _header(), "parity.tag_codes.0": _blob("x~=")},  # codes not bound
        {"parity.tag_codes": _header(sha256="1" * 32), "parity.tag_codes.0": _blob("x~-")},
        {"parity.tag_codes": _header(run="r1"), "parity.tag_codes.0": _blob("x~-")},  # binding
        {
            "parity.tag_codes": _header(run="r1", bind=_bind("0" * 32, "r1", "x~-")),
            "parity.tag_codes.0": _blob("x~-"),
            "parity.run_id": "r2",
        },  # another run's codes
        {"parity.tag_codes": _header(chunks=10**9), "parity.tag_codes.0": _blob("x~-")},
        {"parity.tag_codes": _header(tags=float("nan")), "parity.tag_codes.0": _blob("x~-")},
        {"parity.tag_codes": "[1, 2]", "parity.tag_codes.0": _blob("x~-")},
        {"parity.tag_codes": "{", "parity.tag_codes.0": _blob("x~-")},
        {"parity.tag_codes": _header(), "parity.tag_codes.0": "!!!"},  # not base64
        {"parity.tag_codes": _header(), "parity.tag_codes.0": base64.b64encode(b"x~-").decode()},
    ],
)
def test_runs_without_whole_codes_decode_to_none(tags):
    assert tc.decode(tags) is None


# ------------------------------------------------------------------ reading through tag_status


def _run(tmp: Path, name: str, rows, *, codes: bool = True, remote: bool = False) -> RunHead:
    table = _table(rows)
    write_table(table, tmp / name / "tables" / "modules.parquet")
    uri = f"mlflow-artifacts:/exp/{name}/artifacts" if remote else str(tmp / name)
    return RunHead(name, 0, "FINISHED", "c", "fp", {}, uri, False,
                   tc.encode(table) if codes else {})  # fmt: skip


@pytest.fixture
def fetches(tmp_path, monkeypatch):
    """Fake direct GETs of remote modules tables: served from ``tmp_path``, counted."""
    import parity_tracker.track.cache as cache

    monkeypatch.setenv("PARITY_TRACKER_CACHE", str(tmp_path / "cache"))
    calls: list[list[str]] = []

    def fetch(runs, path, uri):
        calls.append([r for r, _ in runs])
        return [tmp_path / r / path for r, _ in runs]

    monkeypatch.setattr(cache, "fetch_files", fetch)
    return calls


def test_remote_runs_answer_from_codes_with_one_table_per_structure(tmp_path, fetches):
    from parity_tracker.track.tag_status import tag_statuses

    same = [("a", 0, "equal"), ("b", 0, "close")]
    heads = [
        _run(tmp_path, "r1", [("a", 0, "equal"), ("b", 0, "mismatch")], remote=True),
        _run(tmp_path, "r2", same, remote=True),
        _run(tmp_path, "r3", [("a", 0, "close"), ("b", 0, "equal")], remote=True),
        _run(tmp_path, "r4", [("b", 0, "skipped")], remote=True),
        _run(tmp_path, "old", [("b", 0, "error")], codes=False, remote=True),
    ]
    assert tag_statuses(heads, "b", "http://server") == (
        ["mismatch", "close", "equal", "skipped", "error"],
        [],
    )
    assert fetches == [["r1", "r4"], ["old"]]  # one table per tag list, then the uncoded run
    fetches.clear()
    assert tag_statuses(heads[:4], "a", "http://server") == (["equal", "equal", "close", None], [])
    assert fetches == []  # tag lists kept by fingerprint
    assert tag_statuses(heads[:4], "z", "http://server") == ([None] * 4, ["b"])
    assert fetches == []


def test_a_kept_tag_list_that_does_not_match_is_read_again(tmp_path, fetches):
    from parity_tracker.track.tag_status import tag_statuses

    head = _run(tmp_path, "r1", [("a", 0, "equal"), ("b", 0, "mismatch")], remote=True)
    sha = tc.decode(head.tag_codes).sha256
    kept = tmp_path / "cache" / "tag_lists" / f"{sha}.json"
    kept.parent.mkdir(parents=True)
    kept.write_text(json.dumps(["b", "a"]))  # same length, another order: must not be trusted
    assert tag_statuses([head], "b", "http://server") == (["mismatch"], [])
    assert fetches == [["r1"]]
    assert json.loads(kept.read_text()) == ["a", "b"]


def test_codes_whose_table_does_not_match_are_not_trusted(tmp_path, fetches):
    from parity_tracker.track.tag_status import tag_statuses

    head = _run(tmp_path, "r1", [("a", 0, "equal"), ("b", 0, "mismatch")])
    # the stored table changed after the codes were written: another tag order
    write_table(_table([("b", 0, "close"), ("a", 0, "equal")]),
                tmp_path / "r1" / "tables" / "modules.parquet")  # fmt: skip
    assert tag_statuses([head], "b", None) == (["close"], [])  # the table's value, scanned
    assert not (tmp_path / "cache").exists()


def test_log_batch_sends_at_most_100_tags_a_call():
    from parity_tracker.track.log import _log_batch

    calls = []

    class Client:
        def log_batch(self, run_id, metrics, params, tags):
            calls.append((len(metrics), len(params), [t.key for t in tags]))

    meta = {"end_time": 1, "metrics": {"m": 1.0},
            "params": {f"p{i}": "v" for i in range(150)},
            "tags": {f"t{i}": "v" for i in range(250)}}  # fmt: skip
    _log_batch(Client(), "rid", meta)
    assert [(m, p, len(t)) for m, p, t in calls] == [(1, 100, 100), (0, 50, 100), (0, 0, 50)]
    assert [k for *_, t in calls for k in t] == [f"t{i}" for i in range(250)]


def test_sqlite_heads_carry_the_same_codes_as_mlflows_search(sqlite_tracking_uri):
    from mlflow.entities import Param, RunTag

    from parity_tracker.track.search import _sqlite_heads, find_run_heads, find_runs
    from parity_tracker.track.store import get_client, get_or_create_experiment, sqlite_path

    client = get_client(sqlite_tracking_uri)
    exp = get_or_create_experiment(client, "parity")
    rng = random.Random(2)
    codes = "".join(rng.choice("=~xsRC-!") for _ in range(40_000))
    packed = tc.pack([f"m{i}" for i in range(40_000)], codes)
    decoys = {"parity.tag_codesx": "1", "parity.tag_codes-": "2", "parity.status": "passed"}
    ids = []
    for tags in (packed, {}):
        rid = client.create_run(exp).info.run_id
        client.log_batch(rid, params=[Param("target", "toy")],
                         tags=[RunTag(k, v) for k, v in {**tags, **decoys}.items()])  # fmt: skip
        ids.append(rid)
    db = sqlite_path(sqlite_tracking_uri)
    fast = {h.run_id: h.tag_codes for h in _sqlite_heads(db, "parity", {"target": "toy"}, None)}
    slow = {r.run_id: tc.code_tags(r.tags) for r in find_runs(tracking_uri=sqlite_tracking_uri)}
    assert fast == slow == {ids[0]: packed, ids[1]: {}}
    heads = find_run_heads(tracking_uri=sqlite_tracking_uri, target="toy")
    assert {h.run_id: tc.decode(h.tag_codes) for h in heads} == {
        ids[0]: tc.TagCodes(tc.tag_list_hash([f"m{i}" for i in range(40_000)]), codes),
        ids[1]: None,
    }
