import subprocess
import sys

from trustlens.cli import COMMANDS


def _run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout


def test_top_level_help_lists_every_command_without_importing_torch():
    out = _run(
        "import sys, contextlib, io\n"
        "from trustlens.cli import main\n"
        "buf = io.StringIO()\n"
        "with contextlib.redirect_stdout(buf):\n"
        "    try:\n"
        "        main(['--help'])\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print(buf.getvalue())\n"
        "print('torch imported:', 'torch' in sys.modules)\n"
    )
    for name in COMMANDS:
        assert name in out
    assert "torch imported: False" in out


def test_a_command_imports_only_its_own_module():
    out = _run(
        "import sys\n"
        "from trustlens.cli import main\n"
        "try:\n"
        "    main(['dashboard', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('warmup imported:', 'trustlens.train.warmup' in sys.modules)\n"
    )
    assert "usage: trustlens dashboard" in out
    assert "warmup imported: False" in out
