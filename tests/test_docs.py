"""The docs a user reads: every relative link in the README, the changelog and docs/ resolves (to a
file, and to a heading when it names one), every `tfpipe ...` command line in them parses with the
CLI's own parser, and the README's Python example compiles."""

from __future__ import annotations

import glob
import os
import re
import shlex

import pytest

from conftest import ROOT

PAGES = sorted([os.path.join(ROOT, "README.md"), os.path.join(ROOT, "CHANGELOG.md"),
                *glob.glob(os.path.join(ROOT, "docs", "*.md"))])
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def _rel(path: str) -> str:
    return os.path.relpath(path, ROOT)


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: str) -> set[str]:
    text = FENCE.sub("", open(path).read())
    return {slug(m[1]) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


def links() -> list[tuple[str, str]]:
    out = []
    for page in PAGES:
        text = re.sub(r"`[^`\n]*`", "", FENCE.sub("", open(page).read()))  # code is not a link
        out += [(page, target) for target in LINK.findall(text) if not re.match(r"[a-z]+:", target)]
    return out


@pytest.mark.parametrize("page, target", links(), ids=lambda v: _rel(v) if os.path.isabs(v) else v)
def test_relative_links_resolve(page, target):
    path, _, anchor = target.partition("#")
    resolved = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
    assert os.path.exists(resolved), f"{_rel(page)} links to {target}: {_rel(resolved)} does not exist"
    if anchor:
        assert resolved.endswith(".md"), f"{_rel(page)}: #{anchor} on a file that is not markdown"
        assert anchor in anchors(resolved), f"{_rel(page)} links to {target}: no such heading in {_rel(resolved)}"


def command_lines() -> list[tuple[str, str]]:
    """`tfpipe ...` lines of the shell blocks (continuations joined, comments and environment
    assignments dropped, `&&` chains split), and inline code spans that are whole commands."""
    out = []
    for page in PAGES:
        text = open(page).read()
        for lang, block in FENCE.findall(text):
            if lang not in ("sh", "bash", "console"):
                continue
            for line in block.replace("\\\n", " ").splitlines():
                line = re.sub(r"\s#.*$", "", line).strip()
                if "tfpipe " not in line:  # curl, python, ...: not ours to parse
                    continue
                for part in line.split("&&"):
                    words = shlex.split(part.strip())
                    while words and re.match(r"^[A-Z_]+=", words[0]):
                        words.pop(0)
                    if words[:1] == ["tfpipe"]:
                        out.append((page, shlex.join(words)))
        for span in re.findall(r"`(tfpipe [^`]+)`", FENCE.sub("", text)):
            words = span.split()
            if re.fullmatch(r"[a-z]+", words[1]) and not any(s in span for s in ("...", "[", "|", "<")):
                out.append((page, span))
    return out


def _beam_flags(extra: list[str]) -> list[str]:
    """The flags among `extra` that Beam's pipeline options do not know, as `tfpipe data` decides
    (an option's flag, such as --extra_package, may differ from its name, extra_packages)."""
    from tfpipe.pipeline.errors import DataError
    from tfpipe.pipeline.runner import check_beam_args

    try:
        check_beam_args(extra)
    except DataError as e:
        return [str(e)]
    return []


def test_the_docs_hold_commands_to_check():
    lines = command_lines()
    assert len(lines) >= 30 and {c.split()[1] for _, c in lines} >= {
        "run", "data", "train", "export", "serve", "loadtest", "skew", "tune", "show"}


@pytest.mark.parametrize("page, command", command_lines(), ids=lambda v: _rel(v) if os.path.isabs(v) else v)
def test_command_lines_parse_with_the_cli_parser(page, command):
    from tfpipe.cli import build_parser

    argv = shlex.split(command)[1:]
    try:
        args, extra = build_parser().parse_known_args(argv)
    except SystemExit as e:  # argparse's error (or --help, which exits 0)
        assert e.code == 0, f"{_rel(page)}: `{command}` does not parse"
        return
    if args.command in ("data", "predict"):  # both Beam jobs: other options are Beam's
        assert not _beam_flags(extra), f"{_rel(page)}: `{command}`: not Beam options either: {_beam_flags(extra)}"
    else:
        assert not extra, f"{_rel(page)}: `{command}`: unknown arguments {extra}"


def test_the_readme_python_example_compiles():
    blocks = [b for lang, b in FENCE.findall(open(os.path.join(ROOT, "README.md")).read()) if lang == "python"]
    assert blocks
    for block in blocks:
        compile(block, "README.md", "exec")


def test_the_readme_fits_a_first_hour():
    text = open(os.path.join(ROOT, "README.md")).read()
    assert len(text.splitlines()) <= 300
    demo, tests, more = [b for lang, b in FENCE.findall(text) if lang == "sh"][:3]
    ci = open(os.path.join(ROOT, ".ci", "run")).read().splitlines()
    assert demo.strip().endswith("tfpipe run")
    for line in [tests.strip(), *more.strip().splitlines()]:  # CI runs each test command as the README gives it
        assert line in ci, line


def test_the_configuration_page_holds_a_valid_config():
    """Every key the example config of docs/configuration.md shows is one the config file takes."""
    import tomllib

    from tfpipe.config import Config, validate

    blocks = [b for lang, b in FENCE.findall(open(os.path.join(ROOT, "docs", "configuration.md")).read())
              if lang == "toml"]
    assert blocks
    config = validate(Config, tomllib.loads(blocks[0]), source="docs/configuration.md")
    assert config.rollout.serving_gate and config.export.thresholds


# ---- docs/architecture.md names code that exists ---------------------------------------------------

ARCHITECTURE = os.path.join(ROOT, "docs", "architecture.md")
SOURCE_DIRS = ("tfpipe", "pipeline", "train", "export", "serve", "loadtest", "skew", "tune", "rollout", "predict",
               "examples", "benchmarks", "tests", "engines", "tests_engines")


def _sources() -> dict[str, str]:
    """Repository-relative path -> text of every Python file of the code the docs describe."""
    found = {}
    for top in SOURCE_DIRS:
        for path in glob.glob(os.path.join(ROOT, top, "**", "*.py"), recursive=True):
            found[_rel(path)] = open(path).read()
    return found


def _named_in_architecture() -> tuple[list[str], list[str], list[str]]:
    """The files (`dir/file.py`), the methods (`Class.method`) and the module functions
    (`module.function`) docs/architecture.md names in code spans."""
    spans = re.findall(r"`([^`\n]+)`", FENCE.sub("", open(ARCHITECTURE).read()))
    files = sorted({s for s in spans if re.fullmatch(r"[a-z_]+(/[a-z_]+)*/[a-z_0-9]+\.py", s)})
    methods = sorted({s for s in spans if re.fullmatch(r"[A-Z]\w+\.[a-z_]\w*", s)})
    functions = sorted({s for s in spans if re.fullmatch(r"[a-z_]+\.[a-z_]\w*", s)
                        and s.split(".")[1] not in FILE_SUFFIXES and s.split(".")[0] not in NOT_OURS})
    return files, methods, functions


# what `a.b` in a code span is when it is not a module's function: a file name, or another library's
FILE_SUFFIXES = {"py", "json", "jsonl", "keras", "xml", "toml", "txt", "csv", "sh", "html", "config", "extra"}
NOT_OURS = {"asyncio", "keras", "tf", "np"}


def test_architecture_names_only_code_that_exists():
    """Every file, `Class.method` and `module.function` docs/architecture.md names is in the code: a
    renamed function fails this test until the page says the new name."""
    files, methods, functions = _named_in_architecture()
    assert len(files) >= 5 and len(methods) >= 10, (files, methods)  # the page still names code this way
    sources = _sources()
    missing = [f for f in files if f not in sources]
    for name in methods:
        cls, method = name.split(".")
        if not any(re.search(rf"^class {cls}\b(.(?!^class ))*?^\s+(async )?def {method}\b|"
                             rf"^class {cls}\b(.(?!^class ))*?^\s+{method}\s*[:=]", text, re.S | re.M)
                   for text in sources.values()):
            missing.append(name)
    for name in functions:
        module, function = name.split(".")
        if module == "tfpipe":  # a module or a stage's package
            if not (os.path.exists(os.path.join(ROOT, "tfpipe", f"{function}.py"))
                    or (function in SOURCE_DIRS and os.path.exists(os.path.join(ROOT, function, "__init__.py")))):
                missing.append(name)
            continue
        texts = [t for p, t in sources.items() if os.path.basename(p) == f"{module}.py"]
        if not any(re.search(rf"^(async )?def {function}\b|^{function}\s*=|^class {function}\b", t, re.M)
                   for t in texts):
            missing.append(name)
    assert not missing, f"docs/architecture.md names code that does not exist: {missing}"
