"""Anonymous memory for big buffers (an arena, a session's private copy of its file), and when to ask
for transparent huge pages.

Faulting huge pages in is usually cheaper than 4 KB pages (24 MB: ~2.5 ms against ~10 ms), but on a
virtual machine a huge page is a free 2 MB block that the guest may have handed back to the hypervisor
(free page reporting works on such blocks), and its first touch then faults on the host too: 113 MB took
250-290 ms instead of 7 ms now and then (no compaction: compact_stall stayed 0).  Whisper-tiny's 113 MB
arena made its first run 2.2-2.5x a steady one that way (D85), and reading ResNet-18's 93 MB artifact
into an advised copy took 330-530 ms instead of 42 in one process of three, Whisper-tiny's 61 MB 65-308 ms
against a steady 72-84 without the advice (D134), while wav2vec2's 13 MB and PP-OCR det's 25 MB arenas
were 8-16 ms faster to fault in with it.  So: buffers of 32 MB and more go without it.  numpy advises its
own buffers from 4 MB on.
"""
from __future__ import annotations

import mmap

PLAIN_PAGES_FROM_BYTES = 32 << 20


def anonymous(nbytes: int) -> mmap.mmap:
    """A private anonymous mapping of ``nbytes`` (zero-filled, page-aligned), advised to use transparent
    huge pages below ``PLAIN_PAGES_FROM_BYTES`` where the system has them (a kernel whose policy is
    ``always`` backs a big one with huge pages anyway, without the stall)."""
    flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    buf = mmap.mmap(-1, nbytes, flags=flags) if flags else mmap.mmap(-1, nbytes)
    if nbytes < PLAIN_PAGES_FROM_BYTES and hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            buf.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # (a kernel without transparent huge pages)
            pass
    return buf
