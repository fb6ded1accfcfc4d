"""Modules that moved into packages still import by their old names for one release, as the same
module (so patching either name patches both), with a ``DeprecationWarning`` naming the new path;
raysim itself uses none of the old names."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import pytest

from raysim._moved import MOVED
from tests.conftest import ROOT


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_module_name_is_the_new_module_with_a_warning(old):
    sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert module is importlib.import_module(MOVED[old])
    assert module.__spec__.name == MOVED[old]  # the new module keeps its own spec
    assert any(
        issubclass(w.category, DeprecationWarning) and MOVED[old] in str(w.message) for w in seen
    )


def test_raysim_imports_none_of_the_old_names():
    """Every module of raysim imported in a fresh process, a moved name's warning an error."""
    code = (
        "import importlib, pkgutil, warnings\n"
        "warnings.filterwarnings('error', message='.* moved to raysim')\n"
        "import raysim\n"
        "for m in pkgutil.walk_packages(raysim.__path__, 'raysim.'):\n"
        "    if m.name != 'raysim._moved':\n"
        "        importlib.import_module(m.name)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]


def test_the_old_flat_names_of_raysim_tracking_still_resolve_with_a_warning():
    import raysim.tracking
    from raysim.tracking import store, tracker

    with pytest.warns(DeprecationWarning, match="raysim.tracking.store.open_store"):
        assert raysim.tracking.open_store is store.open_store
    with pytest.warns(DeprecationWarning, match="raysim.tracking.tracker.Tracker"):
        assert raysim.tracking.Tracker is tracker.Tracker
    with pytest.raises(AttributeError):
        raysim.tracking.no_such_name  # noqa: B018
