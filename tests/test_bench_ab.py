"""``jaxmoe bench ab`` on the CPU: two source trees' workers, the bitwise comparison, the
interleaved times, a tree that differs, raises or dies, and bad flags.

The trees are copies of this checkout's ``src/`` (one exported from a throwaway git repo by
``--before-commit``), some patched; the cases are the tiny ones on the xla backend, and one
Mosaic kernel in its interpreter (slow)."""

import shutil
import subprocess
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from jaxmoe.bench import ab, tables
from jaxmoe.bench.presets import GEMM_SHAPES, LAYER_PRESETS
from tests.cli_run import exit_code, one_error_line, results

ROOT = Path(__file__).resolve().parents[1]
TINY = "tiny-ab"
# Timing on a shared CPU is noise: the tests check the bits and that times exist, not 1%.
LOOSE = ["--tolerance", "100", "--sample-ms", "5", "--settle-ms", "0"]


def copy_tree(dest: Path) -> Path:
    shutil.copytree(ROOT / "src", dest / "src", ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def patch(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{path}: the line to patch is gone: {old!r}"
    path.write_text(text.replace(old, new))


def git(repo: Path, *args: str) -> str:
    command = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args]
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip()


def git_repo(dest: Path) -> str:
    """A throwaway checkout holding a copy of ``src/``; its commit."""
    copy_tree(dest)
    git(dest, "init", "-q")
    git(dest, "add", "src")
    git(dest, "commit", "-q", "-m", "copy")
    return git(dest, "rev-parse", "HEAD")


def test_same_source_is_bitwise_equal_and_timed(tmp_path):
    repo = tmp_path / "repo"
    commit = git_repo(repo)
    out = tmp_path / "ab.json"
    cases = [
        f"gmm/{TINY}/balanced/fwd+bwd/xla",
        f"gated_ffn/{TINY}/skewed/fwd+bwd/xla",
        f"fp8_blockwise/{TINY}/skewed/fwd/xla",
    ]
    argv = ["bench", "ab", "--before-commit", "HEAD", "--repo", str(repo), "--after", str(repo)]
    argv += ["--tiny", "--backends", "xla", "--cases", ",".join(cases), "--rounds", "2"]
    assert exit_code([*argv, *LOOSE, "--out", str(out)]) == 0
    header, rows = results(out)
    assert [row["case"] for row in rows] == cases
    assert header["before"]["commit"] == header["after"]["commit"] == header["commit"] == commit
    assert header["before"]["origin"] == "git archive HEAD"
    assert header["after"]["dirty"] is False
    assert header["after"]["jaxmoe_file"].startswith(str(repo.resolve()))
    assert header["before"]["jaxmoe_file"] != header["after"]["jaxmoe_file"]
    leaves = [["out", "dx", "dw"], ["out", "dx", "dw_gate", "dw_up", "dw_down"], ["out"]]
    for row, names in zip(rows, leaves, strict=True):
        assert row["ok"] is True and row["within_tolerance"] is True, row
        assert row["bitwise_equal"] == dict.fromkeys(names, True)
        assert row["same_inputs"] and row["repeatable"] == {"before": True, "after": True}
        assert row["before_ms"] > 0 and row["after_ms"] > 0 and row["ms"] == row["after_ms"]
        assert row["ratio"] == pytest.approx(row["after_ms"] / row["before_ms"], rel=1e-4)
        assert len(row["before_samples"]) == len(row["after_samples"]) == 2
    markdown = out.with_suffix(".md").read_text()
    assert f"before `{commit[:12]}`" in markdown
    assert "| gmm/tiny-ab/balanced/fwd+bwd/xla | True | True |" in markdown
    # The rows merge into a curated table (they carry ``ms``).
    table = {
        "header": {"title": "t", "key": ["case"], "columns": ab.COLUMNS, "runs": {}},
        "rows": [],
    }
    merged = tables.merge_run(
        table, rows, "cpu/call1", tables.provenance_of(results_of(out), commit, None)
    )
    assert len(merged["rows"]) == 3


def results_of(path):
    header, rows = results(path)
    return {"header": header, "rows": rows}


def test_changed_raising_and_dying_trees_are_rows(tmp_path):
    after = copy_tree(tmp_path / "after")
    ops = after / "src" / "jaxmoe" / "ops"
    # The xla grouped matmul's forward, off by a little: the cases on it must differ in bits.
    patch(
        ops / "grouped_matmul" / "xla.py",
        "        return out.astype(out_dtype)\n\n    def tgmm",
        "        return (out + 1e-3).astype(out_dtype)\n\n    def tgmm",
    )
    patch(
        ops / "gated_grouped_matmul" / "api.py",
        '    _check(lhs, rhs_gate, rhs_up, group_sizes, activation, "gated_ffn")\n',
        '    raise RuntimeError("patched gated_ffn fails")\n',
    )
    patch(
        ops / "fp8" / "api.py",
        "    recipe = resolve_recipe(recipe)\n    check_grouped_matmul_args(",
        "    recipe = resolve_recipe(recipe)\n"
        '    if recipe.name == "rowwise":\n'
        '        __import__("os")._exit(7)\n'
        "    check_grouped_matmul_args(",
    )
    out = tmp_path / "ab.json"
    names = ["gmm", "gated_ffn", "fp8_rowwise", "fp8_blockwise"]  # the order cases run in
    cases = [f"{name}/{TINY}/balanced/fwd/xla" for name in names]
    argv = ["bench", "ab", "--before", str(ROOT), "--after", str(after), "--tiny"]
    argv += ["--after-commit", "0123abc", "--backends", "xla", "--cases", ",".join(cases)]
    assert exit_code([*argv, "--rounds", "1", *LOOSE, "--out", str(out)]) == 1
    header, rows = results(out)
    # A folder outside git: the commit given names it.
    assert header["after"]["commit"] == "0123abc" and header["after"]["path"] == str(after)
    gmm, gated, dead, blockwise = rows
    assert gmm["bitwise_equal"] == {"out": False} and gmm["ok"] is False
    assert gmm["differing_elements"]["out"] > 0 and gmm["max_abs_diff"]["out"] > 0
    assert gmm["before_ms"] > 0  # timed all the same
    assert "patched gated_ffn fails" in gated["after_error"] and "before_error" not in gated
    assert gated["ok"] is False and gated["ms"] is None
    assert "after worker exited (status 7)" in dead["after_error"] and dead["after_restarted"]
    assert "patched gated_ffn" not in dead["after_error"]  # the log's tail is this case's
    # The restarted worker takes the next case.
    assert blockwise["ok"] is True and blockwise["bitwise_equal"] == {"out": True}
    assert blockwise["after_ms"] > 0


@pytest.mark.slow
def test_tiny_mosaic_kernel_runs_interpreted(tmp_path):
    out = tmp_path / "ab.json"
    case = f"gmm/{TINY}/skewed/fwd/pallas"
    argv = ["bench", "ab", "--before", str(ROOT), "--after", str(ROOT), "--tiny", "--rounds", "0"]
    assert exit_code([*argv, "--backends", "pallas", "--cases", case, "--out", str(out)]) == 0
    _, (row,) = results(out)
    assert row["case"] == case and row["ok"] is True and row["bitwise_equal"] == {"out": True}
    assert row["repeatable"] == {"before": None, "after": None}  # --rounds 0: one run each
    assert row.get("before_ms") is None and row["ms"] is None and "skipped" not in row


@pytest.mark.parametrize(
    "init, says",
    [
        ("import os\nos._exit(3)\n", "before worker exited (status 3)"),
        ('raise ImportError("broken tree")\n', "could not import jaxmoe: ImportError: broken"),
    ],
)
def test_a_tree_that_does_not_import_is_one_error_line(tmp_path, capsys, init, says):
    broken = copy_tree(tmp_path / "broken")
    (broken / "src" / "jaxmoe" / "__init__.py").write_text(init)
    argv = ["bench", "ab", "--before", str(broken), "--after", str(ROOT), "--tiny"]
    assert exit_code([*argv, "--backends", "xla"]) == 2
    assert says in one_error_line(capsys)


def test_case_list_reuses_the_bench_shapes():
    cases = ab.case_list(tiny=False)
    assert len({case["case"] for case in cases}) == len(cases) == 24 + 12 + 2 * 24
    gmm = ab.select_cases(cases, ["gmm"])
    assert {case["shape"] for case in gmm} == set(ab.GEMM_SHAPE_NAMES)
    assert all(
        (c["m"], c["k"], c["n"], c["groups"])
        == (GEMM_SHAPES[c["shape"]].m, GEMM_SHAPES[c["shape"]].k, GEMM_SHAPES[c["shape"]].n,
            GEMM_SHAPES[c["shape"]].groups)
        for c in gmm
    )  # fmt: skip
    for case in ab.select_cases(cases, ["gated_ffn"]):
        preset = LAYER_PRESETS[case["shape"]]
        assert case["m"] == preset.tokens * preset.top_k and case["n"] == preset.ffn_size
    assert len(ab.select_cases(cases, ["fp8_*/qwen3-up/*"])) == 8
    assert len(ab.select_cases(cases, ["*/skewed/fwd/*"])) == len(cases) // 4
    triton = ab.case_list(tiny=False, backends=["pallas_triton"])
    assert {case["family"] for case in triton} == {"gmm", "gated_ffn"}
    fused = ab.case_list(tiny=True, backends=["pallas_fused"])
    assert {case["family"] for case in fused} == {"gated_ffn"}


HOPPER = {"platform": "gpu", "device": "NVIDIA H200", "compute_capability": "9.0"}
AMPERE = {"platform": "gpu", "device": "NVIDIA A100", "compute_capability": "8.0"}
CPU = {"platform": "cpu", "device": "cpu"}


@pytest.mark.parametrize(
    "backend, pass_, info, tiny, reason",
    [
        ("pallas", "fwd+bwd", HOPPER, False, None),
        ("pallas_fused", "fwd", AMPERE, False, "Hopper"),
        ("pallas", "fwd", CPU, False, "--tiny"),
        ("pallas", "fwd", CPU, True, None),
        ("pallas", "fwd+bwd", CPU, True, "interpreter"),
        ("pallas_triton", "fwd", CPU, False, "--tiny"),
        ("pallas_triton", "fwd+bwd", CPU, True, None),
        ("xla", "fwd+bwd", CPU, False, None),
        ("auto", "fwd+bwd", AMPERE, False, None),
    ],
)
def test_skip_reason_names_what_the_platform_lacks(backend, pass_, info, tiny, reason):
    found = ab.skip_reason({"backend": backend, "pass": pass_}, info, tiny)
    assert found is None if reason is None else reason in found


def bf16_bits(values) -> np.ndarray:
    return np.asarray(values, dtype=jnp.bfloat16).view(np.uint16)


def test_compare_leaf_is_bitwise_and_nan_aware():
    a = bf16_bits([1.0, 2.0, np.nan, -0.0])
    assert ab.compare_leaf(a, a.copy(), "bfloat16") == {"equal": True, "differing": 0}
    other_nan = a.copy()
    other_nan[2] ^= 1  # another NaN payload at the same place
    assert ab.compare_leaf(a, other_nan, "bfloat16")["equal"] is True
    signed_zero = bf16_bits([1.0, 2.0, np.nan, 0.0])  # equal as numbers, not as bits
    found = ab.compare_leaf(a, signed_zero, "bfloat16")
    assert found["equal"] is False and found["differing"] == 1
    moved = bf16_bits([1.0, 2.015625, 5.0, -0.0])  # 2 + one bf16 step
    found = ab.compare_leaf(a, moved, "bfloat16")
    assert found["equal"] is False and found["differing"] == 2  # a number and NaN -> 5
    assert found["max_abs_diff"] == pytest.approx(0.015625)
    assert ab.compare_leaf(a, a[:3], "bfloat16")["equal"] is False
    ints = np.array([1, 2, 3], np.int32).view(np.uint32)
    assert ab.compare_leaf(ints, ints[::-1].copy(), "int32") == {"equal": False, "differing": 2}


def test_a_commit_that_is_not_the_checkouts_head_is_one_error_line(tmp_path, capsys):
    repo = tmp_path / "repo"
    git_repo(repo)
    git(repo, "commit", "-q", "--allow-empty", "-m", "second")
    argv = ["bench", "ab", "--before", str(repo), "--after", str(repo)]
    assert exit_code([*argv, "--before-commit", "HEAD~1"]) == 2
    assert "argument --before-commit: 'HEAD~1' is not the HEAD" in one_error_line(capsys)
    assert exit_code([*argv, "--before-commit", "HEAD~5"]) == 2
    assert "argument --before-commit: 'HEAD~5' is not a commit" in one_error_line(capsys)


@pytest.mark.parametrize(
    "extra, says",
    [
        (["--before", "/no/such/tree"], "src/jaxmoe/__init__.py"),
        ([], "--before PATH or --before-commit REV"),
        (["--before", str(ROOT), "--cases", "nosuch"], "matches no case"),
        (["--before", str(ROOT), "--tolerance", "-1"], "--tolerance"),
        (["--before", str(ROOT), "--mem-fraction", "1.5"], "--mem-fraction"),
        (["--before", str(ROOT), "--backends", "cuda"], "--backends"),
        (["--before", str(ROOT), "--tiny", "--cases", "gmm/mixtral-up/*"], "selects none"),
        (["--before-commit", "no-such-rev-x", "--repo", str(ROOT)], "--before-commit"),
    ],
)
def test_bad_flags_are_one_error_line(capsys, extra, says):
    assert exit_code(["bench", "ab", *extra]) == 2
    assert says in one_error_line(capsys)
