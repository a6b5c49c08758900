"""Ingest: schema, exact round trip of what tasks wrote, idempotency, damaged run dirs, readers during rebuilds."""
from __future__ import annotations

import datetime as dt
import json
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from dpx.registry import ingest, query
from registry_fixtures import dp, make_trial


def _snapshot(root: Path) -> dict:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns, p.read_bytes()) for p in root.rglob("*") if p.is_file()}


def _dump(db: Path) -> dict:
    out = {}
    for t in ("trials", "metrics", "curves", "summary", "figures", "paper", "ingest_warnings"):
        cols, rows = query(db, f"SELECT * FROM {t}")
        out[t] = (cols, sorted(rows, key=repr))
    return out


def test_schema_flattened_config_and_timings(tmp_path):
    a = make_trial(tmp_path, "table3", "a", dp(3, layers=2, size="805M"), {"name": "lm", "seq_len": 64},
                   summary={"wikitext_ppl": 20.5})
    b = make_trial(tmp_path, "table3", "b", {"family": "transformer", "num_layers": 2}, {"name": "lm"},
                   train={"lr": 3e-4, "betas": [0.9, 0.95], "schedule": "cosine"})
    db = tmp_path / "r.duckdb"
    stats = ingest(db, [a, b])
    assert stats["trials"] == 2 and stats["summary"] == 1 and not stats["warnings"]
    types = dict(query(db, "SELECT column_name, data_type FROM information_schema.columns "
                           "WHERE table_name = 'trials'")[1])
    assert types["model__num_householder"] == "BIGINT" and types["model__allow_neg_eigval"] == "BOOLEAN"
    assert types["train__lr"] == "DOUBLE" and types["train__betas"] == "VARCHAR" and types["config"] == "JSON"
    cols, rows = query(db, "SELECT trial_id, model__num_householder, train__lr, train__betas, train__schedule, "
                           "model_label, size_label, matching, n_h, config, submitted_at, duration_s, host, device, "
                           "mlflow_run_id FROM trials ORDER BY trial_id")
    ra, rb = (dict(zip(cols, r)) for r in rows)
    assert (ra["model__num_householder"], ra["train__lr"], json.loads(ra["train__betas"])) == (3, 1e-3, [0.9, 0.95])
    assert rb["model__num_householder"] is None and rb["train__schedule"] == "cosine"
    assert (ra["model_label"], ra["size_label"], ra["matching"], ra["n_h"]) == ("DeltaProduct_3", "805M", "head_dim", 3)
    assert rb["model_label"] == "transformer"
    assert json.loads(ra["config"]) == a["config"]
    want = dt.datetime.fromtimestamp(a["submitted_at"], dt.timezone.utc).replace(tzinfo=None)
    assert abs((ra["submitted_at"] - want).total_seconds()) < 1e-3
    assert ra["duration_s"] == pytest.approx(a["ended_at"] - a["started_at"])
    assert (ra["host"], ra["device"], ra["mlflow_run_id"]) == ("testhost", "cpu", "run-a")
    for view in ("table2", "table3", "table4", "table5", "fig4", "fig5", "fig8", "fig9", "recipe_table3"):
        query(db, f"SELECT * FROM {view}")  # every view binds


def test_metrics_curves_summary_round_trip_with_nan(tmp_path):
    rng = random.Random(7)
    scalars = {s: {"loss": rng.random() * 3, "lr": rng.random()} for s in range(50)}
    scalars[13]["loss"] = float("nan")  # a diverged value: null in metrics.jsonl, NULL in DuckDB
    xs = list(range(1, 301))
    ys = [rng.random() for _ in xs]
    ys[5] = float("nan")
    summary = {"max_len_acc90": 17, "token_acc": rng.random(), "nested": {"a": 1.25}, "label": "x"}
    t = make_trial(tmp_path, "fig5", "t", dp(2), {"name": "word_problem", "group": "S3"}, summary=summary,
                   scalars=scalars, curves={"acc_at_pos": (xs, ys)})
    db = tmp_path / "r.duckdb"
    ingest(db, [t])
    _, rows = query(db, "SELECT step, key, value, kind FROM metrics ORDER BY step, key")
    want = sorted((s, k, None if math.isnan(v) else v, "scalar") for s, m in scalars.items() for k, v in m.items())
    assert rows == want
    _, rows = query(db, "SELECT x, y FROM curves WHERE key = 'acc_at_pos' ORDER BY x")
    assert rows == [(float(x), None if math.isnan(y) else y) for x, y in zip(xs, ys)]
    got = dict(query(db, "SELECT key, value FROM summary")[1])
    assert got == {"max_len_acc90": 17.0, "token_acc": summary["token_acc"], "nested/a": 1.25, "label": None}
    assert json.loads(query(db, "SELECT value_json FROM summary WHERE key = 'label'")[1][0][0]) == "x"


