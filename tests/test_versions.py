"""tfpipe.versions: which version of a model is served, promotions, rollbacks, the history and what
--keep may remove, on plain directories (the layout is all that matters here; the server's side is
in test_second_day.py)."""

from __future__ import annotations

import os

import pytest

from tfpipe import versions


def layout(tmp_path, served=(), held=()) -> str:
    model = tmp_path / "m"
    for v in served:
        (model / str(v)).mkdir(parents=True)
    for v in held:
        (model / versions.CANDIDATES / str(v)).mkdir(parents=True)
    model.mkdir(parents=True, exist_ok=True)
    return str(model)


def state(model: str) -> tuple[list[int], list[int]]:
    return versions.numeric_versions(model), versions.candidates(model)


@pytest.mark.parametrize("served,held,want", [
    ((), (), None),
    ((1,), (), 1),
    ((1, 3, 2), (), 3),
    ((1,), (5,), 1),  # a candidate is not served, however new
])
def test_served_is_the_highest_numeric_version(tmp_path, served, held, want):
    model = layout(tmp_path, served, held)
    (tmp_path / "m" / "notes").mkdir()  # non-numeric folders are passed over, as TF Serving does
    assert versions.served(model) == want


@pytest.mark.parametrize("served,held,version,after", [
    ((1,), (2,), None, ([1, 2], [])),  # the newest candidate by default
    ((1,), (2, 3), 2, ([1, 2], [3])),
    ((1, 2, 3), (), 2, ([1, 2], [3])),  # an older numeric version: the higher one moves out, kept
    ((1, 3), (2,), 2, ([1, 2], [3])),
])
def test_promote(tmp_path, served, held, version, after):
    model = layout(tmp_path, served, held)
    entry = versions.promote(model, version, "because")
    assert state(model) == after
    assert entry["event"] == "promoted" and entry["served_before"] == max(served) and entry["reason"] == "because"
    assert versions.history(model)[-1] == entry


@pytest.mark.parametrize("served,held,version,message", [
    ((1,), (), None, "no candidate to promote"),
    ((1,), (), 7, "has no version 7"),
    ((1,), (), 1, "already the one served"),
])
def test_promote_refuses(tmp_path, served, held, version, message):
    model = layout(tmp_path, served, held)
    with pytest.raises(versions.VersionError, match=message):
        versions.promote(model, version)
    assert state(model) == (list(served), list(held))  # nothing moved


def test_rollback_goes_back_along_the_history_not_forth(tmp_path):
    model = layout(tmp_path, (1,), (2, 3))
    versions.record(model, "published", 1, "first", served_before=None)
    versions.promote(model, 2)
    versions.promote(model, 3)
    assert versions.previous(model) == 2
    entry = versions.rollback(model, reason="p99 doubled")
    assert entry["version"] == 2 and entry["rolled_back_from"] == 3 and entry["event"] == "rolled back"
    assert state(model) == ([1, 2], [3])
    versions.rollback(model)  # twice: two versions back (2 was promoted over 1), not forth to 3
    assert state(model) == ([1], [2, 3])
    with pytest.raises(versions.VersionError, match="no earlier version"):
        versions.rollback(model)
    versions.promote(model, 3)  # a rolled-back version can be promoted again
    assert versions.served(model) == 3 and versions.previous(model) == 1


def test_rollback_without_history_takes_the_next_lower_version(tmp_path):
    model = layout(tmp_path, (1, 4))
    versions.rollback(model)
    assert state(model) == ([1], [4])
    model2 = layout(tmp_path / "x", (4,), (2,))
    versions.rollback(model2, to=2)
    assert state(model2) == ([2], [4])
    with pytest.raises(versions.VersionError, match="serves no version"):
        versions.rollback(layout(tmp_path / "y"))


@pytest.mark.parametrize("served,held,keep,removed", [
    ((1, 2, 3, 4), (), 2, [1, 2]),
    ((1, 2, 3, 4), (), 1, [1, 2]),  # 3 is the rollback target (the next lower): kept with 4
    ((1, 2), (3, 4, 5), 1, [3, 4]),  # held candidates beyond the newest --keep go too
])
def test_prune_never_removes_the_served_or_the_rollback_target(tmp_path, served, held, keep, removed):
    model = layout(tmp_path, served, held)
    assert versions.prune(model, keep) == removed
    spare = versions.protected(model)
    assert versions.served(model) in spare and not spare & set(removed)


def test_prune_keeps_a_rollback_target_older_than_keep(tmp_path):
    model = layout(tmp_path, (1, 2, 3), (4,))
    versions.record(model, "published", 1, "first")
    entry = versions.promote(model, 4)
    assert entry["served_before"] == 3
    versions.rollback(model)  # 3 served again; its own predecessor from history: next lower (2)
    assert versions.served(model) == 3 and versions.previous(model) == 2
    assert 2 not in versions.prune(model, 1) and 3 not in versions.prune(model, 1)


def test_history_passes_over_a_torn_last_line(tmp_path):
    model = layout(tmp_path, (1,))
    versions.record(model, "published", 1, "first")
    with open(os.path.join(model, versions.HISTORY), "a") as f:
        f.write('{"event": "prom')  # a write cut short by a crash
    assert [e["event"] for e in versions.history(model)] == ["published"]
    versions.record(model, "held", 2, "after the crash")  # on a line of its own, not glued to the torn one
    assert [e["event"] for e in versions.history(model)] == ["published", "held"]


def test_version_path(tmp_path):
    model = layout(tmp_path, (1,), (2,))
    assert versions.version_path(model, 1) == os.path.join(model, "1")
    assert versions.version_path(model, 2) == os.path.join(model, "candidates", "2")
    with pytest.raises(versions.VersionError, match="served range 1; candidates 2"):
        versions.version_path(model, 3)
