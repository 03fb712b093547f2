"""The command line as users get it: every command the README names is a console script of the package,
each starts, and the built wheel holds them all and runs them by their installed names from an empty
directory, in a fresh virtual environment that sees nothing of this checkout."""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def console_scripts() -> dict[str, str]:
    """``[project.scripts]`` of pyproject.toml: command -> ``module:function``."""
    text = (ROOT / "pyproject.toml").read_text()
    section = text.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    return dict(re.findall(r'^([\w-]+) = "([\w.:]+)"', section, flags=re.M))


def documented_commands() -> set[str]:
    """Every ``sslkit-<command>`` the README names."""
    return set(re.findall(r"(?<![\w/.-])sslkit-[a-z]+(?:-[a-z]+)*(?![\w.-])", (ROOT / "README.md").read_text()))


def test_every_documented_command_is_a_console_script_and_every_script_is_documented():
    assert documented_commands() == set(console_scripts())


@pytest.mark.parametrize("command", sorted(console_scripts()))
def test_each_command_starts_and_calls_itself_by_its_installed_name(command, capsys):
    module, function = console_scripts()[command].split(":")
    assert module.startswith("sslkit.cli.")  # one package holds the command line
    main = getattr(importlib.import_module(module), function)
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: {command} ")


HEAVY_LIBRARIES = ("torch", "torchvision", "numpy", "kornia", "accelerate", "sklearn", "matplotlib")

# Each command's --help, then its command line without arguments (argparse's one error), in one process; a
# line per command names the heavy libraries it imported that the commands before it had not.
HELP_AND_USAGE_ERROR = f"""
import contextlib, importlib, io, sys
before = set()
for target in sys.argv[1:]:
    module, function = target.split(":")
    main = getattr(importlib.import_module(module), function)
    for argv, status in ((["--help"], 0), ([], 2)):
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                main(argv)
        except SystemExit as exited:
            assert exited.code == status, (target, argv, exited.code)
        else:
            raise AssertionError((target, argv, "returned"))
    imported = set({HEAVY_LIBRARIES!r}) & set(sys.modules)
    print(target, *sorted(imported - before))
    before = imported
"""


def test_every_command_answers_help_and_usage_errors_without_the_heavy_libraries():
    """``--help`` and argparse's errors answer at once, not after seconds of importing torch: each command builds
    its parser from light modules and imports the library once its arguments are parsed."""
    targets = sorted(console_scripts().values())
    result = subprocess.run(
        [sys.executable, "-c", HELP_AND_USAGE_ERROR, *targets],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr
    imported = {target: libraries for target, *libraries in map(str.split, result.stdout.splitlines())}
    assert list(imported) == targets
    assert {target: libraries for target, libraries in imported.items() if libraries} == {}


@pytest.mark.parametrize("package", ["sslkit.embeddings", "sslkit.selection"])
def test_a_package_that_imports_its_modules_on_first_use_exports_every_name(package):
    """sslkit.embeddings and sslkit.selection import what they export when it is first asked for (the commands'
    --help reads their choices alone): every name of ``__all__`` comes, and no other."""
    module = importlib.import_module(package)
    for name in module.__all__:
        getattr(module, name)  # an AttributeError: a name the package does not say where to import from
    with pytest.raises(AttributeError, match="no_such_name"):
        module.no_such_name


@pytest.mark.parametrize("script", ["sslkit/cli/pretrain.py", "sslkit/pretrain.py"])
def test_the_file_path_a_launcher_takes_runs_in_a_clone(tmp_path, script):
    """``accelerate launch sslkit/pretrain.py RECIPE`` runs the file: it must work as a script too."""
    command = [sys.executable, str(ROOT / script), "--help"]
    result = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.startswith("usage: sslkit-pretrain "), result.stderr


# --------------------------------------------------------------------------- the wheel


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """The wheel built from this checkout and installed in a fresh virtual environment.

    The environment borrows the dependencies (torch, ...) of the one running the tests through a
    path file, without processing that one's own path files: an editable sslkit there stays out.
    Returns (the wheel, the environment's bin directory).
    """
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"  # a copy: building in the checkout would leave build/ and egg-info behind
    shutil.copytree(ROOT / "sslkit", source / "sslkit", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "-q"]
    build = [*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(tmp / "dist"), str(source)]
    subprocess.run(build, check=True, capture_output=True, timeout=300)
    wheel = next((tmp / "dist").glob("sslkit-*.whl"))

    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    own = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(own, "borrowed-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    install = [*pip, "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)]
    subprocess.run(install, check=True, capture_output=True, timeout=300)
    return wheel, venv / "bin"


@pytest.mark.slow
def test_the_wheel_holds_every_command_the_recipes_and_no_tools(installed):
    wheel, _ = installed
    names = zipfile.ZipFile(wheel).namelist()
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    declared = zipfile.ZipFile(wheel).read(entry_points).decode()
    for command, target in console_scripts().items():
        assert f"{command} = {target}" in declared, command
        assert f"{target.split(':')[0].replace('.', '/')}.py" in names, target
    assert "sslkit/recipes/quickstart.yaml" in names and "sslkit/experiments/runner.py" in names
    assert not [n for n in names if n.startswith(("tools/", "tests/"))]


@pytest.mark.slow
def test_every_documented_command_runs_by_its_installed_name_from_an_empty_directory(installed, tmp_path):
    _, bin_dir = installed
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", OMP_NUM_THREADS="1")

    def run(*command: str) -> subprocess.CompletedProcess:
        return subprocess.run(command, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)

    where = run("python", "-c", "import sslkit; print(sslkit.__file__)")
    assert str(bin_dir.parent) in where.stdout, where.stdout + where.stderr  # the wheel's sslkit, not this checkout's
    for command in sorted(documented_commands()):
        assert (bin_dir / command).is_file(), command
        result = run(command, "--help")
        assert result.returncode == 0 and result.stdout.startswith(f"usage: {command} "), result.stderr
    # Real work from an empty directory: a bundled recipe by the path the README gives, its views drawn.
    result = run("sslkit-show-augmentations", "recipes/quickstart.yaml", "--out", "v.png", "--images", "2")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "v.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("folder", ["sslkit/cli", "tools/bench"])
def test_no_script_folder_shadows_a_standard_library_module(folder):
    """``python sslkit/cli/pretrain.py`` or ``python tools/bench/x.py`` puts that folder first on sys.path:
    a select.py there would be imported as the standard library's select by everything after it."""
    modules = {path.stem for path in (ROOT / folder).glob("*.py")}
    assert not modules & sys.stdlib_module_names