def test_ingest_twice_is_identical_and_duplicates_collapse(tmp_path):
    trials = [make_trial(tmp_path, "fig5", f"t{i}", dp(i + 1), {"name": "word_problem", "group": "S3"},
                         summary={"max_len_acc90": 10 * i}, scalars={0: {"loss": 1.0}, 1: {"loss": 0.5}},
                         curves={"acc_at_pos": ([1, 2, 3], [1.0, 0.5, 0.1])}, figure=True) for i in range(3)]
    db = tmp_path / "r.duckdb"
    s1 = ingest(db, trials)
    first = _dump(db)
    s2 = ingest(db, trials + [trials[0]])  # the same trial listed twice
    assert _dump(db) == first
    assert (s1["trials"], s1["metrics"], s1["curves"], s1["figures"]) == (3, 6, 9, 3)
    assert s2["trials"] == 3 and any("listed twice" in w for w in s2["warnings"])
    assert query(db, "SELECT count(*), count(DISTINCT trial_id) FROM trials")[1] == [(3, 3)]


def test_damaged_run_dirs_keep_good_parts_and_delete_nothing(tmp_path):
    ok = make_trial(tmp_path, "r", "ok", dp(1), summary={"score": 1.0}, scalars={0: {"loss": 1.0}})
    trunc = make_trial(tmp_path, "r", "trunc", dp(2), summary={"score": 2.0}, scalars={0: {"loss": 1.0},
                                                                                       1: {"loss": 0.5}})
    with open(Path(trunc["run_dir"]) / "metrics.jsonl", "a") as f:
        f.write('{"key": "loss", "value": 0.2')  # a worker killed mid-line
    nores = make_trial(tmp_path, "r", "nores", dp(3), summary={"score": 3.0}, scalars={0: {"loss": 2.0}})
    os.rename(Path(nores["run_dir"]) / "result.json", Path(nores["run_dir"]) / "result.json.bak")
    garbled = make_trial(tmp_path, "r", "garbled", dp(4), summary={"score": 4.0})
    (Path(garbled["run_dir"]) / "result.json").write_text('{"metrics": {"score": 4')
    failed = make_trial(tmp_path, "r", "failed", dp(1), status="failed", error="CUDA out of memory")
    gone = {**make_trial(tmp_path, "r", "gone", dp(1)), "run_dir": str(tmp_path / "nowhere")}
    before = _snapshot(tmp_path)
    db = tmp_path / "db" / "r.duckdb"
    stats = ingest(db, [ok, trunc, nores, garbled, failed, gone])
    assert _snapshot(tmp_path / "r") == {k: v for k, v in before.items() if "/db/" not in k}
    assert stats["trials"] == 6
    w = "\n".join(stats["warnings"])
    assert "trunc" in w and "1 unreadable line(s) skipped (the last line is truncated" in w
    assert "nores" in w and "result.json: missing" in w
    assert "garbled" in w and "unreadable JSON" in w
    assert "nowhere: run dir missing" in w
    assert dict(query(db, "SELECT trial_id, value FROM summary")[1]) == {"ok": 1.0, "trunc": 2.0}
    assert sorted(query(db, "SELECT trial_id, step, value FROM metrics WHERE trial_id = 'trunc'")[1]) == \
        [("trunc", 0, 1.0), ("trunc", 1, 0.5)]
    assert query(db, "SELECT error FROM trials WHERE trial_id = 'failed'")[1] == [("CUDA out of memory",)]
    assert dict(query(db, "SELECT trial_id, n_warnings FROM trials")[1])["trunc"] == 1
    assert query(db, "SELECT count(*) FROM ingest_warnings")[1][0][0] == len(stats["warnings"])


