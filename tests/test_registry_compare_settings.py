"""compare() says where our runs' setting differs from the paper's, and `compare fig7` checks the probe's output
against the Figs. 7 / 13 claims."""
from __future__ import annotations

from dpx.registry import compare, ingest, keys
from dpx.registry.comparison import DIFFERS
from registry_fixtures import dp, make_trial


def _fig5_trials(tmp_path, train_len, steps):
    out = []
    for n_h, acc in ((1, 0.0), (2, 0.99)):
        out.append(make_trial(tmp_path, "fig5", f"S3-{n_h}-{train_len}", dp(n_h, hidden_size=128, num_heads=12,
                                                                             head_dim=32),
                              {"name": "word_problem", "group": "S3", "train_len": train_len, "test_len": 512},
                              summary={keys.ACC_AT_TRAIN_LEN: acc, keys.MAX_LEN_ACC90: 200 if acc else 1},
                              train={"steps": steps, "batch_size": 2048}))
    return out


def test_fig5_warns_when_train_length_and_steps_differ(tmp_path):
    db = tmp_path / "r.duckdb"
    ingest(db, _fig5_trials(tmp_path, 16, 300))
    c = compare(db, "fig5")
    s3 = {r[0]: r for r in c.rows}["S3"]
    assert s3[4] == 0  # the delta alone would read as agreement
    status = s3[c.columns.index("status")]
    assert status.startswith(DIFFERS) and "train length 16≠128" in status and "steps 300≠97700" in status
    notes = [n for n in c.notes if n.startswith(DIFFERS)]
    assert any("train length ours 16 (2 trials), paper 128" in n for n in notes)
    assert not any("heads" in n or "hidden" in n or "batch" in n for n in notes)  # those match


def test_fig5_at_the_paper_setting_has_no_warning(tmp_path):
    db = tmp_path / "r.duckdb"
    ingest(db, _fig5_trials(tmp_path, 128, 97700))
    c = compare(db, "fig5")
    assert not any(n.startswith(DIFFERS) for n in c.notes)
    assert {r[0]: r for r in c.rows}["S3"][c.columns.index("status")] == ""


def test_lm_table_steps_are_checked_per_size_row(tmp_path):
    trials = []
    for tid, size, steps in (("a", "213M", 36240), ("b", "392M", 300)):
        trials.append(make_trial(tmp_path, "table3", tid, dp(1, num_layers=24),
                                 {"name": "lm", "size": size, "context_len": 4096, "tokens_per_step": 524288,
                                  "matching": "head_dim"},
                                 summary={keys.AVG_ACC: 0.4}, train={"steps": steps}))
    db = tmp_path / "r.duckdb"
    ingest(db, trials)
    notes = [n for n in compare(db, "table3").notes if n.startswith(DIFFERS)]
    assert len(notes) == 1 and "steps ours 300 (1 trial)" in notes[0] and "392M: 66758" in notes[0]


def _probe_trial(tmp_path, tid, betas_h0, pca_h0, heads=2, n_h=2):
    summary, curves = {}, {}
    rot = 0
    for h in range(heads):
        b = betas_h0 if h == 0 else [0.4] * n_h
        p = pca_h0 if h == 0 else 0.5
        summary[f"probe/l0/h{h}/beta_mean"] = sum(b) / len(b)
        summary[f"probe/l0/h{h}/pca3"] = p
        rot += int(n_h >= 2 and sum(b) / len(b) > 1.5 and p >= 0.95)
        for j in range(n_h):
            curves[f"probe/beta/l0/h{h}/j{j}"] = (list(range(24)), [b[j]] * 23 + [0.0])  # one unseen element
    summary["probe/rotation_heads"] = rot
    summary[keys.ACC_AT_TRAIN_LEN] = 1.0
    return make_trial(tmp_path, "fig5", tid, dp(n_h, num_heads=heads, head_dim=32, hidden_size=128),
                      {"name": "word_problem", "group": "S4", "train_len": 128}, summary=summary, curves=curves,
                      train={"steps": 97700})


def test_fig7_reads_the_probe_and_checks_the_three_claims(tmp_path):
    db = tmp_path / "r.duckdb"
    ingest(db, [_probe_trial(tmp_path, "rot", [1.9, 1.95], 0.97), _probe_trial(tmp_path, "norot", [1.9, 0.3], 0.6)])
    c = compare(db, "fig7")
    rows = {r[0]: dict(zip(c.columns, r)) for r in c.rows}
    rot = rows["rot"]
    assert rot["rotation heads ours"] == 1 and rot["best head"] == "l0/h0"
    assert c.rows[0][c.columns.index("beta per step ours")] in ([1.9, 1.95], [1.9, 0.3])
    assert rot["claims met"] == "two betas near 2, pca3 > 0.95, one head"
    assert rows["norot"]["claims met"] == "none" and rows["norot"]["rotation heads ours"] == 0
    assert any("Only one head of the 12" in n for n in c.notes)
    assert any(n.startswith(DIFFERS) and "heads ours 2 (2 trials), paper 12" in n for n in c.notes)


def test_fig7_without_probe_runs_says_so(tmp_path):
    db = tmp_path / "r.duckdb"
    ingest(db, [])
    c = compare(db, "fig7")
    assert c.rows == [] and c.notes[0].startswith("no run yet")


def test_settings_are_checked_on_the_comparison_s_own_trials_only(tmp_path):
    """A word-problem trial (1 layer) in the same database is no 'layers differ' warning for an LM table."""
    trials = _fig5_trials(tmp_path, 128, 97700)
    trials.append(make_trial(tmp_path, "table3", "lm", dp(1, num_layers=24),
                             {"name": "lm", "size": "392M", "context_len": 4096, "tokens_per_step": 524288},
                             summary={keys.AVG_ACC: 0.4}, train={"steps": 66758}))
    db = tmp_path / "r.duckdb"
    ingest(db, trials)
    for name in ("table3", "fig4", "fig8", "fig9"):
        assert not any(n.startswith(DIFFERS) for n in compare(db, name).notes), name
