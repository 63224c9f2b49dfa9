"""Another engine process for test_node_tier.py, on the same kvstrand-server.

  peer.py SOCKET save SEED         stores PROMPT's two chunks from a pattern
  peer.py SOCKET adopt HANDOFF_HEX adopts an exported lease and loads it
Each prints one line: "saved" or the SHA-256 of the loaded blocks.
"""

import hashlib
import sys

import kvstrand
from conftest import BLOCK_BYTES, Engine, pattern

PROMPT = list(range(7000, 7128))


def main():
    socket, mode, arg = sys.argv[1:4]
    e = Engine(server_socket=socket, server_request_timeout=5.0)
    if mode == "save":
        e.blocks[0:8] = pattern(8 * BLOCK_BYTES, int(arg)).reshape(8, BLOCK_BYTES)
        e.conn.save(e.spec("peer", PROMPT, 0, 128))
        outcome = e.wait(saves=1)["saves"][0]
        if not outcome.ok:
            sys.exit(f"save failed: {outcome.reason}")
        print("saved", flush=True)
    elif mode == "adopt":
        lookup = e.conn.adopt_lease(bytes.fromhex(arg))
        answer = e.wait(lookups=1)["lookups"][0]
        assert answer.id == lookup
        if answer.hit.tokens != 128 or answer.lease == 0:
            sys.exit(f"adopted a miss: {answer.hit.tokens} tokens, lease {answer.lease}")
        e.conn.load(e.spec("peer", PROMPT, 16, 128, tier_lease=answer.lease))
        outcome = e.wait(loads=1)["loads"][0]
        if not outcome.ok:
            sys.exit(f"load failed: {outcome.reason}")
        print(hashlib.sha256(e.blocks[16:24].tobytes()).hexdigest(), flush=True)
    e.close()


if __name__ == "__main__":
    main()
