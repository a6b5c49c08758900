"""benchmarks/autotune_wins.py: the autotune picks of the committed check rows, counted per kernel and dtype."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import autotune_wins  # noqa: E402


def test_config_names_are_shortened():
    assert autotune_wins.short("BV: 64, num_warps: 4, num_ctas: 1, num_stages: 3, maxnreg: None") == "BV=64 w=4 s=3"
    assert autotune_wins.short("num_warps: 8, num_ctas: 1, num_stages: 2, maxnreg: None") == "w=8 s=2"


def test_picks_are_counted_once_per_case_per_file_and_by_sha(tmp_path):
    row = lambda i, sha, cfg: json.dumps({"id": i, "dtype": "bfloat16", "kernels_sha": sha,  # noqa: E731
                                          "configs": {"k": f"num_warps: {cfg}, num_stages: 1"}})
    f = tmp_path / "gpu_check_x_rows.jsonl"
    f.write_text("\n".join([row("a", "s1", 4), row("a", "s1", 8), row("b", "s1", 8), row("c", "s2", 4)]) + "\n")
    w = autotune_wins.wins([f], "s1")
    assert dict(w["k"]["bfloat16"]) == {"w=8 s=1": 2}  # a's last line wins; c is another sha
    assert sum(autotune_wins.wins([f], None)["k"]["bfloat16"].values()) == 3


def test_the_committed_rows_give_a_table():
    assert autotune_wins.main([]) == 0


def test_cover_keeps_the_fewest_configs_within_the_limit_and_ignores_noise():
    cases = [("a", {"x": 1.00, "y": 1.02, "z": 2.0}),   # y is within 3 % of x
             ("b", {"x": 1.50, "y": 1.00, "z": 1.01}),   # x is not within 3 % here
             ("c", {"x": 1.00, "y": None, "z": 1.00}),   # y failed to run: x or z
             ("d", {"x": 0.001, "y": 0.009, "z": 0.002})]  # best under min_ms: a launch-bound case, not counted
    r = autotune_wins.cover(cases, 0.03, 0.01)
    # each config covers two of a, b, c: ties go to the smaller summed time (a failed run counts as huge)
    assert r["timed"] == 3 and r["kept"] == ["x", "z"] and r["worst"] <= 1.03
    assert autotune_wins.cover(cases, 0.6, 0.01)["kept"] == ["x"]  # x is within 1.6x everywhere, and it is cheapest
    text = autotune_wins.regret_markdown({("k", "bfloat16"): cases}, 0.03, 0.01, None)
    assert "| k | bfloat16 | 4 (3) | 3 |" in text


def test_the_committed_rows_give_a_regret_table():
    assert autotune_wins.main(["--regret", "0.03"]) == 0


def _case(i, dtype, k, ms, kernel="k"):
    return json.dumps({"id": i, "dtype": dtype, "K": k, "kernels_sha": "s",
                       "config_ms": {kernel: {f"BV: {bv}, num_warps: {w}, num_stages: {s}": t
                                              for (bv, w, s), t in ms.items()}}})


def test_spaces_are_cut_per_head_dim_bucket_and_need_enough_timed_cases(tmp_path):
    assert [autotune_wins.bucket(k) for k in (16, 32, 33, 64, 85, 128, 200)] == [32, 32, 64, 64, 128, 128, 256]
    fast4, fast8 = {(64, 4, 2): 1.0, (64, 8, 2): 1.5}, {(64, 4, 2): 1.5, (64, 8, 2): 1.0}
    f = tmp_path / "gpu_check_x_rows.jsonl"
    f.write_text("\n".join([_case("a", "bfloat16", 32, fast4), _case("b", "float16", 32, fast4),
                            _case("c", "bfloat16", 85, fast8), _case("d", "bfloat16", 128, fast8),
                            _case("e", "float32", 128, fast8)]) + "\n")  # float32 at 128: one case only
    sp = autotune_wins.spaces([f], None, (), 0.03, 0.01)
    assert sp == {"k": {"16bit": {32: {(64, 4, 2)}, 128: {(64, 8, 2)}}}}  # fp32@128 keeps its whole space
    assert autotune_wins.spaces([f], None, (), 0.03, 0.01, min_cases=1)["k"]["fp32"] == {128: {(64, 8, 2)}}
    # the printed block is Python that gives the same table back, and --write replaces only that block
    text = autotune_wins.spaces_python(sp, 0.03)
    ns: dict = {}
    exec(text, ns)
    assert ns["SPACES"] == sp
    target = tmp_path / "autotune_spaces.py"
    target.write_text(f"head = 1\n{autotune_wins.BEGIN}\nSPACES = {{}}\n{autotune_wins.END}\ntail = 2\n")
    autotune_wins.write_spaces(target, text)
    ns = {}
    exec(target.read_text(), ns)
    assert ns["SPACES"] == sp and ns["head"] == 1 and ns["tail"] == 2
    autotune_wins.write_spaces(target, text)  # again: still one block
    assert target.read_text().count(autotune_wins.BEGIN) == 1
    target.write_text("SPACES = {}\n")
    import pytest
    with pytest.raises(SystemExit, match="no '# BEGIN SPACES"):
        autotune_wins.write_spaces(target, text)


def test_a_launch_where_no_kept_config_fits_keeps_the_cheapest_that_does(tmp_path):
    # the cover keeps (64, 8, 2) at 16-bit d 128; one launch of that bucket (n_h 2, say) cannot fit it, and of the
    # two that fit there (64, 4, 2) costs less over the timed cases than (64, 4, 3)
    ms = {(64, 8, 2): 1.0, (64, 4, 2): 1.2, (64, 4, 3): 1.5}
    f = tmp_path / "gpu_check_x_rows.jsonl"
    f.write_text("\n".join([_case("a", "bfloat16", 128, ms), _case("b", "bfloat16", 85, ms)]) + "\n")
    launch = lambda d, shared: {"kernel": "k", "dtype": "bf16", "d": d, "n_h": 2, "configs": [
        {"config": f"BV=64 w={w} s={st}", "shared": shared[(w, st)]} for w, st in ((4, 3), (4, 2), (8, 2))]}
    fits = tmp_path / "fits.json"
    fits.write_text(json.dumps({"limit": 100, "launches": [
        launch(128, {(4, 3): 90, (4, 2): 60, (8, 2): 120}),      # (8, 2) over the limit here
        launch(32, {(4, 3): 900, (4, 2): 900, (8, 2): 900})]}))  # another bucket: not this table's business
    assert autotune_wins.spaces([f], None, (), 0.03, 0.01)["k"]["16bit"] == {128: {(64, 8, 2)}}
    assert autotune_wins.spaces([f], None, (), 0.03, 0.01, fits_files=[fits])["k"]["16bit"] == {
        128: {(64, 8, 2), (64, 4, 2)}}
    fits.write_text(json.dumps({"limit": 100, "launches": [launch(128, {(4, 3): 90, (4, 2): 60, (8, 2): 80})]}))
    assert autotune_wins.spaces([f], None, (), 0.03, 0.01, fits_files=[fits])["k"]["16bit"] == {128: {(64, 8, 2)}}


def test_the_committed_rows_give_spaces_for_every_bucket_of_the_check():
    import io
    import contextlib
    fits = sorted(str(p) for p in (Path(autotune_wins.ROOT) / "benchmarks" / "results").glob(
        "kernel_resources_s31_dqkwg_d256_g*.json"))
    assert len(fits) == 2
    out = io.StringIO()
    with contextlib.redirect_stdout(out):  # main's rows only (the pending patch's check times its pruned spaces)
        assert autotune_wins.main(["--regret", "0.03", "--spaces", "--sha", "589682e8719e83da", "--fits", *fits]) == 0
    ns: dict = {}
    exec(out.getvalue(), ns)
    # dqkwg's 16-bit space: one config per bucket from d 32 to d 128 (4 warps at K <= 64, 8 at K >= 85); at d 256
    # the 8-warp 2-stage build fits only gated or at n_h >= 4, so the 1-stage one is kept beside it
    dq = ns["SPACES"]["chunk_dp_bwd_kernel_dqkwg"]["16bit"]
    assert set(dq) == {32, 64, 128, 256} and dq[256] == {(None, 8, 1), (None, 8, 2)}, dq
