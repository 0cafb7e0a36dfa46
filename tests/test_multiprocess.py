"""The sharded layer across processes: 2 processes x 4 CPU devices (``jax.distributed`` over
localhost, gloo collectives) give the same forward and backward as this process's 8 devices.

The workers (``tests/multiprocess_worker.py``) run with a time limit and are killed if the test
fails or times out; they talk only over 127.0.0.1.
"""

import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from tests import multiprocess_worker as worker

REPO = Path(__file__).resolve().parents[1]
NUM_PROCESSES, LOCAL_DEVICES = 2, 4
TIMEOUT_S = 240
# Sums over every device (gradients of replicated weights, the loss): gloo adds the processes'
# partial sums in another order than XLA's in-process all-reduce, so these agree to rounding
# (measured: <= 2e-6 absolute). Everything else -- the output, dx, the expert-weight gradients
# (which cross the all-to-all and the FSDP all-gather / reduce-scatter), the counts -- is bitwise.
ALL_REDUCED = {
    "loss",
    "grad['router']['kernel']",
    "grad['shared']['w_gate']",
    "grad['shared']['w_up']",
    "grad['shared']['w_down']",
}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _launch(out: Path, checkpoint_dir: Path) -> None:
    """Starts the workers, waits for all of them, kills the rest on any failure or timeout."""
    env = dict(os.environ)
    # The workers ask for their devices through jax.config; drop the 8-device flag of conftest.
    # (An XLA_FLAGS left blank would be read as a file name.)
    flags = [
        flag
        for flag in env.get("XLA_FLAGS", "").split()
        if not flag.startswith("--xla_force_host_platform_device_count")
    ]
    env["XLA_FLAGS"] = " ".join(flags)
    if not flags:
        del env["XLA_FLAGS"]
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), str(REPO / "src"), env.get("PYTHONPATH", "")) if p
    )
    port = _free_port()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.multiprocess_worker",
                f"--process-id={rank}",
                f"--num-processes={NUM_PROCESSES}",
                f"--port={port}",
                f"--local-devices={LOCAL_DEVICES}",
                f"--out={out}",
                f"--checkpoint-dir={checkpoint_dir}",
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(NUM_PROCESSES)
    ]
    try:
        logs = [proc.communicate(timeout=TIMEOUT_S)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for rank, (proc, log) in enumerate(zip(procs, logs, strict=True)):
        assert proc.returncode == 0, f"worker {rank} exited {proc.returncode}:\n{log[-4000:]}"


@pytest.fixture(scope="module")
def multiprocess_results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("multiprocess")
    _launch(tmp / "result.npz", tmp / "checkpoint")
    out = tmp / "result.npz"
    with np.load(out) as data:
        return dict(data)


@pytest.mark.parametrize("case", [c[0] for c in worker.CASES])
def test_two_processes_match_one_process(multiprocess_results, case):
    single = worker.run_case(case, jax.devices()[:8])
    multi = {k.split("/", 1)[1]: v for k, v in multiprocess_results.items() if k.startswith(case)}
    assert sorted(multi) == sorted(single)
    for key, expected in single.items():
        if key in ALL_REDUCED:
            np.testing.assert_allclose(multi[key], expected, rtol=1e-5, atol=1e-5, err_msg=key)
        else:
            np.testing.assert_array_equal(multi[key], expected, err_msg=f"{case}: {key}")


def test_checkpoint_saved_by_two_processes_restores_over_both(multiprocess_results):
    """Both processes save (data=2, ep=4) FSDP shards; both restore them over ep=8: bitwise."""
    params = worker.host_inputs(worker.case_config(("data",), True))[0]
    expected = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_leaves_with_path(params)}
    restored = {
        k.split("/", 1)[1]: v
        for k, v in multiprocess_results.items()
        if k.startswith("checkpoint/")
    }
    assert sorted(restored) == sorted(expected)
    for key, value in expected.items():
        np.testing.assert_array_equal(restored[key], value, err_msg=key)
