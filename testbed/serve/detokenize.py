"""Incremental detokenization: token ids in, text out as soon as it is final.

Text is held back while it ends in an incomplete UTF-8 character (a byte-level token may
carry part of one: the decode then ends in U+FFFD) or in what may be the start of a stop
string; a stop string found ends the text just before it."""
from __future__ import annotations

REPLACEMENT = "\ufffd"


class IncrementalText:
    """Decodes a growing list of ids, window by window (each token's text depends on the
    tokens before it: sentencepiece spaces, multi-token characters)."""

    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        self.tok = tokenizer
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self.prefix = 0  # start of the window decoded for context
        self.read = 0  # ids up to here have been turned into text

    def _decode(self, ids) -> str:
        return self.tok.decode(ids, skip_special_tokens=self.skip)

    def add(self, new_ids) -> str:
        """The text the new ids complete ("" while it is not final)."""
        self.ids.extend(new_ids)
        before = self._decode(self.ids[self.prefix:self.read])
        text = self._decode(self.ids[self.prefix:])
        if len(text) > len(before) and not text.endswith(REPLACEMENT):
            self.prefix, self.read = self.read, len(self.ids)
            return text[len(before):]
        return ""

    def flush(self) -> str:
        """At the end: whatever is left, an incomplete character included."""
        before = self._decode(self.ids[self.prefix:self.read])
        text = self._decode(self.ids[self.prefix:])
        self.prefix = self.read = len(self.ids)
        return text[len(before):]


class StopStrings:
    """Cuts the text at the first stop string, holding back a tail that may begin one."""

    def __init__(self, stops):
        self.stops = [s for s in stops if s]
        self.longest = max((len(s) for s in self.stops), default=0)
        self.text = ""  # all the text so far
        self.sent = 0  # chars of it let through

    def add(self, delta: str) -> tuple[str, bool]:
        """(text to let through, whether a stop string was found)."""
        self.text += delta
        if not self.stops:
            out, self.sent = self.text[self.sent:], len(self.text)
            return out, False
        # a stop string starts after what was let through: a tail that could begin one is held
        hits = [i for i in (self.text.find(s, self.sent) for s in self.stops) if i >= 0]
        if hits:
            end = min(hits)
            out, self.sent = self.text[self.sent:end], end
            return out, True
        end = len(self.text) - self._held()
        out, self.sent = self.text[self.sent:end], max(end, self.sent)
        return out, False

    def _held(self) -> int:
        """The longest tail of the text that is the start of a stop string."""
        for k in range(min(self.longest - 1, len(self.text) - self.sent), 0, -1):
            tail = self.text[-k:]
            if any(s.startswith(tail) for s in self.stops):
                return k
        return 0

    def flush(self) -> str:
        out, self.sent = self.text[self.sent:], len(self.text)
        return out
