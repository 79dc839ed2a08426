"""`commit_journal` writes what `prepare_journal` read of the journal (its row fields as
contiguous arrays, the tick's batch and tier pairs, the table's seqs and stores' ids), so
the thread that owns the log reads none of the journal's row fields again."""

from __future__ import annotations

from engine.core.live_journal import JOURNAL_ROW_FIELDS


class _Sealed:
    """A journal whose row fields can be sealed: reading one then raises."""

    def __init__(self, journal) -> None:
        object.__setattr__(self, "_journal", journal)
        object.__setattr__(self, "sealed", False)

    def __len__(self) -> int:
        return len(self._journal)

    def __getattr__(self, name):
        if self.sealed and name in JOURNAL_ROW_FIELDS:
            raise AssertionError(f"the commit read the journal's {name!r} again")
        return getattr(self._journal, name)


def test_the_commit_reads_no_row_field_and_writes_the_same_log():
    from engine.core.live_journal import append_journal, commit_journal, journal_log, prepare_journal
    from tests.test_colpool import _synthetic
    from tests.test_commit_infos import journal_takes

    frames = _synthetic(150, 4)
    logs = []
    for sealed in (False, True):
        log = journal_log(16)
        for pool, rows in journal_takes(frames, 9):
            if not sealed:
                append_journal(log, rows, pool, pool.source)
                continue
            times = pool.times_of(rows)
            journal = _Sealed(rows)
            prepared = prepare_journal(log, journal, pool, pool.source)
            object.__setattr__(journal, "sealed", True)
            commit_journal(log, prepared, times=times)
        logs.append(log)
    plain, sealed_log = logs
    assert len(plain) > 200 and len(plain) == len(sealed_log)
    for name in ("kind", "seq", "request", "block", "hash", "a", "b", "flag"):
        assert (plain.columnar.col(name) == sealed_log.columnar.col(name)).all(), name
    assert [(e.kind, e.remote) for e in plain.events] == [(e.kind, e.remote) for e in sealed_log.events]
