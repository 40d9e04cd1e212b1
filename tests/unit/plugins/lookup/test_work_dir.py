"""The work_dir lookup: the one default of the controller's work directory."""

import pytest
from ansible.errors import AnsibleLookupError

from ansible_collections.orbite.qualification.plugins.lookup.work_dir import LookupModule, default_work_dir


def test_environment_variable_wins():
    assert default_work_dir({"ORBITE_WORK_DIR": "/srv/orbite", "XDG_CACHE_HOME": "/c"}) == "/srv/orbite"


def test_xdg_cache_then_home(monkeypatch):
    assert default_work_dir({"XDG_CACHE_HOME": "/c"}) == "/c/orbite"
    monkeypatch.setenv("HOME", "/home/lab")
    assert default_work_dir({}) == "/home/lab/.cache/orbite"


@pytest.mark.parametrize("environ", [{"ORBITE_WORK_DIR": "relative/dir"}, {"XDG_CACHE_HOME": "cache"}])
def test_relative_is_an_error_naming_the_variable(environ):
    with pytest.raises(AnsibleLookupError, match="must be an absolute path"):
        default_work_dir(environ)


def test_terms_join_below_and_never_escape(monkeypatch):
    monkeypatch.setenv("ORBITE_WORK_DIR", "/w")
    assert LookupModule().run(["runs", "r1"]) == ["/w/runs/r1"]
    for bad in ("/etc", "../up", "a/../../b"):
        with pytest.raises(AnsibleLookupError, match="relative path without"):
            LookupModule().run([bad])
