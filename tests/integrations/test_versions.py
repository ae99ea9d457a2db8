"""trustlens.integrations.check_version, the one release check of every framework package: older
than the oldest supported release is refused with the package's error, a newer minor series than
the newest tested one is tried with a warning, and a module without `__version__` (OpenRLHF) is
read from its installed distribution."""

from __future__ import annotations

import subprocess
import sys
import types
import warnings

import pytest

from trustlens.integrations import check_version


class Old(RuntimeError):
    pass


def _framework(monkeypatch, version: str | None) -> None:
    module = types.ModuleType("fakeframework")
    if version is not None:
        module.__version__ = version
    monkeypatch.setitem(sys.modules, "fakeframework", module)


@pytest.mark.parametrize(
    ("installed", "warned"), [("0.7.0", False), ("0.9.1", False), ("0.9.7", False), ("0.10.0", True), ("1.0", True)]
)
def test_a_supported_release_passes_and_a_newer_series_warns(monkeypatch, installed, warned):
    _framework(monkeypatch, installed)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert str(check_version("fakeframework", "0.7.0", "0.9.1", Old)) == installed
    messages = [str(w.message) for w in caught]
    assert messages == (
        [
            f"trustlens: fakeframework {installed} is newer than the newest tested release (0.9.1); trying it "
            "(what it lacks raises Old)"
        ]
        if warned
        else []
    )


def test_an_older_release_is_refused_with_the_packages_error(monkeypatch):
    _framework(monkeypatch, "0.6.9")
    with pytest.raises(Old, match=r"^trustlens.integrations.fakeframework: fakeframework 0\.6\.9 is older than the "):
        check_version("fakeframework", "0.7.0", "0.9.1", Old)


def test_a_module_without_a_version_is_read_from_its_distribution(monkeypatch):
    _framework(monkeypatch, None)
    monkeypatch.setattr("importlib.metadata.version", lambda name: {"fakeframework": "0.11.2"}[name])
    assert str(check_version("fakeframework", "0.11.0", "0.11.2")) == "0.11.2"


def test_verls_config_readers_import_without_verl():
    """The verl package's rules, sampling and stop read configs and need no verl; the package
    imports too, and its hook (`setup`) names the extra to install."""
    pytest.importorskip("torch")
    if subprocess.run([sys.executable, "-c", "import verl"], capture_output=True).returncode == 0:
        pytest.skip("verl is installed here")
    code = (
        "import trustlens.integrations.verl.rules, trustlens.integrations.verl.sampling, "
        "trustlens.integrations.verl.stop\n"
        "print('read')\n"
        "import sys; [sys.modules.pop(m) for m in list(sys.modules) if m.startswith('trustlens.integrations.verl')]\n"
        "import trustlens.integrations.verl\n"
        "trustlens.integrations.verl.setup()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout == "read\n"
    assert 'ImportError: this needs verl, which is not installed; install the extra: pip install "trustlens[verl]"' in (
        out.stderr
    )
