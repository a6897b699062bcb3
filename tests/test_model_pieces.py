"""The pure pieces between a user's table and its model, each on its own table: graph names for
any column name, the one-line error of a failed step, defaults that follow the data's size,
the trivial baseline, and the export gate's noise bound. They run in milliseconds."""

from __future__ import annotations

import re

import pytest

# ---- column names inside TensorFlow graphs -----------------------------------------------------------

_TF_SCOPE = re.compile(r"^[A-Za-z0-9.][A-Za-z0-9_.\\/>-]*$")  # what TensorFlow takes as a scope name


@pytest.mark.parametrize("names, expected", [
    (["bill_length_mm", "Sepal.Length", "x-1"], ["bill_length_mm", "Sepal.Length", "x-1"]),  # taken as they are
    (["wind speed"], ["wind_speed"]),
    (["humidité"], ["humidite"]),
    (["norm_température moyenne"], ["norm_temperature_moyenne"]),
    (["a b", "a_b"], ["a_b_2", "a_b"]),  # a name TensorFlow takes keeps it; the other gets a suffix
    (["a b", "a/b", "a:b"], ["a_b", "a_b_2", "a_b_3"]),
    (["", "日本", "_x", "-x"], ["column", "column_2", "x", "c-x"]),
])
def test_every_column_name_has_a_unique_graph_name(names, expected):
    from tfpipe.pipeline.schema import graph_names

    got = graph_names(names)
    assert [got[n] for n in names] == expected
    assert all(_TF_SCOPE.match(g) for g in got.values())
    assert len(set(got.values())) == len(names)


# ---- a failed step in one line -------------------------------------------------------------------------

def _keras_error() -> Exception:
    return ValueError("in user code:\n\n    File \"x.py\", line 3, in call\n        return f(x)\n\n"
                      "    \x1b[1mValueError: 'norm_wind speed' is not a valid scope name\x1b[0m\n")


@pytest.mark.parametrize("error, expected", [
    (_keras_error(), "ValueError: 'norm_wind speed' is not a valid scope name"),
    (RuntimeError("one line"), "RuntimeError: one line"),
    (RuntimeError("first\nsecond"), "RuntimeError: first"),
    (RuntimeError(""), "RuntimeError"),
])
def test_a_failed_step_says_its_error_in_one_plain_line(error, expected):
    from tfpipe.run import error_line

    assert error_line(error) == expected


def test_a_user_error_keeps_its_own_first_line():
    from tfpipe.errors import UserError
    from tfpipe.run import error_line

    assert error_line(UserError("label column 'y' not found:\n  columns: a, b")) == "label column 'y' not found:"
