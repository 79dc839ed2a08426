"""`python -m engine.warmup` without arguments: its parts in processes side by side."""

from __future__ import annotations

import io


def test_the_groups_run_every_part_once():
    from engine import warmup

    grouped = [name for group in warmup.GROUPS for name in group]
    assert sorted(grouped) == sorted(name for name, _ in warmup.PARTS)
    assert len(warmup.GROUPS) == 2  # one process a core on the 2-core machines it is made for


def test_each_process_that_fails_is_named_in_one_line():
    from engine import warmup

    out, err = io.StringIO(), io.StringIO()
    # an unknown part makes its child exit 2 at once, as a crash would, and compiles nothing
    crashed = warmup.warm_side_by_side((("no such part",), ("nor this",)), out, err)
    assert crashed == 2
    lines = err.getvalue().splitlines()
    assert len(lines) == 4 and "no part named 'no such part'" in lines[0] and "no part named 'nor this'" in lines[2]
    assert "the process for no such part ended with exit status 2" in lines[1]
    assert "the process for nor this ended with exit status 2" in lines[3]
    assert out.getvalue() == ""