def test_query_is_read_only_and_missing_db_is_clear(tmp_path):
    db = tmp_path / "r.duckdb"
    with pytest.raises(FileNotFoundError, match="no results database yet"):
        query(db, "SELECT 1")
    ingest(db, [make_trial(tmp_path, "r", "a", dp(1))])
    with pytest.raises(duckdb.Error, match="read-only"):
        query(db, "DELETE FROM trials")
    assert query(db, "SELECT count(*) FROM trials")[1] == [(1,)]


READER = r"""
import sys, time, json
from dpx.registry import query
db, until = sys.argv[1], float(sys.argv[2])
seen, errors = [], []
while time.time() < until:
    try:
        seen.append(query(db, "SELECT count(*) FROM trials JOIN summary USING (trial_id)")[1][0][0])
    except Exception as e:
        errors.append(f"{type(e).__name__}: {e}")
print(json.dumps({"seen": seen, "errors": errors}))
"""


def test_readers_see_whole_databases_while_ingest_rebuilds(tmp_path):
    small = [make_trial(tmp_path, "r", f"s{i}", dp(1), summary={"v": i}) for i in range(3)]
    big = small + [make_trial(tmp_path, "r", f"b{i}", dp(2), summary={"v": i}) for i in range(2)]
    db = tmp_path / "r.duckdb"
    ingest(db, small)
    held = duckdb.connect(str(db), read_only=True)  # a `dpx query` session left open the whole time
    reader = subprocess.Popen([sys.executable, "-c", READER, str(db), str(time.time() + 6)],
                              stdout=subprocess.PIPE, text=True)
    for i in range(6):
        ingest(db, big if i % 2 == 0 else small)
    out = json.loads(reader.communicate(timeout=60)[0])
    assert out["errors"] == [] and len(out["seen"]) > 5
    assert set(out["seen"]) <= {3, 5}  # never a half-built database
    assert held.execute("SELECT count(*) FROM trials").fetchone() == (3,)  # the old file stays consistent
    held.close()
    assert query(db, "SELECT count(*) FROM trials")[1] == [(3,)]
    assert not list(tmp_path.glob(".r.duckdb.*.tmp*"))  # temp files are renamed, not left behind


def _random_leaf(rng: random.Random):
    kind = rng.choice(["int", "float", "bool", "str", "list", "none"])
    return {"int": lambda: rng.randint(-10**12, 10**12), "float": lambda: rng.uniform(-1e6, 1e6),
            "bool": lambda: rng.random() < 0.5, "str": lambda: rng.choice(["a", "b c", "ü", "[0,1]", "1e3"]),
            "list": lambda: [rng.randint(0, 9) for _ in range(rng.randint(0, 3))], "none": lambda: None}[kind]()


def test_flattened_config_columns_round_trip_random_configs(tmp_path):
    rng = random.Random(123)
    names = [f"k{i}" for i in range(8)]
    trials = []
    for i in range(6):
        model = {n: _random_leaf(rng) for n in rng.sample(names, 5)}
        model["sub"] = {"x": _random_leaf(rng), "deep": {"y": _random_leaf(rng)}}
        trials.append(make_trial(tmp_path, "rand", f"t{i}", model, {"name": "debug"}))
    db = tmp_path / "r.duckdb"
    ingest(db, trials)
    types = dict(query(db, "SELECT column_name, data_type FROM information_schema.columns "
                           "WHERE table_name = 'trials'")[1])
    cols, rows = query(db, "SELECT * FROM trials ORDER BY trial_id")
    got = {r[0]: dict(zip(cols, r)) for r in rows}
    checked = 0
    for t in trials:
        flat = {f"model__{k}": v for k, v in t["config"]["model"].items() if k != "sub"}
        flat.update({"model__sub__x": t["config"]["model"]["sub"]["x"],
                     "model__sub__deep__y": t["config"]["model"]["sub"]["deep"]["y"]})
        for col, want in flat.items():
            v = got[t["trial_id"]][col]
            typ = types[col]
            if want is None:
                assert v is None
            elif typ == "VARCHAR":  # mixed types across trials, or strings/lists: text (JSON for non-strings)
                assert v == (want if isinstance(want, str) else json.dumps(want))
            elif typ == "DOUBLE":
                assert v == pytest.approx(float(want), rel=1e-15)
            else:
                assert v == want and type(v) is type(want)
            checked += 1
    assert checked >= 40


