"""The report's SVG charts: tick labels, integer axes, a second y axis, labelled points."""

from __future__ import annotations

import re

import pytest

from tfpipe.loadtest.report import _ticks, bar_chart, line_chart, plain


@pytest.mark.parametrize("value,text", [
    (1024.0, "1,024"), (123456.7, "123,457"), (20.5, "20.5"), (3.0, "3"), (0.0, "0"),
    (0.0012, "0.0012"), (0.00001, "0.00001"), (-2500.0, "-2,500"), (99.94, "99.9"),
])
def test_plain_numbers(value, text):
    assert plain(value) == text


@pytest.mark.parametrize("lo,hi,integer,ticks", [
    (1, 41, True, [1.0, 21.0, 41.0]),
    (1, 2, True, [1.0, 2.0]),  # 1.5 is no epoch
    (0, 10, False, [0.0, 5.0, 10.0]),
])
def test_ticks(lo, hi, integer, ticks):
    assert _ticks(lo, hi, integer) == ticks


def circles(svg: str) -> list[tuple[float, float]]:
    return [(float(x), float(y)) for x, y in re.findall(r'<circle cx="([\d.]+)" cy="([\d.]+)"', svg)]


def test_a_right_axis_series_is_scaled_on_its_own():
    svg = line_chart("t", "s", "req/s", [("req/s", "#111", [(0, 1000), (1, 2000)]),
                                          ("p99 ms", "#222", [(0, 5), (1, 10)], "right")],
                     integer_x=True, right_label="p99 ms")
    left, right = circles(svg)[:2], circles(svg)[2:]
    assert right[1][1] == left[1][1]  # each series' largest value at the top of its own axis
    assert right[0][1] == left[0][1]  # 5 is half of its axis as 1000 is of the other: both mid-height
    assert "p99 ms (right axis)" in svg and ">2,000<" in svg and ">10<" in svg
    assert "e+" not in svg


def test_points_carry_their_labels_in_the_given_order():
    svg = line_chart("Latency vs throughput", "requests/s", "ms",
                     [("p50", "#111", [(100, 1.0, 1), (300, 2.0, 3), (200, 1.5, 2)])])
    xs = [float(x) for x in re.search(r'points="([^"]+)"', svg)[1].replace(",", " ").split()[::2]]
    assert xs[0] < xs[2] < xs[1]  # drawn in the order given: the caller sorts by throughput
    assert [t for t in re.findall(r'font-size="9" fill="#111">(\d+)<', svg)] == ["1", "3", "2"]


def test_bar_values_are_plain_numbers():
    svg = bar_chart("Size per variant", "KB", [("savedmodel", 1017.7), ("int8", 25.5), ("rows", 3.0)])
    assert ">1,018<" in svg and ">25.5<" in svg and ">3<" in svg and "e+" not in svg
