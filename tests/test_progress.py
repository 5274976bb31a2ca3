"""The progress bar: on in a terminal (a pseudo-terminal here), off with --progress false and in piped output, where
the workshop's epoch lines stay alone."""

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time

from benchmarks.launch import TRAIN_PY, clean_env

ARGS = ["--network", "mlp", "--epochs", "2", "--batch_size", "8", "--test_after_fit", "false",
        "--check_every_n_steps", "5"]


def run_in_terminal(args, cwd, timeout_s: float = 120) -> str:
    """train.py with a pseudo-terminal of 150 columns as stdout and stderr; everything it wrote."""
    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 150, 0, 0))
    proc = subprocess.Popen([sys.executable, str(TRAIN_PY), *args], cwd=cwd, env=clean_env(), stdin=child,
                            stdout=child, stderr=child, start_new_session=True)
    os.close(child)
    chunks, deadline = [], time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([main], [], [], 0.5)
            if ready:
                try:
                    data = os.read(main, 65536)
                except OSError:  # the child side closed: it exited
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
    finally:
        proc.kill() if proc.poll() is None else None
        proc.wait()
        os.close(main)
    assert proc.returncode == 0, b"".join(chunks)[-3000:]
    return b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")


def test_a_terminal_shows_a_bar_with_batches_loss_and_images_per_sec(tmp_path, fashion_root):
    out = run_in_terminal(["--data_dir", str(fashion_root), *ARGS], tmp_path)
    frames = out.replace("\r", "\n").splitlines()
    bars = [f for f in frames if f.startswith("Epoch 2:") and "32/32" in f and "it/s" in f]
    assert bars and "loss=" in bars[-1] and "img/s=" in bars[-1], frames[-20:]
    assert sum(f.startswith("Epoch 2: Cumulative Time = ") for f in frames) == 1  # the epoch line, intact


def test_progress_false_and_piped_output_keep_only_the_epoch_lines(tmp_path, fashion_root):
    (tmp_path / "a").mkdir()
    out = run_in_terminal(["--data_dir", str(fashion_root), *ARGS, "--progress", "false"], tmp_path / "a")
    assert "it/s" not in out and "Epoch 2: Cumulative Time = " in out
    piped = subprocess.run([sys.executable, str(TRAIN_PY), "--data_dir", str(fashion_root), *ARGS], cwd=tmp_path / "a",
                           env=clean_env(), capture_output=True, text=True, timeout=120)
    assert piped.returncode == 0 and "it/s" not in piped.stdout + piped.stderr
    assert [line[:8] for line in piped.stdout.splitlines() if line.startswith("Epoch")] == ["Epoch 1:", "Epoch 2:"]
