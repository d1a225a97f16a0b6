"""Helpers shared by the ``minirt`` command-line tools (not part of the runtime API).

- :mod:`minirt.tools.inputs`: build an input feed for a session (``--input``,
  ``--dim``, random inputs matching the signature).
- :mod:`minirt.tools.timing`: latency sampling, summaries, peak memory.
"""
