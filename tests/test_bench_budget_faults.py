"""Measurement 7's information row on fresh memory (issue 19, wave 7): the fault counting."""

from __future__ import annotations

import mmap
import sys

import pytest

from benchmarks import bench_budget

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_NOHUGEPAGE"),
    reason="counts 4 KiB-page faults of an anonymous mapping: Linux only",
)

PAGES = 300


def _touch_fresh_pages() -> None:
    """Write one byte into each page of a fresh anonymous mapping (one fault per page)."""
    m = mmap.mmap(-1, PAGES * mmap.PAGESIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    m.madvise(mmap.MADV_NOHUGEPAGE)  # small pages even where huge pages are always on
    for i in range(PAGES):
        m[i * mmap.PAGESIZE] = 1
    m.close()


def test_counting_faults_sees_every_fresh_page_written():
    faults: list[int] = []
    bench_budget._counting_faults(_touch_fresh_pages, faults)()
    bench_budget._counting_faults(lambda: None, faults)()
    assert len(faults) == 2
    assert faults[0] >= PAGES  # the kernel maps each written page on its first write
    assert faults[1] < PAGES  # a call that writes no new memory


def test_fresh_row_is_the_median_in_mib():
    class _Pair:
        label = "pair"

    faults = {"budget": [512, 256, 2048, 1, 256], "plain3": [0, 3, 0, 0, 1]}
    row = bench_budget._fresh_row(_Pair(), faults, quick=True)
    # the median of 1, 256, 256, 512, 2048 pages is 256; 256 pages × page size, in MiB
    assert row.value == 256 * mmap.PAGESIZE / 1048576
    assert row.unit == "MiB" and row.status == "info" and row.target == ""
    assert row.extra["minor_faults"] == faults
