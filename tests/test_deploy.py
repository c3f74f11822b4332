"""Deploying to a Space: the dry run (offline, as CI runs it), the LFS rules, the front matter, and a
whole deploy against a fake Hub that answers the hub client's HTTP requests (nothing leaves the machine)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx2
import pytest
import yaml
from huggingface_hub import constants as hub_constants
from huggingface_hub.utils import _http as hub_http

from app import MODEL_ENV
from scripts import deploy
from scripts.deploy import (
    DeployError,
    hub_models,
    lfs_rule_for,
    lfs_rules,
    make_plan,
    space_readme,
    split_front_matter,
    tracked_files,
)

ROOT = Path(__file__).resolve().parent.parent
GIT = shutil.which("git")
needs_git = pytest.mark.skipif(GIT is None, reason="deploy uploads what git tracks; git is not installed")


def front_matter(readme: str) -> dict:
    lines, _ = split_front_matter(readme)
    return yaml.safe_load("\n".join(lines))


# ----- what ships, and the LFS rules -----
@needs_git
def test_dry_run_lists_every_file_and_sends_every_binary_through_lfs():
    """The command as the README writes it, offline, in a fresh process."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "scripts.deploy", "--space", "USER/NAME", "--dry-run"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    listed = {}
    for line in done.stdout.splitlines():
        match = re.match(r"\s+([\d.]+ [kM]B)\s+(Xet/LFS|git)\s+(\S+)", line)
        if match:
            listed[match.group(3)] = match.group(2)
    plan = make_plan("USER/NAME")
    assert set(listed) == {f.path for f in plan.files}
    for f in plan.files:
        assert listed[f.path] == ("Xet/LFS" if f.binary else "git"), f.path
    assert listed["assets/models/austen/model.safetensors"] == "Xet/LFS"
    assert listed["app.py"] == "git" and listed["requirements.txt"] == "git" and "LICENSE" in listed
    assert not [p for p in listed if p.startswith(("tests/", ".ci/", "scripts/"))]
    assert "every binary matches a .gitattributes LFS rule" in done.stdout


@needs_git
def test_every_binary_git_tracks_has_an_lfs_rule():
    """Not only what the Space gets: anyone pushing this repository with git-lfs needs every rule."""
    rules = lfs_rules(ROOT)
    unrouted = [p for p in tracked_files(ROOT)
                if (ROOT / p).is_file() and deploy.is_binary(ROOT / p) and lfs_rule_for(p, rules) is None]
    assert unrouted == []
    for pattern in ("*.safetensors", "*.pt", "*.bin", "*.gguf", "*.png"):
        assert (pattern, True) in rules


@needs_git
def test_lfs_rule_matching_agrees_with_git(tmp_path):
    (tmp_path / ".gitattributes").write_text(
        "*.bin filter=lfs diff=lfs merge=lfs -text\n"
        "weights/**/*.json filter=lfs -text\n"
        "/top.dat filter=lfs\n"
        "keep/*.bin -filter\n"
        "*.md text\n")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    paths = ["a.bin", "deep/dir/a.bin", "keep/a.bin", "keep/sub/a.bin", "weights/x.json", "weights/a/b/x.json",
             "x.json", "top.dat", "sub/top.dat", "README.md"]
    out = subprocess.run(["git", "-C", str(tmp_path), "check-attr", "filter", "--", *paths],
                         capture_output=True, text=True, check=True).stdout
    by_git = {line.split(": ")[0]: line.split(": ")[2] == "lfs" for line in out.splitlines()}
    rules = lfs_rules(tmp_path)
    assert {p: lfs_rule_for(p, rules) is not None for p in paths} == by_git
    # And for every file this repository ships.
    shipped = [f.path for f in make_plan("USER/NAME").files]
    out = subprocess.run(["git", "-C", str(ROOT), "check-attr", "filter", "--", *shipped],
                         capture_output=True, text=True, check=True).stdout
    by_git = {line.split(": ")[0]: line.split(": ")[2] == "lfs" for line in out.splitlines()}
    rules = lfs_rules(ROOT)
    assert {p: lfs_rule_for(p, rules) is not None for p in shipped} == by_git


