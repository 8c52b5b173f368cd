"""pmoe.__version__ (no ranks): the project's one version, CMakeLists.txt's project() line, which
pyproject.toml reads through scikit-build-core's regex provider instead of repeating it."""
import pathlib
import re
import tomllib

import pmoe

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_version_is_cmakes_project_version():
    cmake = (ROOT / "CMakeLists.txt").read_text()
    project = re.search(r"^project\(pmoe\s+VERSION\s+([0-9.]+)", cmake, re.MULTILINE)
    assert project, "CMakeLists.txt has no project(pmoe VERSION ...)"
    assert pmoe.__version__ == project.group(1)


def test_pyproject_reads_the_version_from_cmake():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"], "a second copy of the version"
    assert "version" in pyproject["project"]["dynamic"]
    provider = pyproject["tool"]["scikit-build"]["metadata"]["version"]
    assert provider["provider"] == "scikit_build_core.metadata.regex"
    # What scikit-build-core will find: its regex over its input file.
    text = (ROOT / provider["input"]).read_text()
    found = re.search(provider["regex"], text, re.MULTILINE)
    assert found and found.group("value") == pmoe.__version__
