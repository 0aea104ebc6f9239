#!/usr/bin/python
"""preflight_tcp: one TCP connection to a host's ssh port, from the controller. A refused connection
answers at once (no retries until a timeout, as wait_for_connection does); never fails itself."""

from __future__ import annotations

import socket
import time

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: preflight_tcp
short_description: whether a TCP port answers, and if not why (refused, timed out, no route)
options:
  host: {type: str, required: true, description: Address to connect to.}
  port: {type: int, default: 22, description: TCP port.}
  timeout: {type: float, default: 20, description: Seconds to wait for an answer.}
"""


def main() -> None:
    module = AnsibleModule(argument_spec={"host": {"type": "str", "required": True},
                                          "port": {"type": "int", "default": 22},
                                          "timeout": {"type": "float", "default": 20}},
                           supports_check_mode=True)
    start = time.monotonic()
    try:
        socket.create_connection((module.params["host"], module.params["port"]), module.params["timeout"]).close()
        error = ""
    except OSError as err:
        error = str(err) if not isinstance(err, TimeoutError) else f"no answer in {module.params['timeout']:g} s"
    module.exit_json(changed=False, answers=not error, error=error, seconds=round(time.monotonic() - start, 2))


if __name__ == "__main__":
    main()