@needs_git
def test_a_binary_without_an_lfs_rule_stops_the_deploy(tmp_path, monkeypatch, capsys):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "README.md").write_text("---\ntitle: t\nsdk: gradio\n---\n# t\n")
    (repo / "weights.dat").write_bytes(b"\x00\x01binary")
    (repo / "notes.txt").write_text("text\n")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "."], check=True)
    monkeypatch.setattr(deploy, "ROOT", repo)
    monkeypatch.setattr(deploy, "make_plan",
                        lambda space, hardware=None, model=None: make_plan(space, hardware, root=repo, model=model))
    assert deploy.main(["--space", "USER/NAME", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "weights.dat: binary, but no .gitattributes LFS rule matches it" in err and "notes.txt" not in err


@pytest.mark.parametrize("argv, message", [
    (["--space", "no-slash", "--dry-run"], "must be USER/NAME"),
    (["--space", "USER/NAME", "--hardware", "a10g-tiny", "--dry-run"], "unknown hardware 'a10g-tiny'"),
])
def test_bad_arguments_are_one_line(capsys, argv, message):
    assert deploy.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


# ----- the front matter and the licence -----
def test_readme_front_matter_names_every_hub_model_and_the_licence():
    meta = front_matter((ROOT / "README.md").read_text(encoding="utf-8"))
    assert meta["license"] == "apache-2.0" and meta["sdk"] == "gradio" and meta["app_file"] == "app.py"
    assert meta["models"] == hub_models()
    assert "HuggingFaceTB/SmolLM2-135M-Instruct" in meta["models"]
    assert {"lmsys/vicuna-7b-v1.3", "FasterDecoding/medusa-1.0-zephyr-7b-beta"} <= set(meta["models"])
    licence = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in licence and "Version 2.0, January 2004" in licence and "END OF TERMS" in licence


def test_space_readme_sets_hardware_and_keeps_the_rest():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for hardware in ("zero-a10g", "l4x1"):
        out = space_readme(readme, hardware)
        meta = front_matter(out)
        assert meta["suggested_hardware"] == hardware and meta["models"] == hub_models()
        assert meta["title"] == front_matter(readme)["title"]
        assert split_front_matter(out)[1] == split_front_matter(readme)[1]
    assert space_readme(readme, None) == readme  # the README already says what a deploy would write
    bare = space_readme("---\ntitle: x\nsdk: gradio\n---\nbody\n", None)
    assert front_matter(bare) == {"title": "x", "sdk": "gradio", "license": "apache-2.0", "models": hub_models()}
    with pytest.raises(DeployError, match="no front matter"):
        space_readme("# no front matter\n", None)


# ----- a whole deploy against a fake Hub -----
class FakeHub:
    """Answers the requests the hub client makes to create a Space, set its hardware and commit files,
    the way the Hub does: binary samples and files over 10 MB are told to go through LFS."""

    def __init__(self, space: str, remote_files: list[str], refuse_create: int | None = None) -> None:
        self.space, self.remote_files, self.refuse_create = space, remote_files, refuse_create
        self.created: dict | None = None
        self.hardware: dict | None = None
        self.variables: dict[str, str] = {}
        self.lfs_modes: dict[str, str] = {}
        self.lfs_store: dict[str, bytes] = {}
        self.commit: list[dict] = []
        self.unexpected: list[str] = []
        self.authorizations: set[str | None] = set()

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        path, method = request.url.path, request.method
        if not path.startswith("/fake-lfs/"):  # storage URLs are presigned: no token goes there
            self.authorizations.add(request.headers.get("authorization"))
        space = self.space
        if request.url.host != "huggingface.co":
            self.unexpected.append(str(request.url))
            return httpx2.Response(404)
        if (method, path) == ("POST", "/api/repos/create"):
            if self.refuse_create:
                return httpx2.Response(self.refuse_create, json={"error": "Invalid credentials"})
            self.created = json.loads(request.content)
            return httpx2.Response(200, json={"url": f"https://huggingface.co/spaces/{space}"})
        if (method, path) == ("POST", f"/api/spaces/{space}/hardware"):
            self.hardware = json.loads(request.content)
            return httpx2.Response(200, json={"stage": "BUILDING", "hardware": {"requested": self.hardware["flavor"]}})
        if (method, path) == ("POST", f"/api/spaces/{space}/variables"):
            variable = json.loads(request.content)
            self.variables[variable["key"]] = variable["value"]
            return httpx2.Response(200, json={k: {"value": v} for k, v in self.variables.items()})
        if method == "GET" and path.startswith(f"/api/spaces/{space}/tree/main"):
            return httpx2.Response(200, json=[{"type": "file", "path": p, "size": 1, "oid": "0" * 40}
                                              for p in self.remote_files])
        if (method, path) == ("POST", "/api/validate-yaml"):
            yaml.safe_load(json.loads(request.content)["content"].split("---\n")[1])  # raises if broken
            return httpx2.Response(200, json={"errors": [], "warnings": []})
        if (method, path) == ("POST", f"/api/spaces/{space}/preupload/main"):
            files = json.loads(request.content)["files"]
            for f in files:
                sample = base64.b64decode(f["sample"])
                binary = b"\0" in sample or not _utf8(sample)
                self.lfs_modes[f["path"]] = "lfs" if binary or f["size"] >= 10 * 1024 * 1024 else "regular"
            return httpx2.Response(200, json={"files": [
                {"path": f["path"], "uploadMode": self.lfs_modes[f["path"]], "shouldIgnore": False} for f in files]})
        if (method, path) == ("POST", f"/spaces/{space}.git/info/lfs/objects/batch"):
            objects = json.loads(request.content)["objects"]
            return httpx2.Response(200, json={"transfer": "basic", "objects": [
                {"oid": o["oid"], "size": o["size"],
                 "actions": {"upload": {"href": f"https://huggingface.co/fake-lfs/{o['oid']}"}}} for o in objects]})
        if method == "PUT" and path.startswith("/fake-lfs/"):
            self.lfs_store[path.rsplit("/", 1)[1]] = request.read()
            return httpx2.Response(200)
        if (method, path) == ("POST", f"/api/spaces/{space}/commit/main"):
            self.commit = [json.loads(line) for line in request.content.decode().splitlines()]
            return httpx2.Response(200, json={"commitUrl": f"https://huggingface.co/spaces/{space}/commit/abc",
                                              "commitOid": "abc123", "pullRequestUrl": None})
        self.unexpected.append(f"{method} {request.url}")
        return httpx2.Response(404, json={"error": "not faked"})


def _utf8(sample: bytes) -> bool:
    try:
        sample.decode("utf-8")
    except UnicodeDecodeError as e:
        return e.start >= len(sample) - 3  # a character cut at the sample's end
    return True


@pytest.fixture
def fake_hub(monkeypatch):
    """Route the hub client's HTTP session to a FakeHub; the legacy LFS protocol instead of Xet's
    (HF_HUB_DISABLE_XET), whose transfers happen in native code outside the Python session."""
    hubs = []

    def install(hub: FakeHub) -> FakeHub:
        hub_http.set_client_factory(lambda: httpx2.Client(transport=httpx2.MockTransport(hub), follow_redirects=True))
        hubs.append(hub)
        return hub

    monkeypatch.setattr(hub_constants, "HF_HUB_DISABLE_XET", True)
    yield install
    hub_http.set_client_factory(hub_http.default_client_factory)


@needs_git
def test_deploy_uploads_the_app_in_one_commit(fake_hub, capsys):
    space = "someone/medusa-playground"
    hub = fake_hub(FakeHub(space, remote_files=["README.md", ".gitattributes", "app/old_module.py"]))
    code = deploy.main(["--space", space, "--hardware", "a10g-small", "--model", "medusa-vicuna-7b-v1.3",
                        "--token", "hf_fake_token"])
    out = capsys.readouterr().out
    assert code == 0
    assert hub.unexpected == []
    assert hub.authorizations == {"Bearer hf_fake_token"}
    assert hub.created == {"name": "medusa-playground", "organization": "someone", "type": "space",
                           "sdk": "gradio", "hardware": "a10g-small"}
    assert hub.hardware == {"flavor": "a10g-small"}
    assert hub.variables == {MODEL_ENV: "medusa-vicuna-7b-v1.3"}  # the variable app/models.py reads
    assert out.strip().endswith(f"https://huggingface.co/spaces/{space}")

    plan = make_plan(space, "a10g-small")
    header, *entries = hub.commit
    assert header["key"] == "header" and header["value"]["summary"].startswith("Deploy Medusa Playground")
    by_path = {e["value"]["path"]: e for e in entries}
    assert set(by_path) == {f.path for f in plan.files} | {"app/old_module.py"}
    assert by_path["app/old_module.py"]["key"] == "deletedFile"
    for f in plan.files:
        entry = by_path[f.path]
        assert hub.lfs_modes[f.path] == ("lfs" if f.through_lfs else "regular"), f.path
        if f.through_lfs:  # the bytes went to LFS storage, the commit holds their sha256
            data = hub.lfs_store[entry["value"]["oid"]]
            assert entry["key"] == "lfsFile" and hashlib.sha256(data).hexdigest() == entry["value"]["oid"]
            assert data == (ROOT / f.path).read_bytes()
        else:
            assert entry["key"] == "file"
            content = base64.b64decode(entry["value"]["content"])
            assert content == (plan.readme.encode() if f.path == "README.md" else (ROOT / f.path).read_bytes())
    assert set(hub.lfs_store) == {by_path[f.path]["value"]["oid"] for f in plan.files if f.through_lfs}
    assert front_matter(base64.b64decode(by_path["README.md"]["value"]["content"]).decode())[
        "suggested_hardware"] == "a10g-small"


@needs_git
def test_a_refusal_from_the_hub_is_one_line(fake_hub, capsys):
    hub = fake_hub(FakeHub("someone/x", remote_files=[], refuse_create=401))
    assert deploy.main(["--space", "someone/x", "--token", "hf_bad"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the Hub refused") and len(err.strip().splitlines()) == 1
    assert hub.commit == []


@pytest.mark.parametrize("model, data_licence", [
    ("austen", "public domain"),
    ("stdlib", "Python Software Foundation License Version 2"),
    ("stdlib-deep", "Python Software Foundation License Version 2"),
])
def test_each_model_card_states_its_data_and_weights_licences(model, data_licence):
    card = (ROOT / "assets" / "models" / model / "README.md").read_text(encoding="utf-8")
    assert front_matter(card)["license"] == "apache-2.0"
    text = " ".join(split_front_matter(card)[1].split())
    assert data_licence in text and "under Apache-2.0, the project's licence" in text
    assert "not been chosen" not in text