def test_recipe_views_survive_name_and_column_collisions(tmp_path):
    a = make_trial(tmp_path, "a-b", "x", dp(1), summary={"seed": 7.0, "Status": 1.0, "score": 2.0})
    b = make_trial(tmp_path, "a_b", "y", dp(2), summary={"score": 3.0})
    db = tmp_path / "r.duckdb"
    stats = ingest(db, [a, b])
    assert stats["recipes"] == ["a-b", "a_b"]
    views_ = dict(query(db, "SELECT recipe, view_name FROM recipes")[1])
    assert views_ == {"a-b": "recipe_a_b", "a_b": "recipe_a_b_2"}
    cols, rows = query(db, "SELECT * FROM recipe_a_b")
    row = dict(zip(cols, rows[0]))
    assert (row["seed"], row["summary__seed"], row["summary__Status"], row["score"]) == (0, 7.0, 1.0, 2.0)
    assert query(db, "SELECT trial_id, score FROM recipe_a_b_2")[1] == [("y", 3.0)]


def test_concurrent_ingests_both_finish_and_leave_a_whole_database(tmp_path):
    import threading

    trials = [make_trial(tmp_path, "r", f"t{i}", dp(1), summary={"v": float(i)}) for i in range(4)]
    db = tmp_path / "r.duckdb"
    errors = []

    def run(ts):
        try:
            ingest(db, ts)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=run, args=(trials[:n],)) for n in (2, 4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    n = query(db, "SELECT count(*) FROM trials")[1][0][0]
    assert n in (2, 4) and query(db, "SELECT count(*) FROM summary")[1][0][0] == n


def test_odd_state_rows_become_nulls_not_crashes(tmp_path):
    t = make_trial(tmp_path, "r", "odd", dp(2), summary={"score": 1.0})
    t["config"]["seed"] = "abc"
    t.update(attempts="x", submitted_at="yesterday", started_at=None, ended_at=None)
    u = {**make_trial(tmp_path, "r", "nocfg", dp(1)), "config": ["not", "a", "mapping"]}
    db = tmp_path / "r.duckdb"
    stats = ingest(db, [t, u])
    assert stats["trials"] == 2 and any("config is not a mapping" in w for w in stats["warnings"])
    rows = dict((r[0], r[1:]) for r in query(db, "SELECT trial_id, seed, attempts, submitted_at, model_label "
                                                 "FROM trials")[1])
    assert rows["odd"] == (None, None, None, "DeltaProduct_2")
    assert rows["nocfg"][3] is None


def test_is_current_tells_when_to_rebuild(tmp_path):
    from dpx.registry import is_current

    db = tmp_path / "r.duckdb"
    assert not is_current(db)
    ingest(db, [make_trial(tmp_path, "r", "a", dp(1))])
    assert is_current(db)
    con = duckdb.connect(str(db))
    con.execute("UPDATE meta SET value = '0' WHERE key = 'schema_version'")  # as an older dpx left it
    con.close()
    assert not is_current(db)
    (tmp_path / "junk.duckdb").write_bytes(b"not a database")
    assert not is_current(tmp_path / "junk.duckdb")


def test_make_trial_writes_the_run_dir_format(tmp_path):
    """The helper (registry_fixtures.py) writes what the real writers write."""
    t = make_trial(tmp_path, "r", "t1", dp(2), summary={"x": 1.5}, scalars={0: {"loss": 2.0}},
                   curves={"acc_at_pos": ([1, 2], [1.0, 0.5])}, figure=True)
    d = Path(t["run_dir"])
    lines = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    assert [(x["key"], x["kind"]) for x in lines] == [("loss", "scalar"), ("acc_at_pos", "curve"),
                                                      ("acc_at_pos", "curve")]
    assert json.loads((d / "result.json").read_text())["metrics"] == {"x": 1.5}
    assert (d / "figures" / "loss_curve.png").stat().st_size > 100
