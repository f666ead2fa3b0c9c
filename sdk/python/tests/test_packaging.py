"""The package's version is the crate's, and the scripts ship inside it."""

from __future__ import annotations

import re
import tomllib

import delayq
from conftest import REPO, SDK_DIR


def test_version_is_the_crates():
    cargo = (REPO / "Cargo.toml").read_text()
    crate = re.search(r'(?ms)^\[package\].*?^version\s*=\s*"([^"]+)"', cargo).group(1)
    py = tomllib.loads((SDK_DIR / "pyproject.toml").read_text())["project"]["version"]
    assert py == crate
    assert delayq.__version__ == crate


def test_scripts_are_package_data():
    py = tomllib.loads((SDK_DIR / "pyproject.toml").read_text())
    assert "lua/*.lua" in py["tool"]["setuptools"]["package-data"]["delayq"]
    assert delayq._core.ENQUEUE.text.startswith(b"-- enqueue.lua")


def test_the_readme_example_runs(redis_server, ns):
    from conftest import create_queue

    text = (SDK_DIR / "README.md").read_text()
    code = text.split("## Ten lines", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    code = code.replace('delayq.Client("redis://127.0.0.1:6379")', f'delayq.Client("{redis_server.url}", namespace="{ns}")')
    create_queue(redis_server.url, ns, "order-close", shards=2)
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    order = scope["order"]
    assert order.id == "order-1235" and order.payload == {"amount": 123456789012345678901234567890}
    scope["client"].close()
