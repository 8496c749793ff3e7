"""Progress bars only on a terminal and only when verbose: a subprocess with its stderr on a
pseudo-terminal shows them, one with a pipe or verbose=False does not."""
import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios

SCRIPT = ("import sys\nfrom llama import Llama\n"
          "Llama(sys.argv[1], n_ctx=256, verbose=sys.argv[2] == '1')\n")


def _run(path, verbose: bool, tty: bool) -> str:
    args = [sys.executable, "-c", SCRIPT, str(path), "1" if verbose else "0"]
    if not tty:
        return subprocess.run(args, capture_output=True, text=True, timeout=300, check=True).stderr
    master, slave = pty.openpty()
    # a terminal 80 columns wide (a fresh pty is 0 x 0, where tqdm draws nothing)
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    assert proc.wait(timeout=300) == 0
    os.close(master)
    return out.decode("utf-8", "replace")


def test_bars_on_a_terminal(smollm2_path):
    text = _run(smollm2_path, verbose=True, tty=True)
    for stage in ("loading model", "compiling graphs", "warming up"):
        assert stage in text
    assert "graphs compiled in" in text


def test_no_bars_in_a_pipe_and_nothing_when_quiet(smollm2_path):
    piped = _run(smollm2_path, verbose=True, tty=False)
    assert "loading model" not in piped and "graphs compiled in" in piped
    assert _run(smollm2_path, verbose=False, tty=True) == ""
