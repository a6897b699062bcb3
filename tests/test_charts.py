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
    (1, 41, True, [10.0, 20.0, 30.0, 40.0]),    # 41 epochs
    (1, 2, True, [1.0, 2.0]),                   # 1.5 is no epoch
    (0, 3, True, [0.0, 1.0, 2.0, 3.0]),         # a 4-second step over time: every second, not 0, 2, 3
    (1, 13, True, [2.0, 4.0, 6.0, 8.0, 10.0, 12.0]),
    (0, 100, True, [0.0, 20.0, 40.0, 60.0, 80.0, 100.0]),
    (5, 5, True, [5.0]),
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
    assert [t for t in re.findall(r'font-size="10" fill="#111">(\d+)<', svg)] == ["1", "3", "2"]


def test_bar_values_are_plain_numbers():
    svg = bar_chart("Size per variant", "KB", [("savedmodel", 1017.7), ("int8", 25.5), ("rows", 3.0)])
    assert ">1,018<" in svg and ">25.5<" in svg and ">3<" in svg and "e+" not in svg


@pytest.mark.parametrize("value, text", [(62364, "62.4k"), (1350, "1,350"), (0.522, "0.522"), (0, "0")])
def test_axis_labels_fit_the_margin(value, text):
    from tfpipe.loadtest.report import tick

    assert tick(value) == text


def test_columns_of_figures_are_right_aligned_with_their_headers_and_text_is_left():
    from tfpipe.loadtest.report import table_html

    page = table_html(["feature", "distance", "missing", "verdict", "rate"],
                      [["island", "0.0409", "0.0%", "ok", "-"], ["sex", "1,234", "6.4%", "SKEWED: x", "-"]])
    heads = re.findall(r"<th( class=\"n\")?>(\w+)</th>", page)
    assert [(bool(c), h) for c, h in heads] == [(False, "feature"), (True, "distance"), (True, "missing"),
                                                (False, "verdict"), (False, "rate")]  # a column of '-' is no figure
    assert '<td class="n">0.0409</td>' in page and "<td>island</td>" in page
    assert "n" not in re.findall(r"<td( class=\"n\")?>", table_html(["a"], [["1"]], text=True))[0]


def test_a_paired_bar_chart_ticks_its_y_axis_and_keeps_the_legend_off_the_bars():
    from tfpipe.loadtest.report import TOP, paired_bar_chart

    svg = paired_bar_chart("year", "fraction of rows", ["<=2006", "2007", "2008", ">=2009"],
                           [("training", "#1f77b4", [0.0, 0.3, 0.3, 0.4]), ("served", "#d62728", [0, 0.2, 0.4, 0.4])])
    assert [t for t in re.findall(r'font-size="10">([\d.]+)</text>', svg)] == ["0", "0.2", "0.4"]
    legend_y = [float(y) for y in re.findall(r'<rect x="[\d.]+" y="([\d.]+)" width="10" height="10"', svg)]
    bar_tops = [float(y) for y in re.findall(r'<rect x="[\d.]+" y="([\d.]+)" width="[\d.]+" height="[\d.]+" '
                                             r'fill="#\w+"><title>', svg)]
    assert max(y + 10 for y in legend_y) <= TOP <= min(bar_tops)
    assert 'font-size="11" transform="rotate(-35' in svg  # bin labels at a readable size


def test_line_chart_legend_sits_above_the_plot():
    from tfpipe.loadtest.report import TOP, line_chart

    svg = line_chart("Latency", "requests/s", "ms", [("p50", "#1", [(1, 1, "1"), (2, 5, "2")]),
                                                     ("p99.9", "#2", [(1, 2), (2, 9, "2")])])
    legend_y = [float(y) for y in re.findall(r'<rect x="[\d.]+" y="([\d.]+)" width="10" height="10"', svg)]
    point_y = [float(y) for y in re.findall(r'<circle cx="[\d.]+" cy="([\d.]+)"', svg)]
    assert len(legend_y) == 2 and max(y + 10 for y in legend_y) <= TOP <= min(point_y)
