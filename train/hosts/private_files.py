"""Files the controller writes on a host for the run's user alone (a keeper's spec holds the run's token).

SFTP creates a file with the SFTP server's umask (0644 on most hosts), and a chmod after the put leaves a
moment in which anyone on the host may read it. The file is made, empty and 0600, first; SFTP then writes
into it, and an existing file keeps its mode.
"""

from __future__ import annotations

import io
import shlex


def put_private(conn, data: bytes, path: str) -> None:
    """`data` into `path` on the connection's host, 0600 before its first byte lands."""
    q = shlex.quote(path)
    conn.run(f"umask 077 && touch {q} && chmod 600 {q}", hide=True, in_stream=False)
    conn.put(io.BytesIO(data), path)
