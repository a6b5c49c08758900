"""The report shows what the recipe feeds and reads well: a state-tracking recipe gets the Fig. 5 table and plot
(no throughput or LM panels), two seeds that disagree are drawn per seed with a mean ± sd band (not one curve at
0.5), settings that differ from the paper's are noted, one notation for β, tables that wrap, legible legends."""
from __future__ import annotations

import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.collections import PolyCollection  # noqa: E402

from dpx.registry import ingest, keys, plots, report  # noqa: E402
from registry_fixtures import dp, make_trial  # noqa: E402


def _state_tracking_db(root):
    pos = list(range(1, 65))
    learned = [1.0 if p <= 40 else 0.5 for p in pos]
    failed = [0.0 for _ in pos]
    trials = []
    for seed, acc in ((0, learned), (1, failed)):
        trials.append(make_trial(root, "st", f"nh2s{seed}", dp(2), {"name": "word_problem", "group": "S3",
                                                                    "train_len": 24, "test_len": 64},
                                 summary={keys.MAX_LEN_ACC90: 40 * (1 - seed), keys.ACC_AT_TRAIN_LEN: acc[23]},
                                 curves={keys.CURVE_ACC_AT_POS: (pos, acc)}, seed=seed))
    db = root / "results.duckdb"
    ingest(db, trials)
    return db


def test_state_tracking_report_has_only_its_panels_and_notes(tmp_path):
    db = _state_tracking_db(tmp_path)
    doc = report(db, "st", tmp_path / "st.html").read_text()
    assert 'id="cmp-fig5"' in doc and 'id="plot-fig5"' in doc
    for other in ("cmp-fig4", "cmp-fig8", "cmp-fig9", "cmp-table2", "cmp-table3", "plot-fig4"):
        assert f'id="{other}"' not in doc, other
    note = re.search(r'<p class="differs" id="differs-fig5">(.*?)</p>', doc).group(1)
    assert "train_len 24 (paper: 128)" in note and "test_len 64 (paper: 512)" in note
    assert "[-1,1]" not in note  # β's notation, the same as in the plots' legends
    assert "overflow-wrap:anywhere" in doc and '<div class="wrap"><table id="trials"' in doc


def test_disagreeing_seeds_are_drawn_with_a_band_not_averaged_away():
    fig, ax = plt.subplots()
    items = [{"xs": [1, 2, 3], "ys": [1.0, 1.0, 1.0]}, {"xs": [1, 2, 3], "ys": [0.0, 0.0, 0.0]}]
    plots.seed_lines(ax, items, "1L n_h=2 β∈[0,2]")
    lines = ax.get_lines()
    assert len(lines) == 3  # the mean and each seed
    assert lines[0].get_label() == "1L n_h=2 β∈[0,2] (mean ± sd, 2 seeds)"
    assert sorted(tuple(line.get_ydata()) for line in lines[1:]) == [(0.0, 0.0, 0.0), (1.0, 1.0, 1.0)]
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(bands) == 1
    ys = bands[0].get_paths()[0].vertices[:, 1]
    assert min(ys) == 0.0 and max(ys) == 1.0  # mean 0.5 ± sd 0.5
    plt.close(fig)
    fig, ax = plt.subplots()
    plots.seed_lines(ax, items[:1], "one seed")
    assert len(ax.get_lines()) == 1 and not ax.collections
    plt.close(fig)
    assert plots.beta_label("[-1,1]") == "β∈[0,2]" and plots.beta_label("[0,1]") == "β∈[0,1]"
    assert plots.LEGEND >= 9
