"""Fetch vLLM's source distribution once and keep only the test files the scheduler tests import.

The wheel has no `tests/`; the sdist on the package registry does. Building the sdist (what
`pip download` attempts) is neither needed nor possible here, so the file itself is fetched
through the registry's simple index (PEP 691 JSON, PEP 503 HTML as fallback), its sha256
checked against the index, and the import closure of the test modules extracted into a cache
directory. The tarball is then deleted: the cache holds a few hundred kilobytes, not 45 MB.
"""

from __future__ import annotations

import ast
import hashlib
import html.parser
import json
import os
import shutil
import tarfile
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path

from schedir.tools.vllm_tests import TEST_FILES, VLLM_VERSION

DEFAULT_INDEX = "https://pypi.org/simple"
MARKER = ".schedir-complete.json"
"""Written last into the cache directory: its presence means the extraction finished."""

HF_MODEL_ID = "facebook/opt-125m"
"""The model id `tests/v1/core/utils.py:create_scheduler` names by default."""

# Architecture facts of OPT-125m, written by hand: ModelConfig only reads the config, never weights.
HF_CONFIG: dict[str, object] = {
    "architectures": ["OPTForCausalLM"],
    "model_type": "opt",
    "activation_function": "relu",
    "bos_token_id": 2,
    "eos_token_id": 2,
    "pad_token_id": 1,
    "do_layer_norm_before": True,
    "enable_bias": True,
    "ffn_dim": 3072,
    "hidden_size": 768,
    "word_embed_proj_dim": 768,
    "max_position_embeddings": 2048,
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "vocab_size": 50272,
    "torch_dtype": "float16",
}


class FetchError(RuntimeError):
    """The sdist could not be fetched or unpacked (no network, index without the file, bad hash)."""


def cache_root() -> Path:
    """`$SCHEDIR_CACHE`, else `$XDG_CACHE_HOME/schedir`, else `~/.cache/schedir`."""
    if env := os.environ.get("SCHEDIR_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "schedir"


def index_url() -> str:
    """The simple index to ask: `$SCHEDIR_PYPI_SIMPLE`, else pip's `$PIP_INDEX_URL`, else PyPI."""
    return (os.environ.get("SCHEDIR_PYPI_SIMPLE") or os.environ.get("PIP_INDEX_URL") or DEFAULT_INDEX).rstrip("/")


class _Links(html.parser.HTMLParser):
    """Anchors of a PEP 503 project page: (filename, href)."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []
        self._href: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._href = dict(attrs).get("href")

    def handle_data(self, data: str) -> None:
        if self._href is not None:
            self.links.append((data.strip(), self._href))
            self._href = None


def sdist_url(version: str = VLLM_VERSION, timeout: float = 60.0) -> tuple[str, str | None]:
    """URL and sha256 (None when the index gives none) of `vllm-<version>.tar.gz`."""
    filename = f"vllm-{version}.tar.gz"
    page = f"{index_url()}/vllm/"
    req = urllib.request.Request(page, headers={"Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.5"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            ctype = resp.headers.get("content-type", "")
            body = resp.read()
    except OSError as e:
        raise FetchError(f"cannot read the package index {page}: {e}") from e
    if "json" in ctype:
        for f in json.loads(body)["files"]:
            if f["filename"] == filename:
                return f["url"], f.get("hashes", {}).get("sha256")
    else:
        parser = _Links()
        parser.feed(body.decode("utf-8", "replace"))
        for name, href in parser.links:
            if name == filename:
                url, _, frag = urllib.parse.urljoin(page, href).partition("#")
                sha = frag.split("=", 1)[1] if frag.startswith("sha256=") else None
                return url, sha
    raise FetchError(f"{page} lists no {filename}")


def _module_files(module: str, names: Iterable[str], members: set[str], prefix: str) -> list[str]:
    """Sdist paths that `from <module> import <names>` may load (module and submodules)."""
    base = prefix + module.replace(".", "/")
    out = [p for p in (base + ".py", base + "/__init__.py") if p in members]
    out += [p for n in names if (p := f"{base}/{n}.py") in members]
    return out


def import_closure(members: set[str], read: Callable[[str], str], prefix: str) -> list[str]:
    """The test modules plus every `tests.*` file they import (at any depth), with package `__init__`s.

    `read(path)` returns a member's source text; `prefix` is the tarball's top folder + '/'.
    """
    todo = [prefix + f for f in TEST_FILES]
    seen: set[str] = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        # Every enclosing package's __init__.py (the tests import each other as `tests.v1...`).
        parts = path[len(prefix) :].split("/")[:-1]
        for i in range(1, len(parts) + 1):
            init = prefix + "/".join(parts[:i]) + "/__init__.py"
            if init in members:
                todo.append(init)
        package = ".".join(parts)
        for node in ast.walk(ast.parse(read(path))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    pkg = package.split(".")
                    pkg = pkg[: len(pkg) - node.level + 1]
                    module = ".".join(pkg + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                names = [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                module, names = "", []
                for a in node.names:
                    if a.name.split(".")[0] == "tests":
                        todo += _module_files(a.name, [], members, prefix)
                continue
            else:
                continue
            if module.split(".")[0] == "tests":
                todo += _module_files(module, names, members, prefix)
    return sorted(seen)


def ensure_sources(version: str = VLLM_VERSION, refresh: bool = False) -> Path:
    """The cached source root (holding `tests/`), fetching and extracting it if needed."""
    root = cache_root() / f"vllm-{version}-src"
    if (root / MARKER).exists() and not refresh and all((root / f).exists() for f in TEST_FILES):
        return root
    url, sha = sdist_url(version)
    root.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root.parent) as tmp:
        tarball = Path(tmp) / f"vllm-{version}.tar.gz"
        try:
            with urllib.request.urlopen(url, timeout=300) as resp, tarball.open("wb") as out:
                shutil.copyfileobj(resp, out)
        except OSError as e:
            raise FetchError(f"cannot download {url}: {e}") from e
        digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
        if sha is not None and digest != sha:
            raise FetchError(f"{url}: sha256 {digest} but the index says {sha}")
        prefix = f"vllm-{version}/"
        with tarfile.open(tarball) as tar:
            by_name = {m.name: m for m in tar.getmembers() if m.isfile()}

            def read(path: str) -> str:
                f = tar.extractfile(by_name[path])
                assert f is not None
                return f.read().decode("utf-8")

            wanted = import_closure(set(by_name), read, prefix)
            staging = Path(tmp) / "src"
            for name in wanted:
                dest = staging / name[len(prefix) :]
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_text(read(name), encoding="utf-8")
        (staging / MARKER).write_text(
            json.dumps({"url": url, "sha256": digest, "files": [n[len(prefix) :] for n in wanted]}, indent=1)
        )
        if root.exists():
            shutil.rmtree(root)
        staging.rename(root)
    return root


def ensure_hf_cache() -> Path:
    """An `HF_HOME` whose hub cache holds a hand-written config for `HF_MODEL_ID` (no weights, no tokenizer)."""
    home = cache_root() / "hf-offline"
    repo = home / "hub" / ("models--" + HF_MODEL_ID.replace("/", "--"))
    snapshot = repo / "snapshots" / "schedir-offline"
    snapshot.mkdir(parents=True, exist_ok=True)
    (snapshot / "config.json").write_text(json.dumps(HF_CONFIG, indent=1))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text("schedir-offline")
    return home
