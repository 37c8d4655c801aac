"""`ingot serve` argument parsing (the server itself is tested in tests/runtime/server)."""

import click
import pytest

from ingot.cli_serve import ByteSize


@pytest.mark.parametrize(
    ("text", "size"),
    [("256MiB", 256 << 20), ("1GiB", 1 << 30), ("500MB", 500 * 10**6), ("4096", 4096),
     ("1.5 KiB", 1536)],
)  # fmt: skip
def test_kv_cache_memory_sizes(text, size):
    assert ByteSize().convert(text, None, None) == size


@pytest.mark.parametrize("text", ["lots", "12XB", "-1MiB", ""])
def test_bad_sizes_are_refused(text):
    with pytest.raises(click.BadParameter, match="is not a size"):
        ByteSize().convert(text, None, None)


def test_kv_cache_memory_auto():
    assert ByteSize(auto=True).convert("auto", None, None) is None
    assert ByteSize(auto=True).convert("64MiB", None, None) == 64 << 20
    with pytest.raises(click.BadParameter, match="is not a size"):
        ByteSize().convert("auto", None, None)  # --max-request-bytes has no auto


def test_max_num_seqs_default_is_the_runtimes():
    # The CLI keeps its default as a literal (importing the runtime would slow `ingot --help`).
    from ingot.cli import main
    from ingot.runtime.generate import DEFAULT_MAX_NUM_SEQS

    serve = main.commands["serve"]
    [option] = [p for p in serve.params if p.name == "max_num_seqs"]
    assert option.default == DEFAULT_MAX_NUM_SEQS


def test_connection_and_tokenize_defaults_are_the_servers():
    # Literals here too, for the same reason; ServeOptions is what run_server gets.
    from ingot.cli import main
    from ingot.runtime.server.launch import ServeOptions

    defaults = {p.name: p.default for p in main.commands["serve"].params}
    options = ServeOptions()
    for name in (
        "keep_alive_timeout",
        "request_read_timeout",
        "max_tokenize_tokens",
        "scheduling_policy",
    ):
        assert defaults[name] == getattr(options, name), name


def test_scheduling_policy_is_vllms_choice():
    from ingot.cli import main
    from ingot.runtime.scheduler import SCHEDULING_POLICIES

    [option] = [p for p in main.commands["serve"].params if p.name == "scheduling_policy"]
    assert tuple(option.type.choices) == SCHEDULING_POLICIES and option.default == "fcfs"
