"""A server on a real socket that records what it is sent and answers with scripted bytes.

For the Slurm client's wire tests: a slurmrestd, or what stands in front of one, answering
in ways no well-behaved server would (bytes out of step, a body cut short, no answer).
"""

import asyncio
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field


def whole(body: bytes, status: str = "200 OK", content_type: str = "application/json") -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


@dataclass
class Request:
    line: str
    headers: list[tuple[str, str]]
    body: bytes


# Given the request number (from 1), the bytes to answer with; None: answer nothing, hold on.
Script = Callable[[int], bytes | None]


@dataclass
class ScriptedServer:
    script: Script
    close_after_answer: bool = False
    requests: list[Request] = field(default_factory=list)
    connections: int = 0
    _server: asyncio.Server | None = None

    async def start(self, tls: ssl.SSLContext | None = None) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=tls)
        host, port = self._server.sockets[0].getsockname()[:2]
        return f"{'https' if tls else 'http'}://{host}:{port}"

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                line, *fields = head.decode("latin-1").rstrip("\r\n").split("\r\n")
                headers = [
                    (name.strip().lower(), value.strip()) for name, value in (f.split(":", 1) for f in fields)
                ]
                length = int(dict(headers).get("content-length", "0"))
                self.requests.append(Request(line, headers, await reader.readexactly(length)))
                answer = self.script(len(self.requests))
                if answer is None:
                    await asyncio.Event().wait()  # never answers; the client gives up
                    return
                writer.write(answer)
                await writer.drain()
                if self.close_after_answer:
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
