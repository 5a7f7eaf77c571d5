"""Crash points that tests can arm: ``SETTLED_FAULTPOINT=after_claim settled dispatch …``
makes that process SIGKILL itself exactly there. Unarmed, a point costs one
comparison. Names: ``before_claim``, ``before_commit:claimed``, ``after_claim``,
``after_send`` (request written, reply not read), ``after_reply``,
``before_commit:<event kind>`` (e.g. ``before_commit:outcome``), ``before_check``.
"""

from __future__ import annotations

import os
import signal

ARMED = os.environ.get("SETTLED_FAULTPOINT") or None


def point(name: str) -> None:
    if ARMED is not None and ARMED == name:
        os.kill(os.getpid(), signal.SIGKILL)
