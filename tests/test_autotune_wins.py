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
