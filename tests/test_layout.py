"""Guards for the package-dir mapping (runtime/ grammar/ kernels/ -> sglpy.*)."""

import ast
import os
import pathlib
import re
import subprocess
import sys
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _expected_packages():
    """Every folder holding __init__.py under the mapped roots, as its installed name."""
    mapping = _pyproject()["tool"]["setuptools"]["package-dir"]
    roots = {"sglpy": "sglpy", "sglpy.runtime": "runtime", "sglpy.grammar": "grammar", "sglpy.kernels": "kernels"}
    for name, folder in roots.items():
        assert mapping.get(name) == folder, f"package-dir must map {name} -> {folder}"
    found = set()
    for name, folder in roots.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([name, *rel.parts]) if rel.parts else name)
    return found


def test_package_list_matches_folders():
    listed = set(_pyproject()["tool"]["setuptools"]["packages"])
    assert listed == _expected_packages()


def test_every_listed_package_has_a_package_dir_entry():
    cfg = _pyproject()["tool"]["setuptools"]
    for pkg in cfg["packages"]:
        folder = cfg["package-dir"].get(pkg)
        assert folder is not None, f"{pkg} missing from [tool.setuptools.package-dir]"
        assert (ROOT / folder / "__init__.py").exists(), f"{pkg} -> {folder} has no __init__.py"


def test_tests_folder_is_not_a_package():
    assert not list((ROOT / "tests").rglob("__init__.py"))
    assert {p.name for p in (ROOT / "tests").iterdir() if p.is_dir() and not p.name.startswith((".", "_"))} == {
        "frontend", "runtime", "grammar", "kernels", "server", "browser"}


def test_every_module_says_what_it_owns():
    missing = [str(p.relative_to(ROOT)) for folder in ("sglpy", "runtime", "grammar", "kernels")
               for p in (ROOT / folder).rglob("*.py") if not ast.get_docstring(ast.parse(p.read_text(encoding="utf-8")))]
    assert missing == []


def test_shared_types_fake_engine_and_server_import_without_torch():
    code = ("import sys, sglpy.runtime.sampling_params, sglpy.runtime.messages, sglpy.runtime.core, "
            "sglpy.runtime.engine, sglpy.runtime.engine.request_builder, sglpy.runtime.engine.stops, "
            "sglpy.runtime.server, sglpy.runtime.testing.fake_engine, sglpy.runtime.engine.grammar_worker, "
            "sglpy.runtime.testing.audit; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_no_top_level_imports_of_mapped_folders():
    bad = re.compile(r"^\s*(import|from)\s+(runtime|grammar|kernels)(\.|\s|$)", re.M)
    offenders = []
    for folder in ("sglpy", "runtime", "grammar", "kernels", "tests", "examples", "benchmarks"):
        for path in (ROOT / folder).rglob("*.py"):
            if bad.search(path.read_text(encoding="utf-8")):
                offenders.append(str(path.relative_to(ROOT)))
    assert offenders == [], f"use sglpy.runtime / relative imports instead: {offenders}"


def test_grammar_imports_nothing_of_ours_and_no_torch():
    bad = re.compile(r"^\s*(import|from)\s+(torch|sglpy\.runtime|sglpy\.kernels|\.\.runtime)", re.M)
    offenders = [str(p) for p in (ROOT / "grammar").rglob("*.py") if bad.search(p.read_text(encoding="utf-8"))]
    assert offenders == []


def test_grammar_root_stays_small():
    """grammar/ keeps its entry points at the root and the rest in concept folders (regex/, json/, rtn/, ...)."""
    root_files = sorted(p.name for p in (ROOT / "grammar").glob("*.py"))
    assert len(root_files) <= 12, root_files


# A path on the machine a file was written on (a home, a mount, a scratch workspace) or a notes / sample folder
# kept beside the repository: a reader elsewhere cannot open it. /tmp and /etc stay allowed (scratch folders in
# commands, hostile inputs in tests).
_OUTSIDE = re.compile(r"(?<![\w.~-])/(?:" + "|".join(["work", "home", "Users", "root", "mnt", "srv", "data", "scratch"])
                      + r")/|(?<![\w.-])(?:shared/data|notes)/[\w.-]")


def test_no_file_names_a_path_outside_the_repository():
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    hits = []
    for name in names:
        path = ROOT / name
        if path.suffix in (".gguf", ".png", ".jpg", ".ico", ".bin") or not path.is_file():
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if _OUTSIDE.search(line):
                hits.append(f"{name}:{n}: {line.strip()[:100]}")
    assert hits == []


def test_import_sglpy_does_not_import_torch():
    code = "import sys, sglpy; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.slow
def test_wheel_builds_and_imports_outside_repo(tmp_path):
    """Build the wheel, install it into a fresh folder, and import it from outside the repo.

    Dependencies (torch, transformers) come from the current environment; the wheel's folder is put
    first on sys.path, so the import must resolve to the wheel's files, not to this checkout.
    """
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(ROOT)],
        check=True, capture_output=True, text=True,
    )
    wheels = list(dist.glob("sglpy-*.whl"))
    assert len(wheels) == 1
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheels[0])],
                   check=True, capture_output=True, text=True)
    for pkg in ("runtime", "runtime/engine", "runtime/memory", "runtime/model", "runtime/server", "runtime/testing",
                "grammar", "grammar/ebnf", "grammar/json", "grammar/regex", "grammar/rtn", "grammar/tokens", "kernels"):
        assert (target / "sglpy" / pkg / "__init__.py").exists(), f"wheel lacks sglpy/{pkg}"
    assert not (target / "runtime").exists(), "runtime/ must not install as a top-level package"
    for src in ("csrc/cpu_common.h", "csrc/decode_attention.cpp"):  # the native CPU kernels compile from these
        assert (target / "sglpy" / "kernels" / src).exists(), f"wheel lacks sglpy/kernels/{src}"
    code = (
        "import sglpy, sglpy.runtime, sglpy.grammar, sglpy.kernels, sglpy.runtime.model, sglpy.grammar.json\n"
        "import sglpy.runtime.engine, sglpy.runtime.server, sglpy.runtime.testing.fake_engine\n"
        "from sglpy.runtime.engine import Engine\n"
        f"assert sglpy.runtime.__file__.startswith({str(target)!r}), sglpy.runtime.__file__\n"
        f"assert sglpy.grammar.__file__.startswith({str(target)!r}), sglpy.grammar.__file__\n"
        "from sglpy.kernels.cpu_native import find_compiler, native_status\n"
        "assert find_compiler() is None or native_status().startswith('native'), native_status()\n"
        "print('ok')\n"
    )
    env = dict(os.environ, PYTHONPATH=str(target))
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    out = subprocess.run([sys.executable, "-c", "import runtime"], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert out.returncode != 0
