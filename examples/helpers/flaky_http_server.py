#!/usr/bin/env python3
"""A local HTTP server that fails on purpose, for trying examples/download.toml.

    python3 flaky_http_server.py [--responses 503,reset,200] [--body TEXT]

It listens on 127.0.0.1 on a free port and prints the port on its first line of stdout. Each
request gets the next answer of --responses, the last one repeating: an HTTP status (`200`
sends --body, anything else an error page), `reset` (the connection is reset after the request
is read: curl exits 56) or `close` (closed without a reply: curl exits 52). Stops on SIGTERM or
Ctrl-C.
"""

import argparse
import http.server
import signal
import socket
import struct
import sys
import threading


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--responses", default="503,reset,200")
    parser.add_argument("--body", default="hello from the flaky server\n")
    args = parser.parse_args()
    script = args.responses.split(",")
    served = [0]
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            with lock:
                answer = script[min(served[0], len(script) - 1)]
                served[0] += 1
            if answer == "reset":
                # SO_LINGER with a zero timeout: close() sends RST instead of FIN.
                # The socket is closed here, before the server's own shutdown would send a FIN.
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.rfile.close()
                self.connection.close()
                self.close_connection = True
                return
            if answer == "close":
                self.close_connection = True
                return
            status = int(answer)
            body = (args.body if status == 200 else f"error {status}\n").encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format, *args):
            sys.stderr.write("flaky_http_server: %s\n" % (format % args))

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(server.server_address[1], flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
