"""Plots and the HTML report: moving average against a float64 loop, PNGs, a self-contained report, bad input."""
from __future__ import annotations

import base64
import math
import random
import re
from pathlib import Path

import numpy as np
import pytest

from dpx.registry import NothingToReport, ingest, keys, plots, report
from registry_fixtures import dp, make_trial

PNG = b"\x89PNG\r\n\x1a\n"


def build_demo(root: Path) -> Path:
    """One recipe feeding every figure and Tables 3/5, with a failed trial and a damaged run dir."""
    rng = random.Random(11)
    trials = []
    pos = list(range(1, 97))
    for n_h in (1, 2):
        acc = [max(0.0, 1 - p / (40 * n_h)) for p in pos]
        trials.append(make_trial(root, "demo", f"wp{n_h}", dp(n_h), {"name": "word_problem", "group": "S3",
                                                                       "train_len": 32},
                                 summary={keys.MAX_LEN_ACC90: 4 * n_h, keys.ACC_AT_TRAIN_LEN: acc[31]},
                                 curves={keys.CURVE_ACC_AT_POS: (pos, acc)}, figure=True))
        loss = [2 + 0.01 * max(0, p - 48) / n_h + 0.05 * rng.random() for p in pos]
        erank = {f"{keys.CURVE_ERANK}/l1/h{h}": (pos, [1 + p / (10 * n_h) + h for p in pos]) for h in range(2)}
        trials.append(make_trial(root, "demo", f"lm{n_h}", dp(n_h, size="213M"), {"name": "lm", "seq_len": 48},
                                 summary={keys.TOKENS_PER_S: 1000.0 / n_h, keys.WIKITEXT_PPL: 30 + n_h,
                                          keys.AVG_ACC: 0.4},
                                 curves={f"{keys.CURVE_LOSS_AT_POS}/codeparrot": (pos, loss), **erank},
                                 train={"batch_size": 4}))
    trials.append(make_trial(root, "demo", "bad", dp(3), {"name": "lm"}, status="failed", error="NaN loss at step 7"))
    broken = make_trial(root, "demo", "broken", dp(3), {"name": "lm"}, summary={keys.AVG_ACC: 0.5},
                        scalars={0: {"loss": 1.0}})
    with open(Path(broken["run_dir"]) / "metrics.jsonl", "a") as f:
        f.write('{"key": "lo')
    trials.append(broken)
    trials.append(make_trial(root, "waiting", "p1", dp(2), status="pending"))
    trials.append(make_trial(root, "waiting", "f1", dp(2), status="failed"))
    db = root / "results.duckdb"
    ingest(db, trials)
    return db


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    return build_demo(tmp_path_factory.mktemp("demo"))


def test_moving_average_matches_a_float64_loop():
    rng = np.random.default_rng(0)
    y = rng.normal(size=257)
    y[rng.choice(257, 20, replace=False)] = np.nan
    for w in (1, 5, 64, 501):
        got = plots.moving_average(y, w)
        for i in range(len(y)):
            win = [v for v in y[max(0, i + 1 - w): i + 1] if not math.isnan(v)]
            want = sum(win) / len(win) if win else math.nan
            assert (math.isnan(want) and math.isnan(got[i])) or abs(got[i] - want) < 1e-12


def test_write_plots_makes_real_pngs(tmp_path, demo):
    db = demo
    paths = plots.write_plots(db, tmp_path / "figs", recipe="demo")
    names = sorted(p.name for p in paths)
    assert {"fig4.png", "fig5.png", "fig8.png", "fig9.png", "fig5_table.png", "table3_table.png"} <= set(names)
    for p in paths:
        b = p.read_bytes()
        assert b.startswith(PNG) and len(b) > 3000
    assert plots.write_plots(db, tmp_path / "none", recipe="waiting") == []


def test_other_curves_and_training_curves_are_plotted(tmp_path):
    rng = random.Random(2)
    t = make_trial(tmp_path, "own", "t", dp(2), {"name": "formal_language", "language": "parity"},
                   summary={keys.SCALED_ACC: 0.5}, scalars={s: {"train/loss": rng.random()} for s in range(20)},
                   curves={"acc_vs_len": (list(range(40, 80)), [rng.random() for _ in range(40)])})
    db = tmp_path / "r.duckdb"
    ingest(db, [t])
    names = {p.name for p in plots.write_plots(db, tmp_path / "figs", tables=())}
    assert names == {"curves.png", "training.png"}


def test_report_is_self_contained_with_tables_and_figures(tmp_path, demo):
    db = demo
    out = report(db, "demo", tmp_path / "out" / "demo.html")
    doc = out.read_text()
    for ident in ("cmp-table3", "cmp-fig5", "cmp-fig4", "cmp-fig8", "cmp-fig9", "trials", "failed", "warnings",
                  "plot-fig5", "plot-fig8", "plot-fig9", "plot-fig4"):
        assert f'id="{ident}"' in doc, ident
    imgs = re.findall(r'src="data:image/png;base64,([^"]+)"', doc)
    assert len(imgs) == 4 + 2  # four plots + the two figures the word-problem trials saved
    assert all(base64.b64decode(i).startswith(PNG) for i in imgs)
    assert not re.search(r'(src|href)="(?!data:)', doc)  # nothing loaded from outside the file
    assert "NaN loss at step 7" in doc and "broken" in doc and "last line" in doc
    assert "no run yet" in doc  # paper rows we did not run are listed and marked
    # max_trial_figures (`dpx report --trial-figures N`): the run dirs' figures left out or cut, the plots kept
    bare = report(db, "demo", tmp_path / "out" / "bare.html", max_trial_figures=0).read_text()
    assert len(re.findall(r'src="data:image/png;base64,', bare)) == 4 and "Figures from the run dirs" not in bare
    one = report(db, "demo", tmp_path / "out" / "one.html", max_trial_figures=1).read_text()
    assert len(re.findall(r'src="data:image/png;base64,', one)) == 5 and "1 more not shown" in one


def test_report_without_finished_trials_says_so(tmp_path, demo):
    db = demo
    with pytest.raises(NothingToReport, match=r"'waiting' has no finished trials yet \(1 failed, 1 pending\)"):
        report(db, "waiting", tmp_path / "w.html")
    with pytest.raises(NothingToReport, match=r"'nope' has no trials.*demo, waiting"):
        report(db, "nope", tmp_path / "n.html")
    assert not (tmp_path / "w.html").exists()
