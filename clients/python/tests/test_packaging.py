"""The package as installed from its wheel (``scripts/python-package``):
imported from the environment's site-packages, not the source tree, with
its schemas inside it."""

import os
import pathlib

import pytest

import flotilla_client
from flotilla_client.wire import SCHEMAS, schema_text


@pytest.mark.skipif(os.environ.get("FLOTILLA_PACKAGE_INSTALLED") != "1",
                    reason="run from the source tree, not from an installed wheel")
def test_the_package_is_the_installed_wheel_with_its_schemas_inside():
    installed = pathlib.Path(flotilla_client.__file__).resolve()
    assert "site-packages" in installed.parts, installed
    assert SCHEMAS.is_dir() and not SCHEMAS.is_symlink(), SCHEMAS
    assert SCHEMAS.parent == installed.parent
    for name in ("WorkflowRunRequest", "WorkflowRunEvent", "WorkflowRunSignal"):
        assert f'"name": "{name}"' in schema_text(name)
    assert (installed.parent / "py.typed").is_file()
