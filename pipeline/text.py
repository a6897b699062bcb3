"""Words of a free-text column, split as Keras's TextVectorization splits them by default
("lower_and_strip_punctuation", then whitespace), so that the vocabulary the data stage counts
is the one the model's layer looks up (a test holds the two to the same words)."""

from __future__ import annotations

import re

# TextVectorization's punctuation class, verbatim (tf.strings.regex_replace, RE2; `,-\.` is a range).
PUNCTUATION = re.compile(r'[!"#$%&()\*\+,-\./:;<=>?@\[\\\]^_`{|}~\']')
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")  # tf.strings.lower
_WHITESPACE = re.compile(r"[ \t\n\r\f\v]+")


def words(text: str) -> list[str]:
    """The words TextVectorization's default standardisation and split give for `text`."""
    return [w for w in _WHITESPACE.split(PUNCTUATION.sub("", text.translate(_ASCII_LOWER))) if w]
