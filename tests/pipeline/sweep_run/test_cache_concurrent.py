"""Builds sharing one stage cache at once: each stage is computed once (the second build waits
on the key's lock and is served the entry), and the cache verifies afterwards."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

from ingot.pipeline.cache import StageCache

WORKER = "ingot.pipeline.sweep.build_worker"


def test_a_second_put_of_a_key_waits_and_is_served_the_first(tmp_path):
    cache = StageCache(tmp_path)
    inside, release = threading.Event(), threading.Event()
    produced: list[str] = []

    def produce(out: Path, who: str) -> None:
        produced.append(who)
        (out / "w.bin").write_bytes(who.encode())
        inside.set()
        release.wait(30)

    results = {}

    def put(who: str) -> None:
        results[who] = cache.get_or_put("s", "k", lambda out: produce(out, who))

    first = threading.Thread(target=put, args=("first",))
    first.start()
    assert inside.wait(30)
    second = threading.Thread(target=put, args=("second",))
    second.start()
    second.join(1.0)
    assert second.is_alive()  # waiting on the key's lock, not producing
    release.set()
    first.join()
    second.join()
    assert produced == ["first"]
    assert results["first"][1] is False and results["second"] == (results["first"][0], True)
    assert (results["second"][0] / "w.bin").read_bytes() == b"first"


def test_two_concurrent_builds_of_one_recipe_compute_each_stage_once(tmp_path, sweep_recipes):
    cache_root = tmp_path / "cache"
    children = []
    for name in ("a", "b"):
        job = {"name": name, "recipe": str(sweep_recipes["g32"]), "out": str(tmp_path / name)}
        (tmp_path / f"{name}.json").write_text(json.dumps({**job, "cache_root": str(cache_root)}))
        argv = [sys.executable, "-m", WORKER, tmp_path / f"{name}.json", tmp_path / f"{name}.out"]
        children.append(subprocess.Popen(argv))
    assert [child.wait(300) for child in children] == [0, 0]
    results = [json.loads((tmp_path / f"{n}.out").read_text()) for n in ("a", "b")]
    assert [r["error"] for r in results] == [None, None]
    computed: dict[str, int] = {}
    for result in results:
        for stage in result["stages"]:
            if stage["stage"] != "package":  # not a cached stage: each build packages its own
                computed[stage["stage"]] = computed.get(stage["stage"], 0) + (not stage["cached"])
    assert computed and set(computed.values()) == {1}  # one build computed it, the other waited
    cache = StageCache(cache_root)
    entries = [p for p in (cache_root / "stages").glob("*/*") if not p.name.startswith(".")]
    assert len(entries) == len(computed)
    for entry in entries:  # every entry is whole and matches its recorded digests
        assert cache.get(entry.parent.name, entry.name) == entry
    leftovers = [p.name for p in (cache_root / "stages").glob("*/.tmp-*")]
    assert leftovers == []
