"""llama.cpp's Unicode classes, as `regex` set expressions, for every code point.

llama.cpp classifies a code point by its own table, generated from Unicode 15.1: a letter
(\\p{L}), number (\\p{N}), mark (\\p{M}), punctuation (\\p{P}), ... or, for a code point that
Unicode 15.1 leaves unassigned, *undefined*: none of those classes, so it is "other" in every
``[^\\s\\p{L}\\p{N}]``. The `regex` module follows a newer Unicode, where some of those code
points are letters, marks, ... . The classes here are the `regex` module's, minus the code points
assigned after Unicode 15.1; tests/test_tokenizer_fuzz.py checks every code point of every class
against llama.cpp's table.

``expand(pattern)`` rewrites the placeholders {S} (llama.cpp's whitespace, its ``\\s``), {L},
{N}, {M}, {P} into these sets; they work inside a character class as nested sets.
"""
from __future__ import annotations

__all__ = ["CLASSES", "expand"]

#: code points assigned after Unicode 15.1 (undefined for llama.cpp)
_AFTER_15_1 = (
    r"\u088f\u0897\u0c5c\u0cdc\u1acf-\u1add\u1ae0-\u1aeb\u1b4e-\u1b4f\u1b7f\u1c89-\u1c8a"
    r"\u20c1\u2427-\u2429\u2b96\u31e4-\u31e5\ua7cb-\ua7cf\ua7d2\ua7d4\ua7da-\ua7dc\ua7f1"
    r"\ufbc3-\ufbd2\ufd90-\ufd91\ufdc8-\ufdce\U000105c0-\U000105f3\U00010940-\U00010959"
    r"\U00010d40-\U00010d65\U00010d69-\U00010d85\U00010d8e-\U00010d8f\U00010ec2-\U00010ec7"
    r"\U00010ed0-\U00010ed8\U00010efa-\U00010efc\U00011380-\U00011389\U0001138b\U0001138e"
    r"\U00011390-\U000113b5\U000113b7-\U000113c0\U000113c2\U000113c5\U000113c7-\U000113ca"
    r"\U000113cc-\U000113d5\U000113d7-\U000113d8\U000113e1-\U000113e2\U000116d0-\U000116e3"
    r"\U00011b60-\U00011b67\U00011bc0-\U00011be1\U00011bf0-\U00011bf9\U00011db0-\U00011ddb"
    r"\U00011de0-\U00011de9\U00011f5a\U00013460-\U000143fa\U00016100-\U00016139"
    r"\U00016d40-\U00016d79\U00016ea0-\U00016eb8\U00016ebb-\U00016ed3\U00016ff2-\U00016ff6"
    r"\U000187f8-\U000187ff\U00018cff\U00018d09-\U00018d1e\U00018d80-\U00018df2"
    r"\U0001cc00-\U0001ccfc\U0001cd00-\U0001ceb3\U0001ceba-\U0001ced0\U0001cee0-\U0001cef0"
    r"\U0001e5d0-\U0001e5fa\U0001e5ff\U0001e6c0-\U0001e6de\U0001e6e0-\U0001e6f5"
    r"\U0001e6fe-\U0001e6ff\U0001f6d8\U0001f777-\U0001f77a\U0001f8b2-\U0001f8bb"
    r"\U0001f8c0-\U0001f8c1\U0001f8d0-\U0001f8d8\U0001fa54-\U0001fa57\U0001fa89-\U0001fa8a"
    r"\U0001fa8e-\U0001fa8f\U0001fabe\U0001fac6\U0001fac8\U0001facd\U0001fadc\U0001fadf"
    r"\U0001fae9-\U0001faea\U0001faef\U0001fbcb-\U0001fbef\U0001fbfa\U0002b73a-\U0002b73f"
    r"\U0002cea2-\U0002cead\U000323b0-\U00033479"
)

#: placeholder -> regex set (V1 syntax)
CLASSES: dict[str, str] = {
    "{S}": r"\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000",
    "{L}": r"[\p{L}--[" + _AFTER_15_1 + "]]",
    "{N}": r"[\p{N}--[" + _AFTER_15_1 + "]]",
    "{M}": r"[\p{M}--[" + _AFTER_15_1 + "]]",
    "{P}": r"[\p{P}--[" + _AFTER_15_1 + "]]",
}


def expand(pattern: str) -> str:
    """The pattern with every class placeholder replaced by its set."""
    for key, value in CLASSES.items():
        pattern = pattern.replace(key, value)
    return pattern
