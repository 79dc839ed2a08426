"""A journal's RemoteInfos kept as fields (`RemoteSlots.info_ids`) until a view reads one
(`RemoteSlots.info`): numbered as `info_id` numbers RemoteInfo objects, read back equal."""

from __future__ import annotations

from engine.core.events import RemoteInfo
from engine.core.live_slots import RemoteSlots


def test_fields_are_numbered_as_infos_and_read_back_equal():
    slots = RemoteSlots([])
    first = slots.info_ids("tcp://a:1", 1, [5, 5, 6], [2.5, 2.5, 3.0], ["GPU", "CPU", "GPU"])
    assert first == [1, 2, 3]
    # a batch taken over two ticks names the same info again: the same number
    assert slots.info_ids("tcp://a:1", 1, [6, 7], [3.0, 4.0], ["GPU", "GPU"]) == [3, 4]
    assert slots.info_ids("tcp://a:1", 0, [6], [3.0], ["GPU"]) == [5]  # another rank: another info
    assert type(slots.infos[0]) is tuple  # nothing made until read
    got = slots.info(2)
    assert got == RemoteInfo(source="tcp://a:1", rank=1, batch_seq=5, batch_time=2.5, medium="CPU")
    assert slots.info(2) is got


def test_a_journal_log_reads_its_infos_as_remote_infos():
    from tests.test_colpool import _synthetic
    from tests.test_live_journal import _journal_fed

    log = _journal_fed(_synthetic(60, 0), per_tick=5)
    infos = [e.remote for e in log.events if e.kind in ("block_stored", "block_evicted")]
    assert infos and all(type(i) is RemoteInfo and i.source == "tcp://10.0.0.5:5557" for i in infos)


def test_rows_released_by_the_pool_commit_with_the_times_taken_with_them():
    """A pool that released the rows taken (`release_journal`) no longer dates them
    (`times_of` refuses): `commit_journal` takes the times taken with the rows."""
    from engine.core.live_journal import commit_journal, journal_log, prepare_journal
    from tests.test_colpool import _synthetic

    frames = _synthetic(120, 3)
    logs, refused = [], 0
    for release in (False, True):
        log = journal_log(16)
        for pool, rows in journal_takes(frames, 7):
            times = pool.times_of(rows)
            prepared = prepare_journal(log, rows, pool, pool.source)
            if release:
                pool.release_journal(rows.stop)
                try:
                    pool.times_of(rows)
                except ValueError:
                    refused += 1  # the pool dropped these rows: only the times taken date them
                commit_journal(log, prepared, times=times)
            else:
                commit_journal(log, prepared)
        logs.append(log)
    kept, released = ([(e.kind, e.remote) for e in log.events if e.kind != "cache_reset"] for log in logs)
    assert refused and kept == released and len(kept) > 100
    assert len({info.batch_time for _, info in kept}) > 5


def journal_takes(frames, step):
    """A fresh journalling pool fed `step` recorded frames at a time: (pool, rows) per take
    with rows, as a GUI tick takes them."""
    from engine.remote import fastwire
    from engine.remote.overlay import journal_pool_class

    pool = journal_pool_class()("tcp://10.0.0.5:5557")
    for i in range(0, len(frames), step):
        pool.apply_many([fastwire.decode_columns(seq, payload) for seq, payload in frames[i:i + step]])
        rows = pool.take_journal()
        if len(rows):
            yield pool, rows
