"""The plug-in registry: built-ins by module path, lazy imports, entry points, clear errors."""

from __future__ import annotations

import sys
import types

import pytest

from ingot.common import IngotError, Registry, UnknownPlugin


@pytest.fixture
def plugin_module(monkeypatch):
    module = types.ModuleType("ingot_test_plugin")
    module.PLUGIN = object()
    monkeypatch.setitem(sys.modules, "ingot_test_plugin", module)
    return module


def test_get_returns_the_modules_plugin(plugin_module):
    registry = Registry("widget", {"toy": "ingot_test_plugin"})
    assert registry.get("toy") is plugin_module.PLUGIN
    assert "toy" in registry and registry.names() == ("toy",)
    assert list(registry) == [plugin_module.PLUGIN]


def test_unknown_name_is_a_user_error_listing_the_known_ones(plugin_module):
    registry = Registry("widget", {"toy": "ingot_test_plugin", "other": "ingot_test_plugin"})
    with pytest.raises(UnknownPlugin) as caught:
        registry.get("tensorrt")
    assert isinstance(caught.value, IngotError)
    assert str(caught.value) == "unknown widget 'tensorrt' (known: toy, other)"


def test_modules_are_imported_only_when_asked_for():
    registry = Registry("widget", {"missing": "ingot_no_such_module_anywhere"})
    assert registry.names() == ("missing",)  # naming costs no import
    with pytest.raises(ModuleNotFoundError):
        registry.get("missing")


def test_a_module_without_plugin_is_refused(monkeypatch):
    monkeypatch.setitem(sys.modules, "ingot_test_empty", types.ModuleType("ingot_test_empty"))
    with pytest.raises(TypeError, match="defines PLUGIN"):
        Registry("widget", {"empty": "ingot_test_empty"}).get("empty")


def test_entry_points_add_plugins_after_the_builtins(monkeypatch, plugin_module):
    from importlib.metadata import EntryPoint

    point = EntryPoint("external", "ingot_test_plugin:PLUGIN", "ingot.test_widgets")
    monkeypatch.setattr(
        "ingot.common.registry.entry_points",
        lambda group: [point] if group == "ingot.test_widgets" else [],
    )
    registry = Registry("widget", {"toy": "ingot_test_plugin"}, group="ingot.test_widgets")
    assert registry.names() == ("toy", "external")
    assert registry.get("external") is plugin_module.PLUGIN
